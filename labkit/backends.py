"""The implementation ladder: named ways of running one model's prefill and decode steps.

Every backend computes the same function as ``"reference"`` (the plain-torch model); the
notebooks climb from it one optimisation at a time. A backend is a factory
``(model, cache) -> Decoder``; a Decoder turns a prompt into last-token logits (``prefill``) and
one token per sequence into the next logits (``step``), advancing the cache.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from .cache import HybridCache
from .model import HybridLM


class Decoder(Protocol):
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, vocab]
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:  # [B] -> [B, vocab]
        ...


class ReferenceDecoder:
    """The plain-PyTorch model, one eager launch per op."""

    def __init__(self, model: HybridLM, cache: HybridCache) -> None:
        self.model, self.cache = model, cache

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, cache=self.cache, last_only=True)[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], cache=self.cache)[:, -1]


BACKENDS: dict[str, Callable[[HybridLM, HybridCache], Decoder]] = {"reference": ReferenceDecoder}


def register(name: str, factory: Callable[[HybridLM, HybridCache], Decoder]) -> None:
    BACKENDS[name] = factory


def make_decoder(backend: str, model: HybridLM, cache: HybridCache) -> Decoder:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return BACKENDS[backend](model, cache)
