"""The first rung, ``"reference"``: the plain-PyTorch model, one eager launch per op.

Every other rung computes the same function; the notebooks climb from this one.
"""

from __future__ import annotations

import torch

from dataclasses import replace
from typing import Any

from .protocol import Decoder, taken
from ..ops.delta_rule import delta_rule_chunked_ref, delta_rule_ref
from ..ops.mixers import REFERENCE_CORES, MixerCores

CHUNK = 64  # delta_rule_chunked_ref's chunk (its default), where its walk can hand out the state


def checkpointing_delta_rule(checkpoint_every: int, checkpoints: list[torch.Tensor]):
    """:func:`labkit.ops.delta_rule.delta_rule_ref` that also appends to ``checkpoints`` the states
    after every ``checkpoint_every`` tokens of each call, [B, T // checkpoint_every, Hv, K, V]
    float32, from the chunked reference's own walk (the chunk kernel's contract, see
    :func:`labkit.decode.fused_prefill.chunked_delta_rule`)."""

    def delta_rule(q, k, v, g, beta, state=None):
        B, T = q.shape[:2]
        if T == 1:  # one token steps the recurrence, as delta_rule_ref does: no boundary inside it
            checkpoints.append(q.new_empty(B, 0, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32))
            return delta_rule_ref(q, k, v, g, beta, state)
        buf = torch.empty(B, T // checkpoint_every, v.shape[2], q.shape[3], v.shape[3], dtype=torch.float32,
                          device=q.device)
        checkpoints.append(buf)
        return delta_rule_chunked_ref(q, k, v, g, beta, state, CHUNK, checkpoints=buf, checkpoint_every=checkpoint_every)

    return delta_rule


class ReferenceDecoder(Decoder):
    """The plain-PyTorch model, one eager launch per op."""

    checkpoint_multiple = CHUNK  # the chunked reference hands out its state at chunk ends

    def prefill_cores(self, checkpoint_every: int | None = None,
                      checkpoints: list[torch.Tensor] | None = None) -> MixerCores:
        """The mixer cores its prefill runs (the references); with ``checkpoint_every`` (a multiple of
        :attr:`checkpoint_multiple`), the delta rule also appends its state checkpoints to
        ``checkpoints`` (:func:`checkpointing_delta_rule`): what PrefixCache snapshots."""
        if checkpoint_every is None:
            return REFERENCE_CORES
        if checkpoint_every % CHUNK or checkpoints is None:
            raise ValueError(f"the reference delta rule takes state checkpoints at multiples of {CHUNK} tokens into a "
                             f"list, got checkpoint_every={checkpoint_every}, checkpoints={type(checkpoints).__name__}")
        return replace(REFERENCE_CORES, delta_rule=checkpointing_delta_rule(checkpoint_every, checkpoints))

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.prefill_checked(input_ids)

    @torch.no_grad()
    def prefill_checked(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                        weights: Any = None) -> torch.Tensor:
        """:meth:`prefill`; with ``ids_checked`` (``generate`` read them on the host) the ids' range is
        not read back again (a sync). ``weights``: a caller's check is run first (it keys nothing here)."""
        taken(weights)
        self.model._check_input(input_ids, self.cache, check_ids=not ids_checked)
        return self.model.forward_checked(input_ids, self.cache, last_only=True, cores=self.prefill_cores())[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], cache=self.cache)[:, -1]
