"""The first rung, ``"reference"``: the plain-PyTorch model, one eager launch per op.

Every other rung computes the same function; the notebooks climb from this one.
"""

from __future__ import annotations

import torch

from .protocol import Decoder
from ..ops.mixers import REFERENCE_CORES, MixerCores


class ReferenceDecoder(Decoder):
    """The plain-PyTorch model, one eager launch per op."""

    checkpoint_multiple = None  # its delta rule takes no state checkpoints (PrefixCache cuts it at boundaries)

    def prefill_cores(self, checkpoint_every: int | None = None,
                      checkpoints: list[torch.Tensor] | None = None) -> MixerCores:
        """The mixer cores its prefill runs (the references); PrefixCache wraps them to read states."""
        if checkpoint_every is not None:
            raise ValueError("the reference delta rule takes no state checkpoints (checkpoint_multiple is None): "
                             "call prefill_cores() without checkpoint_every")
        return REFERENCE_CORES

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, cache=self.cache, last_only=True, cores=self.prefill_cores())[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], cache=self.cache)[:, -1]
