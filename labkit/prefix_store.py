"""Where a :class:`labkit.PrefixCache` keeps its snapshots, and how they move: fixed-size slots of
device memory, and span tables that copy a call's snapshots in one launch.

A snapshot has two parts (:mod:`labkit.prefix_cache` says what each is for):

- its block of keys and values: per attention layer, keys then values, ``[kv_heads, block, head_dim]``;
- the states at its boundary: every conv window ``[K-1, C]`` and every recurrent state
  ``[Hv, K, V]`` (float32).

Each part lives in a slot of its own :class:`SlotPool` (a node stored without states, admission
"ends", holds a KV slot only), at the byte offsets of a :class:`SnapshotLayout` (every piece
16-byte aligned). A slot is one allocation, reused after an eviction: a miss that stores 16
snapshots of ~50 tensors allocates nothing once the pools are warm (it used to allocate, and
launch a copy into, each tensor).

Storing and restoring are tables of ``(source, destination, bytes)`` spans
(:class:`labkit.ops.spans.Spans`), computed from buffer addresses with numpy, never from
tensor views: a block of keys is one span per head (the cache's ``[B, heads, max_len, head_dim]``
buffer holds a block of one head contiguously), a state one span. :class:`CacheSpans` gives the
KV spans either way and the states' spans into the cache; :func:`store_states` those of states read
during a prefill (:func:`state_sources`) into their slots. A call joins them into one table: one
launch. A node's pieces can still be looked at as tensors (:meth:`SnapshotLayout.views`: views of
its slot, made on request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .cache import HybridCache
from .config import ModelConfig
from .ops.spans import Spans

ALIGN = 16  # bytes: every piece starts on a 16-byte boundary (16-byte copies where the cache allows)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _array(xs) -> np.ndarray:
    return np.asarray(xs, dtype=np.int64)


@dataclass(frozen=True)
class Piece:
    """One tensor of a snapshot part: ``kind`` ("keys", "values", "conv", "recurrent") of ``layer``,
    at ``offset`` bytes into its slot."""

    kind: str
    layer: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


def _place(specs: list[tuple[str, int, tuple[int, ...], torch.dtype]]) -> tuple[list[Piece], int]:
    pieces, at = [], 0
    for kind, layer, shape, dtype in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        pieces.append(Piece(kind, layer, tuple(shape), dtype, at, nbytes))
        at = _aligned(at + nbytes)
    return pieces, at


class SnapshotLayout:
    """The pieces of one snapshot of ``block_size`` tokens of a model, as the cache holds them: the
    KV part's (per attention layer, keys then values) and the states part's (conv windows, then
    recurrent states, in the cache's layer order), each with its offset in its slot."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, block_size: int) -> None:
        probe = HybridCache(cfg, 1, block_size, dtype, "meta")  # shapes and dtypes only
        self.block_size = block_size
        self.kv_layers = list(probe.keys)
        kv = [(kind, i, tuple(bufs[i].shape[1:]), bufs[i].dtype)
              for i in self.kv_layers for kind, bufs in (("keys", probe.keys), ("values", probe.values))]
        states = [("conv", i, tuple(s.shape[1:]), s.dtype) for i, s in probe.conv_states.items()]
        states += [("recurrent", i, tuple(s.shape[1:]), s.dtype) for i, s in probe.recurrent_states.items()]
        self.kv_pieces, self.kv_bytes = _place(kv)
        self.state_pieces, self.state_bytes = _place(states)
        self.state_offsets = _array([p.offset for p in self.state_pieces])
        self.state_nbytes = _array([p.nbytes for p in self.state_pieces])
        if self.kv_layers:
            _, heads, _, head_dim = probe.keys[self.kv_layers[0]].shape
            self.kv_heads, self.head_dim = heads, head_dim
            self.kv_row_bytes = block_size * head_dim * probe.keys[self.kv_layers[0]].element_size()

    def views(self, slot: "Slot | None", kinds: tuple[str, ...]) -> dict[str, dict[int, torch.Tensor]]:
        """The pieces of ``kinds`` in ``slot`` as tensors (views: writing them writes the snapshot),
        kind -> layer -> tensor; empty dicts without a slot."""
        out: dict[str, dict[int, torch.Tensor]] = {k: {} for k in kinds}
        if slot is None:
            return out
        for p in self.kv_pieces + self.state_pieces:
            if p.kind in kinds:
                raw = slot.memory[p.offset: p.offset + p.nbytes]
                out[p.kind][p.layer] = raw.view(p.dtype).view(p.shape)
        return out


@dataclass(eq=False)
class Slot:
    """One slot: a uint8 tensor of the pool's slot size."""

    memory: torch.Tensor

    @property
    def address(self) -> int:
        return self.memory.data_ptr()


@dataclass(eq=False)
class SlotPool:
    """Slots of ``slot_bytes`` on ``device``: taken (a free one, else a new allocation) and given back
    when a snapshot is evicted, to be taken again; ``reserved`` is what the pool holds, in use or
    free. Each slot is an allocation of its own, so free ones can be released one by one (what the
    budget asks when the other pool must grow: :meth:`labkit.PrefixCache._take`)."""

    slot_bytes: int
    device: torch.device
    free: list[Slot] = field(default_factory=list)
    made: int = 0  # slots held (in use or free)

    @property
    def reserved(self) -> int:
        return self.made * self.slot_bytes

    def take(self) -> Slot:
        if self.free:
            return self.free.pop()
        self.made += 1
        return Slot(torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device))

    def give(self, slot: Slot | None) -> None:
        if slot is not None:
            self.free.append(slot)

    def release_free(self) -> None:
        """Free the memory of the slots not in use."""
        self.made -= len(self.free)
        self.free.clear()

    def clear(self) -> None:
        """Forget every slot (none may be used after this)."""
        self.free.clear()
        self.made = 0


class CacheSpans:
    """Addresses of a cache's buffers where a snapshot's pieces go, for one layout: computed once per
    (cache, layout) and kept in the cache's attachments (its buffers never move)."""

    def __init__(self, cache: HybridCache, layout: SnapshotLayout) -> None:
        self.layout = layout
        heads = getattr(layout, "kv_heads", 0)
        kv = layout.kv_pieces
        bufs = [(cache.keys if p.kind == "keys" else cache.values)[p.layer] for p in kv]
        for b in bufs:
            if not b.is_contiguous():
                raise ValueError("the cache's key and value buffers must be contiguous")
        # one span per (piece, head): the cache's row 0, block 0, head h; the slot's head h
        self.kv_cache = _array([b.data_ptr() + h * b.stride(1) * b.element_size() for b in bufs for h in range(heads)])
        self.kv_slot = _array([p.offset + h * layout.kv_row_bytes for p in kv for h in range(heads)])
        if bufs:
            self.kv_row_stride = bufs[0].stride(0) * bufs[0].element_size()  # next sequence
            self.kv_block_stride = layout.block_size * bufs[0].stride(2) * bufs[0].element_size()  # next block
        states = {"conv": cache.conv_states, "recurrent": cache.recurrent_states}
        self.state_cache = _array([states[p.kind][p.layer].data_ptr() for p in layout.state_pieces])
        self.state_slot = layout.state_offsets
        self.state_bytes = layout.state_nbytes
        self.device = cache.device

    @classmethod
    def of(cls, cache: HybridCache, layout: SnapshotLayout) -> "CacheSpans":
        made = cache.attachments.setdefault("labkit.prefix_store.spans", {})
        got = made.get(id(layout))
        if got is None or got.layout is not layout:
            got = made[id(layout)] = cls(cache, layout)
        return got

    def kv(self, rows: np.ndarray, depths: np.ndarray, slots: np.ndarray, *, to_slot: bool) -> Spans:
        """The KV blocks of sequence ``rows[i]``, block ``depths[i]``, between the cache and the KV slot at
        address ``slots[i]`` (to the slot: ``to_slot``; else from it), one span per (piece, head)."""
        if not self.kv_cache.size or not rows.size:
            return Spans.empty(self.device)
        cache_at = (self.kv_cache[None, :] + rows[:, None] * self.kv_row_stride
                    + depths[:, None] * self.kv_block_stride).ravel()
        slot_at = (slots[:, None] + self.kv_slot[None, :]).ravel()
        nbytes = np.full(cache_at.size, self.layout.kv_row_bytes, dtype=np.int64)
        return Spans(cache_at, slot_at, nbytes, self.device) if to_slot else Spans(slot_at, cache_at, nbytes, self.device)

    def states_to_cache(self, rows: np.ndarray, slots: np.ndarray) -> Spans:
        """Every state piece of the state slot at ``slots[i]`` into sequence ``rows[i]`` of the cache."""
        if not self.state_slot.size or not rows.size:
            return Spans.empty(self.device)
        src = (slots[:, None] + self.state_slot[None, :]).ravel()
        dst = (self.state_cache[None, :] + rows[:, None] * self.state_bytes[None, :]).ravel()
        return Spans(src, dst, np.tile(self.state_bytes, rows.size), self.device)


def state_sources(layout: SnapshotLayout, conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """(base addresses, bytes per piece, boundaries per sequence) of boundary states read during a
    prefill: ``conv[layer]`` [B, count, K-1, C], ``recurrent[layer]`` [B, count, Hv, K, V], every layer
    of the layout, each contiguous in the piece's dtype (checked: the addresses are computed from them)."""
    given = {"conv": conv, "recurrent": recurrent}
    bases, count = [], None
    for p in layout.state_pieces:
        t = given[p.kind].get(p.layer)
        if t is None:
            raise RuntimeError(f"no {p.kind} state was read for layer {p.layer}: no snapshot can be stored")
        if t.dtype != p.dtype or tuple(t.shape[2:]) != p.shape or not t.is_contiguous():
            raise RuntimeError(f"the {p.kind} states read for layer {p.layer} are {t.dtype} {tuple(t.shape)} "
                               f"(contiguous: {t.is_contiguous()}); a snapshot needs [B, n, *{p.shape}] {p.dtype}")
        if count is None:
            count = t.shape[1]
        elif t.shape[1] != count:
            raise RuntimeError("the boundary states of the layers disagree on the number of boundaries")
        bases.append(t.data_ptr())
    return _array(bases), layout.state_nbytes, count or 0


def store_states(layout: SnapshotLayout, sources: tuple[np.ndarray, np.ndarray, int], index: np.ndarray,
                 slots: np.ndarray, device: torch.device) -> Spans:
    """Boundary states ``index[i]`` (= sequence * boundaries + boundary) of :func:`state_sources` into the
    state slot at address ``slots[i]``."""
    bases, nbytes, _ = sources
    if not bases.size or not index.size:
        return Spans.empty(device)
    src = (bases[None, :] + index[:, None] * nbytes[None, :]).ravel()
    dst = (slots[:, None] + layout.state_offsets[None, :]).ravel()
    return Spans(src, dst, np.tile(nbytes, index.size), device)
