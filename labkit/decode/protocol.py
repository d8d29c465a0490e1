"""The decode contract: what every rung of the ladder offers its callers, with the defaults.

A rung is a factory ``(model, cache) -> Decoder``. Callers (``generate``, :class:`labkit.PrefixCache`,
the benchmarks, the diagnosis) use only what :class:`Decoder` declares here and never probe a
decoder's attributes: a rung overrides what it does better than the default.

- ``prefill(input_ids [B, T]) -> [B, vocab]``: the last token's logits; the cache advances by T.
- ``prefill_checked(input_ids, ids_checked=, weights=)``: ``prefill`` for a caller that has just checked
  the token ids' range on the host and taken the model's weights key (``generate``, PrefixCache), as
  for ``prefill_continuation`` (below), so that a rung which would check them again (a sync, a walk
  of the model, in the time to first token) skips that; default: :meth:`prefill`.
- ``step(tokens [B]) -> [B, vocab]``: the next logits; the cache advances by one.
- ``step_greedy(tokens [B]) -> [B]``: the argmax of ``step``'s logits (default: exactly that, so a
  rung that can pick the token without writing logits overrides it, bit for bit the same token).
- ``prefill_cores(checkpoint_every, checkpoints) -> MixerCores | None``: the mixer cores its prefill
  runs inside the model's own forward, lent to PrefixCache to read the states at block boundaries;
  ``None`` (the default): the rung's prefill cannot be run that way, and PrefixCache prefills
  through :meth:`prefill` block by block instead.
- ``checkpoint_multiple``: a multiple of it is a ``checkpoint_every`` the delta rule of
  ``prefill_cores`` can honour (state checkpoints from the chunk kernel's walk); ``None``: none.
- ``prefill_continuation(input_ids, ids_checked=, weights=, before=)``: a prompt that continues the
  cached sequences (the tail after a restored prefix); ``before``, if given, is work that must run
  right before it on the device (PrefixCache's restore: a callable with a hashable ``key``), run by
  the rung as part of the tail (a rung that captures the tail in a CUDA graph captures it too, and
  keys the graph by ``before.key`` as well); default: ``before()``, then :meth:`prefill`.
- ``prefill_reading(input_ids, checkpoint_every, reader, ids_checked=, weights=, before=) -> (logits, read) | None``:
  a prefill through cores that ``reader(cores, checkpoints)`` wraps (PrefixCache's boundary
  reader; it returns an object with ``.cores`` and ``.begin()``, called before each forward), into
  a fresh cache (a miss) or, with ``before`` (as for ``prefill_continuation``: a hit's restore, run
  first), after a restored prefix, run the way the rung runs its own prefill (``fused+graph``:
  captured per shape with ``before`` inside and replayed, the reader's tensors then being the
  graph's outputs, rewritten by each replay). ``None`` (the default, and a rung's answer when it
  would not capture this call; ``before`` not run): the caller runs ``before`` and the forward
  itself, eagerly, with ``prefill_cores``. ``ids_checked``, ``weights``: as for
  ``prefill_continuation`` (the caller has checked the token ids' range on the host, reading them
  from the device being a sync; the model's weights key, just taken).
- ``weights`` (of the three prefills above): the model's :func:`labkit.weights.weights_key` as the
  caller has just taken it; ``None``: the rung takes it; or a callable that gives it (the caller's
  own check with it, e.g. PrefixCache's against its snapshots, which raises if it fails), for the
  rung to call once it wants the key: before it runs anything eagerly, or right after it launches
  a captured replay (so that the walk of the model runs while the device works), dropping that
  replay if the call raises or the key shows the tensors changed (:func:`taken` gives the key of
  any of the three). The defaults call it first.
- ``hopper_features``: the features of :mod:`labkit.ops.features` (``"pdl"``, ``"bulk_prefetch"``,
  ...: sm_90 and newer) that this decoder's kernels use; empty (the default) for a rung that uses
  none. A rung decides at construction: on a GPU without a feature it takes its path without it, or
  raises :class:`labkit.ops.features.MissingFeature` (see the registry's declarations).
"""

from __future__ import annotations

from typing import Any

import torch

from ..cache import HybridCache
from ..model import HybridLM
from ..ops.mixers import MixerCores

__all__ = ["Decoder", "checked_decoder", "taken"]


def taken(weights: Any) -> Any:
    """The weights key a caller handed a prefill (``weights=``): itself (a key, or None), or, handed
    a callable, the key it gives (the caller's check runs then)."""
    return weights() if callable(weights) else weights


class Decoder:
    """Base of every rung: ``model`` and ``cache``, ``prefill`` and ``step``, and the capabilities
    callers use, each with its default (see the module's docstring)."""

    model: HybridLM
    cache: HybridCache
    checkpoint_multiple: int | None = None
    hopper_features: frozenset[str] = frozenset()

    def __init__(self, model: HybridLM, cache: HybridCache) -> None:
        self.model, self.cache = model, cache

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, vocab]
        raise NotImplementedError(f"{type(self).__name__} must define prefill")

    def prefill_checked(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                        weights: Any = None) -> torch.Tensor:
        taken(weights)
        return self.prefill(input_ids)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:  # [B] -> [B, vocab]
        raise NotImplementedError(f"{type(self).__name__} must define step")

    def step_greedy(self, tokens: torch.Tensor) -> torch.Tensor:  # [B] -> [B]
        return self.step(tokens).argmax(-1)

    def prefill_cores(self, checkpoint_every: int | None = None,
                      checkpoints: list[torch.Tensor] | None = None) -> MixerCores | None:
        return None

    def prefill_continuation(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                             weights: Any = None, before: Any = None) -> torch.Tensor:
        taken(weights)
        if before is not None:
            before()
        return self.prefill(input_ids)

    def prefill_reading(self, input_ids: torch.Tensor, checkpoint_every: int | None,
                        reader: Any, *, ids_checked: bool = False,
                        weights: Any = None, before: Any = None) -> tuple[torch.Tensor, Any] | None:
        return None


def checked_decoder(decoder: Any, backend: str) -> Decoder:
    """``decoder`` if it keeps the contract (a :class:`Decoder`), else a TypeError naming the rung."""
    if not isinstance(decoder, Decoder):
        raise TypeError(
            f"backend {backend!r} made a {type(decoder).__name__}, not a labkit.decode.Decoder: subclass "
            "labkit.decode.Decoder (it supplies the defaults callers rely on) and override prefill and step"
        )
    return decoder
