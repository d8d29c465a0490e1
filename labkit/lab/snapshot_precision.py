"""What a lower-precision snapshot of a Gated DeltaNet state costs: bytes saved against the error it causes.

The recurrent state is float32 in the cache (:mod:`labkit.cache`). A prefix cache could keep its
snapshots in bfloat16 to halve their bytes; restoring one then starts decoding from the state
rounded to bf16 (8 mantissa bits: a relative error up to 2^-9 per element). This module measures
what that does downstream, on one model and prompt:

- two decoders prefill the same prompt; in one, every recurrent state is rounded to ``dtype`` and
  back (exactly what restoring a ``dtype`` snapshot would give);
- teacher-forced: both decode the exact run's greedy tokens for ``steps`` steps, and the logits of
  the rounded run are compared with the exact ones at every step (relative error, argmax agreement);
- free-running: the rounded run decodes greedily on its own, and the first step where its tokens
  leave the exact run's is recorded (None: they never do within ``steps``).

A state decays (its gates are < 1) and is overwritten by new tokens, so the error is expected to
fade with steps rather than grow; the measurement says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decode.registry import make_decoder
from ..model import HybridLM


@dataclass
class SnapshotPrecision:
    dtype: str
    state_bytes_float32: int  # all GDN states of one sequence
    state_bytes_rounded: int
    steps: int
    rel_err: list[float]  # per teacher-forced decode step: ||logits' - logits|| / ||logits||
    argmax_agree: float  # fraction of teacher-forced steps whose argmax is the exact run's
    first_divergence: int | None  # free-running: first step whose token differs, None if none

    @property
    def bytes_saved(self) -> int:
        return self.state_bytes_float32 - self.state_bytes_rounded


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


@torch.no_grad()
def snapshot_precision(model: HybridLM, prompt: torch.Tensor, steps: int, dtype: torch.dtype = torch.bfloat16,
                       backend: str = "reference") -> SnapshotPrecision:
    """Prefill ``prompt`` ([T] or [1, T]), round every GDN state to ``dtype`` in one of two runs, decode
    ``steps`` tokens in both (module docstring). Needs a model with Gated DeltaNet layers."""
    if prompt.dim() == 1:
        prompt = prompt[None]
    if prompt.shape[0] != 1:
        raise ValueError(f"one prompt ([T] or [1, T]) is measured, got shape {tuple(prompt.shape)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    prompt = prompt.to(model.device)
    runs = [make_decoder(backend, model, model.new_cache(1, prompt.shape[1] + steps + 1)) for _ in range(3)]
    if not runs[0].cache.recurrent_states:
        raise ValueError(f"{model.cfg.name} has no Gated DeltaNet layer: no recurrent state to round")
    first = [d.prefill(prompt).clone() for d in runs]
    full = sum(s.numel() * s.element_size() for s in runs[0].cache.recurrent_states.values())
    rounded = sum(s.numel() * torch.empty((), dtype=dtype).element_size() for s in runs[0].cache.recurrent_states.values())
    for d in runs[1:]:
        for s in d.cache.recurrent_states.values():
            s.copy_(s.to(dtype).float())
    exact, forced, free = runs
    # the prefills ran before the rounding: their logits agree; the steps after them are compared
    token = first[0].argmax(-1)
    free_token, divergence, errs, agree = token, None, [], []
    for step in range(steps):
        want = exact.step(token).clone()
        got = forced.step(token)
        errs.append(_rel(got, want))
        agree.append(bool(torch.equal(got.argmax(-1), want.argmax(-1))))
        if divergence is None:
            free_token = free.step(free_token).argmax(-1)
        token = want.argmax(-1)
        if divergence is None and not torch.equal(token, free_token):
            divergence = step
    return SnapshotPrecision(str(dtype).removeprefix("torch."), full, rounded, steps, errs,
                             sum(agree) / len(agree), divergence)
