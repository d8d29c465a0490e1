"""The implementation ladder: named ways of running one model's prefill and decode steps.

Every backend computes the same function as ``"reference"`` (the plain-torch model); the
notebooks climb from it one optimisation at a time. A backend is a factory
``(model, cache) -> Decoder``; a Decoder turns a prompt into last-token logits (``prefill``) and
one token per sequence into the next logits (``step``), advancing the cache.

``generate`` without a cache asks :func:`pooled_decoder`, which keeps the decoders of backends
registered with ``pooled=True`` (and their caches) on the model for later calls.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Protocol

import torch

from ..cache import HybridCache
from ..model import HybridLM
from ..ops.mixers import REFERENCE_CORES, MixerCores


class Decoder(Protocol):
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, vocab]
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:  # [B] -> [B, vocab]
        ...


class ReferenceDecoder:
    """The plain-PyTorch model, one eager launch per op."""

    def __init__(self, model: HybridLM, cache: HybridCache) -> None:
        self.model, self.cache = model, cache

    checkpoint_multiple = None  # its delta rule takes no state checkpoints (PrefixCache cuts it at boundaries)

    def prefill_cores(self) -> MixerCores:
        """The mixer cores its prefill runs (the references); PrefixCache wraps them to read states."""
        return REFERENCE_CORES

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, cache=self.cache, last_only=True, cores=self.prefill_cores())[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens[:, None], cache=self.cache)[:, -1]


BACKENDS: dict[str, Callable[[HybridLM, HybridCache], Decoder]] = {"reference": ReferenceDecoder}
POOLED: set[str] = set()  # backends whose (decoder, cache) generate keeps on the model for reuse
POOL_SIZE = 4  # pooled (backend, batch, cache length) entries per model, least recently used dropped
_POOL = "labkit.decoder_pool"  # key in model.attachments


def register(name: str, factory: Callable[[HybridLM, HybridCache], Decoder], *, pooled: bool = False) -> None:
    """Add a backend. ``pooled``: its decoders are worth keeping between ``generate`` calls (they
    compile, capture graphs or allocate workspaces when made) and reuse a cache that is reset."""
    BACKENDS[name] = factory
    (POOLED.add if pooled else POOLED.discard)(name)


def _factory(backend: str) -> Callable[[HybridLM, HybridCache], Decoder]:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return BACKENDS[backend]


def make_decoder(backend: str, model: HybridLM, cache: HybridCache) -> Decoder:
    return _factory(backend)(model, cache)


def pooled_cache_len(min_len: int) -> int:
    """The cache length a pooled decoder gets for ``min_len`` tokens: the next power of two, at least 256.

    Rounding up lets prompts of different lengths share one decoder, and its captured graphs. It
    costs no decode time: attention reads only each sequence's cached positions, and its kernel
    (labkit.ops.attention_decode.attention_chunk) picks chunk = max(256, next_pow2(max_len / 64))
    positions per program, which is the same for max_len and for its power-of-two bucket; the
    bucket only adds up to as many chunk programs again, beyond every sequence's length, that
    return after one load. The cost is memory: up to twice the KV cache of an exact fit.
    """
    return max(256, 1 << (max(min_len, 1) - 1).bit_length())


def pooled_decoder(backend: str, model: HybridLM, batch: int, min_len: int, *,
                   zero: bool = True) -> tuple[Decoder, HybridCache]:
    """A decoder and an empty cache of at least ``min_len`` tokens, as ``generate`` uses when given no cache.

    For a pooled backend both are kept on the model (``model.attachments``, up to POOL_SIZE entries)
    and reused by later calls with the same batch and cache bucket: the cache is reset in place, so
    a decoder's captured graphs replay as they are (they are recaptured if the model's weights
    changed). Entries made before the model moved to another device or dtype are dropped. Other
    backends get a fresh cache of exactly ``min_len``. ``release_pooled(model)`` frees them all.
    ``zero=False`` resets a reused cache's lengths only (``HybridCache.reset(zero=False)``), for a
    caller that resets it again before use, as :meth:`labkit.PrefixCache.prefill` does.
    """
    factory = _factory(backend)
    if backend not in POOLED:
        cache = model.new_cache(batch, min_len)
        return factory(model, cache), cache
    pool: OrderedDict = model.attachments.setdefault(_POOL, OrderedDict())
    place = (model.device, model.dtype)
    for stale in [k for k in pool if k[-1] != place]:
        del pool[stale]
    key = (backend, batch, pooled_cache_len(min_len), place)
    cache = pool.pop(key, None)
    if cache is None:
        cache = model.new_cache(batch, key[2])
    else:
        cache.reset(zero=zero)
    decoder = factory(model, cache)
    pool[key] = cache  # most recently used last
    while len(pool) > POOL_SIZE:
        pool.popitem(last=False)
    return decoder, cache


def release_pooled(model: HybridLM) -> None:
    """Free the caches, decoders and graphs that ``generate`` keeps for ``model``."""
    model.attachments.pop(_POOL, None)
