"""The ladder's names: every rung known up front, made on demand, and the decoder pool of ``generate``.

Every rung computes the same function as ``"reference"`` (the plain-torch model); the notebooks
climb from it one optimisation at a time. A rung is a factory ``(model, cache) -> Decoder``
(:class:`labkit.decode.protocol.Decoder`). The built-in rungs are a table of (module, factory,
options, pooled), so ``BACKENDS`` names all of them without importing any: a rung's module is
imported the first time one of its decoders is made. :func:`register` adds a user's rung.

Each built-in rung declares what it does on a GPU without Hopper's features (PDL, TMA, the bulk
prefetch: sm_90 and newer, :mod:`labkit.ops.features`), as an :class:`OlderGpus`: the features it
cannot be made without (it raises MissingFeature when made, naming the rung to use instead) and
those it uses where present and goes without elsewhere. ``ON_OLDER_GPUS`` holds the declarations;
tests/test_other_gpus.py makes every rung on a stand-in A100 and checks each against what it does.

``generate`` without a cache asks :func:`leased_decoder`, which keeps the decoders of rungs
registered with ``pooled=True`` (and their caches) on the model for later calls, and lends each
to one caller at a time.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from .protocol import Decoder, checked_decoder
from ..cache import HybridCache
from ..model import HybridLM
from ..ops.features import FEATURES, features


@dataclass(frozen=True)
class OlderGpus:
    """What a rung does on a GPU without some of :data:`labkit.ops.features.FEATURES`: ``needs``,
    the features it refuses to be made without (MissingFeature, naming the rung ``instead``);
    ``optional``, those it uses where the GPU has them and goes without elsewhere (the same
    function, another path). Neither: it uses none, and runs on any CUDA GPU as on a Hopper."""

    needs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    instead: str | None = None

    def __post_init__(self) -> None:
        unknown = (set(self.needs) | set(self.optional)) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        if bool(self.needs) != (self.instead is not None):
            raise ValueError("a rung that needs a feature names the rung to use instead (and only such a rung)")


ANY_GPU = OlderGpus()  # uses no sm_90 feature


@dataclass(frozen=True)
class Rung:
    """A built-in rung: ``module.factory(model, cache, **options)``, the module imported when first
    made; ``older_gpus``: what it does on a GPU without Hopper's features."""

    module: str
    factory: str
    older_gpus: OlderGpus
    options: tuple[tuple[str, object], ...] = ()

    def __call__(self, model: HybridLM, cache: HybridCache) -> Decoder:
        return getattr(importlib.import_module(self.module), self.factory)(model, cache, **dict(self.options))


_FUSED = "labkit.decode.fused"
# name: (rung, pooled: its decoders are worth keeping between generate calls)
_LADDER: dict[str, tuple[Rung, bool]] = {
    "reference": (Rung("labkit.decode.reference", "ReferenceDecoder", ANY_GPU), False),
    "reference+graph": (Rung("labkit.decode.reference_graph", "ReferenceGraphDecoder", ANY_GPU), False),
    "fused": (Rung(_FUSED, "fused_decoder", ANY_GPU), True),
    "fused+graph": (Rung(_FUSED, "fused_decoder", ANY_GPU, (("graph", True),)), True),
    "fused+graph+pdl": (Rung(_FUSED, "fused_decoder", OlderGpus(needs=("pdl",), instead="fused+graph"),
                             (("graph", True), ("pdl", True))), True),
    # without the bulk prefetch: prefetch_tiles 0 (labkit.decode.persistent's docstring)
    "persistent": (Rung("labkit.decode.persistent", "persistent_decoder", OlderGpus(optional=("bulk_prefetch",))),
                   True),
}

BACKENDS: dict[str, Callable[[HybridLM, HybridCache], Decoder]] = {name: r for name, (r, _) in _LADDER.items()}
POOLED: set[str] = {name for name, (_, pooled) in _LADDER.items() if pooled}  # kept on the model for reuse
ON_OLDER_GPUS: dict[str, OlderGpus] = {name: r.older_gpus for name, (r, _) in _LADDER.items()}
POOL_SIZE = 4  # free pooled (backend, batch, cache length) entries per model, least recently used dropped
_POOL = "labkit.decoder_pool"  # key in model.attachments: the free entries
_POOL_LOCK = threading.Lock()  # guards every model's pool (taking and giving back are a few dict operations)


def register(name: str, factory: Callable[[HybridLM, HybridCache], Decoder], *, pooled: bool = False,
             older_gpus: OlderGpus | None = None) -> None:
    """Add a rung. ``factory(model, cache)`` returns a :class:`~labkit.decode.protocol.Decoder`.
    ``pooled``: its decoders are worth keeping between ``generate`` calls (they compile, capture
    graphs or allocate workspaces when made) and reuse a cache that is reset. ``older_gpus``: what
    it does on a GPU without Hopper's features (None: undeclared)."""
    BACKENDS[name] = factory
    (POOLED.add if pooled else POOLED.discard)(name)
    if older_gpus is None:
        ON_OLDER_GPUS.pop(name, None)
    else:
        ON_OLDER_GPUS[name] = older_gpus


def backends_for(device) -> list[str]:
    """The rungs that can be made for a model on ``device``, as far as its features go
    (:func:`labkit.ops.features.features`): every rung but those that need a feature it lacks
    (an undeclared rung counts as needing nothing)."""
    have = features(device)
    return [name for name in BACKENDS
            if all(have.has(f) for f in ON_OLDER_GPUS.get(name, ANY_GPU).needs)]


def _factory(backend: str) -> Callable[[HybridLM, HybridCache], Decoder]:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    return BACKENDS[backend]


def make_decoder(backend: str, model: HybridLM, cache: HybridCache) -> Decoder:
    """A decoder of rung ``backend`` for ``model`` over ``cache`` (a TypeError if it breaks the contract)."""
    return checked_decoder(_factory(backend)(model, cache), backend)


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


_SERIAL = iter(range(1 << 62))  # tells apart two entries of one shape (next() on it is atomic under the GIL)


def _take(model: HybridLM, key: tuple) -> tuple[tuple, HybridCache] | None:
    """A free pooled entry ``((key, serial), cache)`` for ``key``, now out of the pool (so no other
    caller gets it), or None. The pool maps (key, serial) to the cache; its decoder lives in the
    cache's attachments."""
    with _POOL_LOCK:
        pool: OrderedDict = model.attachments.setdefault(_POOL, OrderedDict())
        for stale in [k for k in pool if k[0][-1] != key[-1]]:
            del pool[stale]  # made before the model moved to another device or dtype
        for k in reversed(pool):  # the most recently used first
            if k[0] == key:
                return k, pool.pop(k)
    return None


def _give_back(model: HybridLM, entry: tuple, cache: HybridCache) -> None:
    with _POOL_LOCK:
        if entry[0][-1] != (model.device, model.dtype):
            return  # the model moved while the entry was out
        pool: OrderedDict = model.attachments.setdefault(_POOL, OrderedDict())
        pool[entry] = cache  # most recently used last
        while len(pool) > POOL_SIZE:
            pool.popitem(last=False)


@contextmanager
def leased_decoder(backend: str, model: HybridLM, batch: int, min_len: int, *,
                   zero: bool = True) -> Iterator[tuple[Decoder, HybridCache]]:
    """A decoder and an empty cache of at least ``min_len`` tokens, this caller's alone until the
    ``with`` block ends: what ``generate`` uses when given no cache.

    For a pooled backend both are kept on the model (``model.attachments``, up to POOL_SIZE free
    entries) and reused by later calls with the same batch and cache bucket: the cache is reset in
    place, so a decoder's captured graphs replay as they are (they are recaptured if the model's
    weights changed). An entry is out of the pool while it is lent: a concurrent caller (another
    thread) with the same shape gets an entry of its own, made fresh, and both go back to the pool
    after. Entries made before the model moved to another device or dtype are dropped. Other
    backends get a fresh cache of exactly ``min_len``. ``release_pooled(model)`` frees the free ones.
    A reused cache's states and lengths are zeroed, not its keys and values: the caller's prefill from
    position 0 writes them before attention reads them (``HybridCache.reset(keys_values=False)``), and
    zeroing them would be most of the bytes of the reset (100 MB for Qwen3.5-0.8B's 8,192-token bucket).
    ``zero=False`` resets the lengths only (``HybridCache.reset(zero=False)``), for a caller that
    resets it again before use, as :meth:`labkit.PrefixCache.prefill` does.
    """
    factory = _factory(backend)
    if backend not in POOLED:
        cache = model.new_cache(batch, min_len)
        yield checked_decoder(factory(model, cache), backend), cache
        return
    key = (backend, batch, pooled_cache_len(min_len), (model.device, model.dtype))
    taken = _take(model, key)
    if taken is None:
        entry, cache = (key, next(_SERIAL)), model.new_cache(batch, key[2])
    else:
        (entry, cache) = taken
        cache.reset(zero=zero, keys_values=False)
    decoder = checked_decoder(factory(model, cache), backend)  # if this fails, the entry is dropped
    try:
        yield decoder, cache
    finally:
        _give_back(model, entry, cache)


def pooled_decoder(backend: str, model: HybridLM, batch: int, min_len: int, *,
                   zero: bool = True) -> tuple[Decoder, HybridCache]:
    """:func:`leased_decoder`'s decoder and cache, given back to the pool at once: for a caller that
    runs alone (a benchmark). Concurrent callers use :func:`leased_decoder`, which lends the pair to
    one of them at a time."""
    with leased_decoder(backend, model, batch, min_len, zero=zero) as got:
        return got


def release_pooled(model: HybridLM) -> None:
    """Free the caches, decoders and graphs that ``generate`` keeps for ``model`` (those not lent now)."""
    with _POOL_LOCK:
        model.attachments.pop(_POOL, None)
