"""Next-token choice from logits: greedy, or seeded temperature / top-k / top-p sampling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import is_int, is_real


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not (is_real(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and not (is_int(self.top_k) and self.top_k >= 1):
            raise ValueError(f"top_k must be None or an int >= 1 (the tokens kept), got {self.top_k!r}")
        if self.top_p is not None and not (is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be None or a number in (0, 1] (the nucleus' mass), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits: [B, V] -> token ids [B] (int64)."""
    if params.greedy:
        return logits.argmax(-1)
    # Shifted so the largest score is 0 before dividing: a tiny temperature then sends the others
    # to -inf instead of overflowing every score to inf (and the softmax to NaN).
    scores = logits.float()
    scores = (scores - scores.amax(-1, keepdim=True)) / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = scores.topk(params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it
        # already does. The most likely token always stays.
        drop_sorted = probs.cumsum(-1) - probs >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
