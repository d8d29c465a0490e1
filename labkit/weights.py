"""A model's weights key: the one identity check of what a plan, a captured graph or a prefix snapshot
depends on.

:func:`weights_key` returns a :class:`WeightsKey` of three parts:

- ``layout``: every module's parameter, buffer and child names in walk order, with each tensor's
  shape and dtype: *what* the weights are (a renamed, deleted, reshaped or converted tensor moves it);
- ``places``: each tensor's storage address and in-place version counter: *where* they live and
  the edits torch counts (a replaced tensor, a moved model, ``p.add_(1)`` under ``no_grad``);
- ``fingerprint``: the bytes of a few sampled elements of every tensor (``SAMPLES``, evenly spaced
  over its storage span): the edits torch does not count. ``p.data`` is a tensor with its own
  version counter, so ``p.data.mul_(3)`` leaves ``places`` as it was; it moves the sampled
  elements. An edit of elements that are not sampled (``p.data[3, 5] = 0``) is not seen: the
  fingerprint is a cheap net under whole-tensor edits, not a hash of every weight.

Every rung (:meth:`labkit.decode.fused.FusedDecoder.refresh`, ``reference+graph``) and
:class:`labkit.PrefixCache` compare the whole key; a PrefixCache also accepts another model object
whose key has the same ``layout`` and ``fingerprint`` (:meth:`WeightsKey.same_values`: the same
checkpoint loaded twice), since its snapshots depend on the values, not on where they live.
Inference tensors (made under ``torch.inference_mode()``) have no version counter: their part of
``places`` is the address alone (they cannot be edited in place outside inference mode), and the
fingerprint covers edits inside it.

Cost. The key is taken on every prefill, so it is paid on every time to first token. Walking the
module tree costs ~0.2-0.3 ms of Python on Qwen3.5-0.8B, so the walk is memoized per model object:
the memo keeps weak references to the modules and tensors it saw and, on each call, re-reads in a
few C-level passes (``map`` over the memo's lists, no Python call per tensor) every module's names,
that each entry is still the very object seen, and each tensor's address, version, shape and
dtype; any difference, or a module or tensor that died, and the key is walked again. On the H200
machine's host the memoized facts took 0.219 ms against the walk's 0.232 (data/bench/nvidia-h200/
hit-host.json): the savings that count are taking the key once per call, and taking it while the
device works: a ``fused+graph`` prefill of a captured shape replays its graph first and takes the
key meanwhile, without a prefix cache (:meth:`labkit.decode.fused_prefill.FusedPrefill.prefill_checked`)
and with one, whose check of its snapshots' weights the decoder runs after the launch (a steady
hit's restore and tail, a miss of a shape seen before: ``labkit.prefix_cache._WeightsCheck``).

Who reads the fingerprint. A plan or a captured graph reads the tensors where they are, so an edit
of their values (even through ``.data``) needs nothing rebuilt: the rungs key by ``layout`` and
``places`` alone (``weights_key(model, values=False)``, :meth:`WeightsKey.same_tensors`) and pay
nothing for values. A prefix snapshot was computed from the values, so :class:`labkit.PrefixCache`
reads the fingerprint on every prefill (:func:`values_later`, the two-step form of :func:`with_values`;
the rung is handed the whole key, so the facts are not read twice), on a stream of its own ordered
after an event recorded before the prefill's launches (``after=``): it sees every edit queued before
the call and does not wait for the replay behind which it is taken.

When asked for, the fingerprint is read on every call (that is its point): the sampled elements'
addresses are listed once per memo, as a table of byte spans (:mod:`labkit.ops.copy_spans`) that
gathers them into one buffer per device, so a read is one launch and one copy to the host per
device, whatever the number of tensors. It is the one part that touches the device: on a GPU the
host waits for it. :func:`values_later` launches the read and returns the wait, so that a caller
works on the host meanwhile: the copy lands in pinned host memory, queued behind the gather, and
the wait is for its event. The design it replaced (a view of each tensor's samples, and
concatenations per dtype) cost Python and dispatch per tensor (~1 us for each view), and on a GPU
concatenation kernels over hundreds of small inputs: an H100 profile of a Qwen3.5-0.8B prefix-cache
hit (236 tensors, 2026-12-05) held four of them, 57 us of device time, which only the fingerprint
launched on that path. This design's profile of the same hit (2026-12-06,
data/bench/nvidia-h100-80gb-hbm3/hit-timeline.json) has no concatenation: two span-table
launches, the fingerprint's and the restore's, 58 us together. On a CPU
the table runs as a memmove per sample (~1 us each: ~2 ms for those 236 tensors; the CPU is where
the tests run, not the product). Tensors on the meta device hold no values and are not sampled.
"""

from __future__ import annotations

import operator
import weakref
from dataclasses import dataclass, replace
from itertools import chain
from typing import Callable

import numpy as np
import torch
from torch import nn

from .ops.spans import Spans

__all__ = ["SAMPLES", "WeightsKey", "values_later", "weights_key", "with_values"]

SAMPLES = 8  # elements sampled per tensor for the fingerprint


@dataclass(frozen=True)
class WeightsKey:
    """What a model's weights are (``layout``), where they live (``places``) and a sample of their
    values (``fingerprint``); equal keys: nothing a plan, graph or snapshot depends on changed."""

    layout: tuple
    places: tuple
    fingerprint: bytes | None  # None: not read (``weights_key(..., values=False)``)

    def same_tensors(self, other: "WeightsKey | None") -> bool:
        """The same tensors, unmodified as far as torch counts: what a plan or a captured graph binds
        (it reads the tensors where they are, so an edit of their values needs nothing rebuilt)."""
        return other is not None and self.layout == other.layout and self.places == other.places

    def same_values(self, other: "WeightsKey") -> bool:
        """The same names, shapes, dtypes and sampled values: the same weights, wherever they live
        (a checkpoint loaded twice), as far as the fingerprint can tell."""
        if self.fingerprint is None or other.fingerprint is None:
            raise ValueError("same_values needs both keys taken with values=True (their fingerprints)")
        return self.layout == other.layout and self.fingerprint == other.fingerprint


def _walk(module: nn.Module, layout: list, tensors: list, modules: list) -> None:
    """Every parameter and buffer under ``module`` into ``tensors``, with (name, shape, dtype) and the
    names of the submodules between them into ``layout`` (a plain walk: module.named_parameters()
    is 4x slower), and the modules walked into ``modules``, in the walk's order."""
    modules.append(module)
    for owned in (module._parameters, module._buffers):
        for name, t in owned.items():
            if t is not None:
                layout.append((name, t.shape, t.dtype))
                tensors.append(t)
    for name, child in module._modules.items():
        if child is not None:
            layout.append(name)
            _walk(child, layout, tensors, modules)


_DICTS = operator.attrgetter("_parameters", "_buffers", "_modules")
_VERSION = operator.attrgetter("_version")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")
_NONE = type(None)  # calling it gives None: stands in for a weak reference to a None entry


def _ref(obj):
    return _NONE if obj is None else weakref.ref(obj)


def _sampling(t: torch.Tensor) -> tuple[tuple[int], tuple[int]]:
    """``as_strided`` size and stride of ``SAMPLES`` elements evenly spaced over the storage span of
    ``t`` (from its first element to its last: inside its storage whatever its strides)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    count = min(SAMPLES, span)
    return (count,), (max(1, span // max(count, 1)),)


class _Memo:
    """What one walk of a model saw, held weakly (a replaced weight is freed, not kept by the memo)."""

    __slots__ = ("modules", "names", "entries", "tensors", "versioned", "facts", "samples", "tensors_key", "key")

    def __init__(self, model: nn.Module) -> None:
        layout: list = []
        tensors: list[torch.Tensor] = []
        modules: list[nn.Module] = []
        _walk(model, layout, tensors, modules)
        dicts = list(chain.from_iterable(map(_DICTS, modules)))
        entries = list(chain.from_iterable(map(dict.values, dicts)))
        self.modules = [weakref.ref(m) for m in modules]
        self.names = tuple(chain.from_iterable(dicts))  # every dict's keys, in order
        self.entries = [_ref(e) for e in entries]
        self.tensors = [weakref.ref(t) for t in tensors]
        # inference tensors have no version counter (reading it raises)
        self.versioned = [not t.is_inference() for t in tensors]
        self.facts = self._facts(tensors)
        self.samples = _Samples.of(tensors)
        versions = iter(self.facts[1])
        places = tuple((ptr, next(versions) if v else None) for ptr, v in zip(self.facts[0], self.versioned))
        self.tensors_key = WeightsKey(tuple(layout), places, None)
        self.key: WeightsKey | None = None  # with its fingerprint, once one was asked for

    def _facts(self, tensors: list[torch.Tensor]) -> tuple:
        """Storage addresses, version counters (of the tensors that have one), shapes and dtypes."""
        return (tuple(map(torch.Tensor.data_ptr, tensors)),
                tuple(map(_VERSION, [t for t, v in zip(tensors, self.versioned) if v])),
                tuple(map(_SHAPE, tensors)), tuple(map(_DTYPE, tensors)))

    def with_values(self, tensors: list[torch.Tensor]) -> WeightsKey:
        """:attr:`tensors_key` with the fingerprint read now (the very same key object while it reads
        the same). ``tensors`` are alive (the caller holds them): the samples' addresses are theirs."""
        return self.values_later(tensors)()

    def values_later(self, tensors: list[torch.Tensor], after: "torch.cuda.Event | None" = None
                     ) -> Callable[[], WeightsKey]:
        """:meth:`with_values` in two halves: the read is launched now (``tensors`` alive, as there;
        ``after``: see :meth:`_Samples.start`), and the function returned waits for it and gives the key."""
        pending = self.samples.start(after)

        def key() -> WeightsKey:
            fingerprint = pending()
            if self.key is None or fingerprint != self.key.fingerprint:  # values edited where torch does not count
                self.key = replace(self.tensors_key, fingerprint=fingerprint)
            return self.key

        return key

    def current(self, values: bool) -> WeightsKey | None:
        """The key a walk now would give, if the memo still describes the model (the same modules,
        entries (by identity) and names, each tensor at the same storage, version, shape and dtype),
        with the fingerprint read now if ``values``; None if the model's tree or tensors changed."""
        modules = list(map(operator.call, self.modules))
        if None in modules:  # a module died: the tree changed
            return None
        dicts = list(chain.from_iterable(map(_DICTS, modules)))
        if tuple(chain.from_iterable(dicts)) != self.names:
            return None
        entries = list(chain.from_iterable(map(dict.values, dicts)))
        if not all(map(operator.is_, entries, map(operator.call, self.entries))):
            return None
        # the entries are the very objects seen, so the weak references to the tensors are alive
        tensors = list(map(operator.call, self.tensors))
        if self._facts(tensors) != self.facts:
            return None
        return self.with_values(tensors) if values else self.tensors_key


_MEMOS: "weakref.WeakKeyDictionary[nn.Module, _Memo]" = weakref.WeakKeyDictionary()


class _Samples:
    """The fingerprint's elements: per device, one span table (:class:`labkit.ops.spans.Spans`)
    gathering ``SAMPLES`` elements of every tensor (meta and empty tensors hold none) into one
    buffer, which is then copied to the host: one launch and one copy per device, however many
    tensors (a view and a concatenation of each cost ~1 us of host per tensor)."""

    def __init__(self, parts: list[tuple[Spans, torch.Tensor]]) -> None:
        self.parts = parts
        self.side: dict[torch.device, torch.cuda.Stream] = {}  # per device, for reads ordered by an event
        # where each part's bytes land on the host: pinned for a device's, so that the copy is queued
        # without a wait (:meth:`start`); the buffer itself on a CPU
        self.hosts = [torch.empty(buf.numel(), dtype=torch.uint8, pin_memory=True) if buf.is_cuda else buf
                      for _, buf in parts]

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> "_Samples":
        by_device: dict[torch.device, list[tuple[np.ndarray, int]]] = {}
        for t in tensors:
            if t.device.type == "meta" or not t.numel():
                continue
            (count,), (stride,) = _sampling(t)
            size = t.element_size()
            at = t.data_ptr() + np.arange(count, dtype=np.int64) * stride * size
            by_device.setdefault(t.device, []).append((at, size))
        parts = []
        for device, pieces in by_device.items():
            src = np.concatenate([at for at, _ in pieces])
            nbytes = np.concatenate([np.full(at.size, size, dtype=np.int64) for at, size in pieces])
            buf = torch.empty(int(nbytes.sum()), dtype=torch.uint8, device=device)
            dst = buf.data_ptr() + np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(np.int64)
            parts.append((Spans(src, dst, nbytes, device), buf))
        return cls(parts)

    @torch.no_grad()
    def start(self, after: "torch.cuda.Event | None" = None) -> Callable[[], bytes]:
        """Launch the read (per device, the span table's gather and the copy to the host, queued on
        the current stream) and return a function that waits for it and gives the sampled bytes: a
        caller does host work of its own between the two, while the device gathers. (Two reads in
        flight at once share the buffers; they read the same values while the weights do not change.)

        ``after``: an event recorded on the current stream before work that does not write the
        weights (a replayed prefill): the read then runs on a stream of its own once that event has
        passed, instead of queueing behind that work, so the wait is for the read alone. It still
        sees every write to the weights queued before the event."""
        done = []
        for (spans, buf), host in zip(self.parts, self.hosts):
            if not buf.is_cuda:
                spans.run()
                continue
            stream = torch.cuda.current_stream(buf.device)
            if after is not None:
                if buf.device not in self.side:
                    self.side[buf.device] = torch.cuda.Stream(buf.device)
                stream = self.side[buf.device]
                stream.wait_event(after)
                buf.record_stream(stream)  # made on the current stream: not reused before this read ends
            with torch.cuda.stream(stream):
                spans.run()
                host.copy_(buf, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            done.append(event)

        def result() -> bytes:
            for event in done:
                event.synchronize()
            return b"".join(host.numpy().tobytes() for host in self.hosts)

        return result


def weights_key(model: nn.Module, *, values: bool = True) -> WeightsKey:
    """The :class:`WeightsKey` of ``model`` now: names, shapes and dtypes; storage and in-place
    versions; with ``values``, a fingerprint of sampled values (see the module's docstring for what
    each catches). The rungs ask ``values=False``: a plan or a graph reads the tensors in place, so
    it depends on which tensors they are, not on their values; a prefix snapshot depends on both.

    Any change means a plan (and the graphs that captured it) or a prefix snapshot may be stale: a
    replaced tensor, a moved or converted model, a renamed, reshaped or deleted parameter, an
    in-place update (counted by torch, or through ``.data`` where it moves the sampled elements).
    Memoized per model object: a repeated call re-checks the facts in a few C-level passes instead
    of walking the tree, and returns the very same key object while nothing changed.
    """
    memo = _MEMOS.get(model)
    key = None if memo is None else memo.current(values)
    if key is None:
        memo = _MEMOS[model] = _Memo(model)
        key = memo.with_values(list(map(operator.call, memo.tensors))) if values else memo.tensors_key
    return key


def with_values(model: nn.Module, key: WeightsKey) -> WeightsKey:
    """``key`` with its fingerprint: ``key`` itself if it has one; if it is the tensors key that
    :func:`weights_key` has just given for ``model`` (``weights_key(model, values=False)``), only the
    fingerprint is read, the facts are not checked again; otherwise the whole key afresh."""
    return values_later(model, key)()


def values_later(model: nn.Module, key: WeightsKey | None = None, *,
                 after: "torch.cuda.Event | None" = None) -> Callable[[], WeightsKey]:
    """:func:`with_values` (``key`` None: :func:`weights_key`) in two halves: the facts are checked and
    the fingerprint's read launched now; the function returned waits for the read and gives the
    key, while the caller works on the host in between. ``after``: an event on the current stream
    that the read is ordered after, on a stream of its own rather than behind the work queued since
    (:meth:`_Samples.start`): :class:`labkit.PrefixCache` takes the key while a replayed prefill runs."""
    if key is not None and key.fingerprint is not None:
        return lambda: key
    memo = _MEMOS.get(model)
    if key is None:
        key = weights_key(model, values=False)  # the facts checked (or walked afresh): the memo is current
        memo = _MEMOS[model]
    if memo is not None and memo.tensors_key is key:
        return memo.values_later(list(map(operator.call, memo.tensors)), after)
    fresh = weights_key(model)
    return lambda: fresh
