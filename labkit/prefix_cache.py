"""An exact prefix-state cache for hybrid decoders: snapshots of every layer's state at block boundaries.

A recurrent layer (LFM2's short conv, Gated DeltaNet) keeps one state however long the context, so
its state after token ``t`` cannot be sliced back out of the state after a longer prompt. Prefix
reuse therefore stores *snapshots*: after each block of ``block_size`` prompt tokens, per sequence,

- the keys and values of that block's positions, per attention layer (the positions before it are
  held by the node's ancestors, so a snapshot at boundary ``b`` costs one block of KV, not ``b``);
- every conv window and every recurrent state, whole (they summarise all the tokens before).

Snapshots live in a trie over token blocks (a radix tree whose edges are one block each): the
node reached by blocks ``x[0:bs], x[bs:2bs], ..., x[(k-1)bs:k bs]`` holds the state after ``k bs``
tokens. :meth:`PrefixCache.prefill` finds the longest cached prefix, copies the path's KV blocks and
the deepest node's conv and recurrent states into the decoder's cache, sets the lengths, and then
prefills only the rest in one call of the decoder's prefill, reading the state at each block
boundary inside it (no second pass) with the decoder's own kernels: the conv windows from the
projection the conv is handed (the rows before each boundary: one small copy per layer), the
recurrent states from the delta rule's checkpoints (``checkpoints=`` of
:func:`labkit.ops.chunk_delta_rule.chunk_delta_rule`, or of the chunked reference) when the block
is a multiple of its 64-token chunk, else by calling the delta rule piece by piece between
boundaries; the KV blocks are read from the cache afterwards. Snapshots live in fixed-size slots
(:mod:`labkit.prefix_store`: one for a node's block of KV, one for its states), reused after
evictions, and everything a call stores is one table of byte spans run in one launch
(:mod:`labkit.ops.copy_spans`; a clone per tensor made a miss cost several prefills in launches, and
a multi-tensor copy per dtype still cost an allocation per tensor and several kernels). Under
``fused+graph`` a miss into a fresh cache is itself captured per prompt shape and replayed
(:meth:`labkit.decode.Decoder.prefill_reading`). A hit's restore is one span table too, made once
per path (:class:`_RestorePlan`), and the decoder runs it together with the tail: a tail shorter
than a block has no boundary to read (``prefill_continuation(before=restore)``), a longer one has
its boundaries read as a miss's are (``prefill_reading(..., before=restore)``). A ``fused+graph``
decoder replays the restore and the tail from one CUDA graph captured per (restored length, tail
shape) once that shape comes back (:mod:`labkit.decode.fused_prefill`; its first hit runs eagerly,
as a prompt length's first prefill does): a hit is then the host's look-up, a table copy and one
replay.
A decoder that lends no cores (``prefill_cores()`` is None) is run block by block through its own
prefill instead.
Restoring copies stored bytes; a hit gives the logits of no cache at all up to float32 rounding
(the chunked delta rule restarts its chunks at the restored boundary; the tests hold the
difference to 1e-5 relative in float32).
Snapshots are kept on the model's device (``budget_bytes`` bounds that memory: the slots in use,
and the free ones kept for reuse, ``reserved_bytes``). Restoring writes the cache's buffers in
place and sets its lengths, so decoders with captured graphs (``fused+graph``) keep replaying them.

Behaviour at the edges, by design:

- snapshots of the recurrent state are float32 like the cache's (1 MiB per Qwen3.5-0.8B GDN layer
  per snapshot): exactness is the contract, and :mod:`labkit.lab.snapshot_precision` measures what bf16
  snapshots would cost instead;
- at most ``(T - 1) // block_size`` blocks of a ``T``-token prompt are restored: the last prompt
  token is always run, since its logits are what the caller needs (and no logits are stored); a
  prompt of at most one block (``T <= block_size``) therefore always misses, and one shorter than a
  block leaves no snapshot either;
- batch > 1: each row looks up its own prefix, and the batch restores the *shortest* row's hit (in
  blocks) for every row, each row from its own path, since all rows of a :class:`HybridCache` advance
  together; rows with longer hits recompute those blocks (and refresh their nodes' recency);
- memory: ``budget_bytes`` bounds the bytes of all stored snapshots; before a snapshot is stored,
  leaves are evicted (a node's children need its KV, so only leaves go) by ``policy``; nodes on the
  paths of the prompt being prefilled are pinned. If no leaf can go, the snapshot (and the deeper
  ones of that row in this call) is not stored: results stay exact, only later hits are shorter.

Admission: ``"every"`` (the default) stores the states at every block boundary, so any prefix of
a cached prompt can be restored. ``"ends"`` (after Marconi, Pan et al. 2024) stores every block's KV
but the states only at two boundaries per prompt: its deepest one, and its branch point, the deepest
boundary already in the trie when it arrives (where a prompt sharing the same prefix is likely to
leave it again). Such a trie is mostly KV, a few times smaller for the same prompts; a restore stops
only at a node with states, so a prompt whose chain of blocks does not fit the budget (the states
come last, at its end) leaves nothing to restore.

``"paying"`` stores every block's KV, and the states only at boundaries where a later hit would
save more FLOPs (``flops_per_token * depth * block_size``) than storing them costs, counted as their
bytes times the device's FLOPs-per-byte exchange rate (:data:`EXCHANGE_RATES`, ``exchange_rate=``):
from :attr:`PrefixCache.paying_depth` blocks deep on. It is not the default: at chapter 03's shapes
(blocks of 64 tokens or more; Qwen3.5-0.8B, LFM2-350M, the byte-level checkpoints; either rate)
every boundary pays (``paying_depth`` is 1: on Qwen3.5-0.8B a 64-token block saves ~1e11 FLOPs
against ~6e9 for its 19 MB of states at the cuda rate), so it stores what ``"every"`` stores; it
declines snapshots only for small blocks of models with large states.

First calls: ``PrefixCache(..., warm_up=decoder)`` (or :meth:`PrefixCache.warm_up`) runs a miss and a
hit on a prompt of its own at construction (kernels compile, restore plans and graphs are made),
then forgets it; ``warm_up_s`` is what it took.

Policies: ``"lru"`` evicts the least recently used leaf. ``"flops"`` (after Marconi, Pan et al.
2024: keep what saves most compute per byte) evicts the leaf with the fewest FLOPs saved per byte it
holds, with least recent use breaking ties. A hit on a node of depth ``k`` blocks saves the
prefill of ``k * block_size`` tokens, estimated as ``2 * model.num_parameters() * tokens`` (the
matmul FLOPs; attention's quadratic term and the embedding gather are not counted), and evicting
it frees its own bytes (one block of KV plus the recurrent states).

A cache is bound to one model's weights: its configuration, dtype, device and weights
(:func:`labkit.weights.weights_key`, whose fingerprint also sees edits through ``.data``); a model
with other weights, or the same model after its weights changed, is refused with a clear error
rather than restoring foreign state (a ``fused+graph`` decoder replaying a captured hit or miss
checks them while the replay runs, and drops it if they are refused: the decoder's cache is then
left empty). Another model object with the same weights (the same
checkpoint loaded twice: the same names, shapes, dtypes and sampled values,
:meth:`labkit.weights.WeightsKey.same_values`) is accepted, and then bound like the first.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .cache import CacheFullError, HybridCache
from .weights import WeightsKey, values_later, weights_key
from .decode.protocol import Decoder
from .model import HybridLM
from .config import is_int, is_real
from .ops.spans import Spans, run_table
from .ops.mixers import MixerCores, short_conv_input
from .prefix_store import CacheSpans, Slot, SlotPool, SnapshotLayout, state_sources, store_states

POLICIES = ("lru", "flops")
ADMISSIONS = ("every", "ends", "paying")

# Admission "paying": FLOPs a prefill does in the time it takes to store one byte of snapshot, per
# device kind (the exchange rate between a hit's saved compute and a snapshot's copies). Data, each
# with where it comes from; an unknown kind is refused (pass ``exchange_rate=`` instead):
# - cuda: an H200 (DESIGN.md's table, 2026-11-29): the prefill's projections through cuBLAS at about
#   620 TFLOP/s against a copy at 4.25 TB/s of read + write traffic, 2.125e12 bytes stored per second;
# - cpu: the CPU machine labkit is developed on (2 cores, one thread, 2026-12-03): the reference
#   prefill of byte-qwen3.5-6m, 256 tokens in float32, at 1.1-1.2e10 FLOP/s against 16 snapshots'
#   states stored at 0.8-1.0e10 bytes/s: 1.13 and 1.43 in two runs
#   (:func:`labkit.bench.cache.measure_exchange_rate`, which any machine can re-run).
EXCHANGE_RATES = {"cuda": 620e12 / 2.125e12, "cpu": 1.3}


def block_key(block: torch.Tensor | list[int] | tuple[int, ...]) -> bytes:
    """The trie's key of one block of token ids: the bytes of the ids as int64.

    A dict look-up on bytes hashes them in C; a tuple of Python ints costs an int object per token to
    make (``tolist``) and to hash, ~14 us per 256-token block. int32 and int64 ids give the same key."""
    if isinstance(block, torch.Tensor):
        t = block.detach().to("cpu", torch.int64)
    else:
        t = torch.tensor(list(block), dtype=torch.int64)
    return t.contiguous().numpy().tobytes()


def _block_keys(host: torch.Tensor, block_size: int) -> list[list[bytes]]:
    """The :func:`block_key` of every whole block of every row of host ids [B, T], from one buffer:
    row ``r``'s ``j``-th key covers tokens ``j * block_size .. (j + 1) * block_size``."""
    B, T = host.shape
    n = T // block_size
    data = host[:, : n * block_size].to(torch.int64).contiguous().numpy().tobytes()
    step, row = block_size * 8, n * block_size * 8
    return [[data[at : at + step] for at in range(r * row, (r + 1) * row, step)] for r in range(B)]


class _Children(dict):
    """A node's children by :func:`block_key`. A tuple, list or tensor of token ids also finds one
    with ``[]`` (converted; for tests and debugging): ``get``, the look-up's path, takes bytes only."""

    def __missing__(self, key: Any) -> "_Node":
        if isinstance(key, (tuple, list, torch.Tensor)):
            return self[block_key(key)]
        raise KeyError(key)


@dataclass(eq=False)
class _Node:
    """The state after the blocks on the path from the root to this node, for one sequence: its
    block's keys and values in ``kv_slot``, and (``has_states``) every conv window and recurrent
    state at its boundary in ``state_slot`` (:mod:`labkit.prefix_store`)."""

    parent: "_Node | None"
    block: bytes  # block_key of the tokens of the edge into this node (empty at the root)
    depth: int  # blocks from the root
    layout: SnapshotLayout | None = None
    kv_slot: Slot | None = None
    state_slot: Slot | None = None  # None: the block's KV only (admission "ends"): a way through, not a hit
    children: _Children = field(default_factory=_Children)  # block_key -> node
    last_used: int = 0

    @property
    def has_states(self) -> bool:
        return self.state_slot is not None

    @property
    def nbytes(self) -> int:
        return (self.layout.kv_bytes if self.kv_slot else 0) + (self.layout.state_bytes if self.state_slot else 0)

    # the pieces as tensors, layer -> tensor, for looking at a snapshot (views of its slots, made on request)
    keys = property(lambda self: self._views("keys", self.kv_slot))
    values = property(lambda self: self._views("values", self.kv_slot))
    conv_states = property(lambda self: self._views("conv", self.state_slot))
    recurrent_states = property(lambda self: self._views("recurrent", self.state_slot))

    def _views(self, kind: str, slot: Slot | None) -> dict[int, torch.Tensor]:
        return self.layout.views(slot, (kind,))[kind]


class _Store:
    """The copies that store one call's new snapshots, queued per node (:meth:`kv`, :meth:`states`) as
    addresses and run as one span table (:meth:`run`: one launch on a GPU): the KV block of (sequence,
    block) from the cache, the states of a boundary from what the prefill read
    (:func:`labkit.prefix_store.state_sources`)."""

    def __init__(self, spans: CacheSpans) -> None:
        self._spans = spans
        self._kv: list[tuple[int, int, int]] = []  # (sequence, block, slot address)
        self._states: list[tuple[int, int]] = []  # (boundary index in the sources, slot address)
        self.launches = 0  # span tables run (for the tests and the benchmark's counts)
        self.bytes = 0

    def kv(self, r: int, depth: int, slot: Slot) -> None:
        self._kv.append((r, depth, slot.address))

    def states(self, index: int, slot: Slot) -> None:
        self._states.append((index, slot.address))

    def run(self, sources: tuple | None) -> None:
        """Run the queued copies, the states' from ``sources`` (None: none are queued)."""
        parts = []
        if self._kv:
            r, d, a = (np.asarray(c, dtype=np.int64) for c in zip(*self._kv))
            parts.append(self._spans.kv(r, d, a, to_slot=True))
        if self._states:
            index, a = (np.asarray(c, dtype=np.int64) for c in zip(*self._states))
            parts.append(store_states(self._spans.layout, sources, index, a, self._spans.device))
        self._kv.clear()
        self._states.clear()
        spans = Spans.join(parts, self._spans.device)
        if len(spans):
            spans.run()
            self.launches += 1
            self.bytes += spans.total_bytes


@dataclass(eq=False)
class _RestorePlan:
    """The copies of one restore, as one span table: for each row's path, every node's KV block into
    the cache's positions, and the deepest node's states into the row's state buffers.

    Made once per (cache, nodes restored) and reused by later hits on the same path; it holds the
    nodes, so their ids, which key it, cannot be reused while it lives; :class:`PrefixCache` drops it
    when one of them is evicted (its slot may then hold another snapshot), and on ``clear``."""

    nodes: tuple[_Node, ...]
    spans: Spans
    uses: int = 0


class _Restore:
    """A hit's restore as work a decoder runs right before the prompt's tail
    (``Decoder.prefill_continuation(before=)``), inside the tail's CUDA graph where the decoder
    captures one: the span table staged in a buffer of the cache's (:meth:`stage`, outside any
    graph: one small copy), then the cache's lengths set on the device. ``key`` tells a decoder which
    captured tails it can replay with it: those of the same table shape and restored length."""

    def __init__(self, cache: HybridCache, plan: _RestorePlan, tokens: int) -> None:
        self._table, *self._shape = plan.spans.table()  # word, align, longest
        self.key = ("labkit.PrefixCache.restore", self._table.shape[0], *self._shape, tokens)
        buffers = cache.attachments.setdefault("labkit.PrefixCache.restore_tables", {})
        self._staged = buffers.get(self.key[1:-1])
        if self._staged is None:
            self._staged = buffers[self.key[1:-1]] = torch.empty_like(self._table)
        self._lengths, self._tokens = cache.lengths, tokens

    def stage(self) -> None:
        self._staged.copy_(self._table)

    def __call__(self) -> None:
        run_table(self._staged, *self._shape)
        self._lengths.fill_(self._tokens)


class _PlanTable:
    """One PrefixCache's restore plans for one cache, by the ids of the nodes restored (most recent
    last). Kept in the cache's attachments, so the plans go with the cache; the PrefixCache holds
    the table weakly (by identity: not a dict)."""

    __slots__ = ("plans", "__weakref__")

    def __init__(self) -> None:
        self.plans: OrderedDict[tuple[int, ...], _RestorePlan] = OrderedDict()


def _clear_tables(tables: "weakref.WeakSet[_PlanTable]") -> None:
    """Drop every plan of a PrefixCache that is gone: they hold its nodes."""
    for table in list(tables):
        table.plans.clear()


class _WeightsCheck:
    """The model's weights key (:func:`labkit.weights.weights_key`, with its fingerprint), checked
    against a PrefixCache's snapshots (:meth:`PrefixCache._check_weights`: raises if they differ),
    taken once, when first called: handed to a decoder as its ``weights``, it is called when the
    rung wants it, after launching a captured replay where it has one (see
    :class:`labkit.decode.Decoder`), so that the walk of the model (~0.2 ms of host on
    Qwen3.5-0.8B) and the fingerprint's read overlap the device's work. On a GPU the read is ordered
    after an event recorded here, before anything of this call is launched: it sees every write to
    the weights queued before the call, and does not wait for the replay (``values_later(after=)``).
    A refusal empties ``cache`` (the decoder's, if given) before it raises: whatever the rung or the
    look-up had written there is no state to decode from."""

    __slots__ = ("prefix", "model", "cache", "given", "after", "key")

    def __init__(self, prefix: "PrefixCache", model: HybridLM, cache: HybridCache | None = None,
                 given: WeightsKey | None = None) -> None:
        self.prefix, self.model, self.cache, self.given, self.key = prefix, model, cache, given, None
        self.after = None
        if model.device.type == "cuda" and (given is None or given.fingerprint is None):
            self.after = torch.cuda.Event()
            self.after.record(torch.cuda.current_stream(model.device))

    def __call__(self) -> WeightsKey:
        if self.key is None:
            try:
                key = values_later(self.model, self.given, after=self.after)()
                self.prefix._check_weights(self.model, key)
            except BaseException:
                if self.cache is not None:
                    self.cache.reset(keys_values=False)
                raise
            self.key = key
        return self.key


@dataclass
class PrefixPrefill:
    logits: torch.Tensor  # [B, vocab] after each row's last prompt token
    restored: int  # tokens restored from snapshots, the same for every row (the batch's hit)
    row_hits: list[int]  # tokens each row had cached (before taking the batch's shortest)


def _exchange_rate(device: torch.device, given: Any) -> float:
    """The FLOPs-per-byte exchange rate of admission "paying": ``given``, else the device kind's."""
    if given is not None:
        if not is_real(given) or not given > 0 or math.isinf(given):
            raise ValueError(f"exchange_rate must be a positive number of FLOPs per byte, got {given!r}")
        return float(given)
    if device.type not in EXCHANGE_RATES:
        raise ValueError(
            f"admission 'paying' has no FLOPs-per-byte exchange rate for device kind {device.type!r} (known: "
            f"{', '.join(EXCHANGE_RATES)}): measure one (labkit.bench.cache.measure_exchange_rate) and pass "
            "exchange_rate="
        )
    return EXCHANGE_RATES[device.type]


def _check_arguments(model: Any, block_size: Any, budget_bytes: Any) -> None:
    """PrefixCache's model, block size and budget, refused by name before anything is made."""
    if not isinstance(model, HybridLM):
        raise TypeError(f"PrefixCache needs a labkit HybridLM (labkit.build or labkit.load), got {type(model).__name__}")
    if not is_int(block_size):
        raise TypeError(f"block_size must be an int (tokens per snapshot), got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    # a NaN budget compares false with everything: nothing would ever be evicted
    if not is_real(budget_bytes) or math.isnan(budget_bytes):
        raise TypeError(f"budget_bytes must be a number of bytes (math.inf: no bound), got {budget_bytes!r}")


class PrefixCache:
    """Snapshots of a model's per-sequence state at every ``block_size`` tokens, up to ``budget_bytes``.

    Use: ``out = prefix.prefill(decoder, input_ids)`` in place of ``decoder.prefill(input_ids)``; the
    decoder's cache is reset, refilled from the longest cached prefix, and the rest of the prompt is
    prefilled; then decode with ``decoder.step`` as usual. Any rung's decoder works (a
    :class:`labkit.decode.Decoder`: what it lends is declared there).

    Snapshots live in slots of two pools (:mod:`labkit.prefix_store`): a KV slot per node and a state
    slot per node with states, allocated as first needed and reused after evictions; the pools never
    hold more than ``budget_bytes`` together (``reserved_bytes``; :meth:`clear` frees it all). A
    call's new snapshots are stored by one span table, and a hit is restored by another
    (:mod:`labkit.ops.copy_spans`: one launch each on a GPU), listed once per (cache, nodes restored)
    in a :class:`_RestorePlan` and reused by later hits on the same path; a plan is dropped when a
    node on its path is evicted, and by :meth:`clear`.
    """

    PLANS_PER_CACHE = 64  # restore plans kept per cache (least recently used dropped)

    def __init__(self, model: HybridLM, block_size: int, budget_bytes: int, policy: str = "lru",
                 admission: str = "every", *, exchange_rate: float | None = None,
                 warm_up: Decoder | None = None) -> None:
        _check_arguments(model, block_size, budget_bytes)
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; available: {', '.join(POLICIES)}")
        if admission not in ADMISSIONS:
            raise ValueError(f"unknown admission {admission!r}; available: {', '.join(ADMISSIONS)}")
        self.admission = admission
        self.exchange_rate = _exchange_rate(model.device, exchange_rate) if admission == "paying" else exchange_rate
        self.cfg, self.dtype, self.device = model.cfg, model.dtype, model.device
        self._weights = weights_key(model)
        # every model object accepted, with the key it was accepted at (the first: the one given here)
        self._accepted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary({model: self._weights})
        self.block_size, self.budget_bytes, self.policy = block_size, budget_bytes, policy
        self.flops_per_token = 2 * model.num_parameters()
        self._layout = SnapshotLayout(self.cfg, self.dtype, block_size)
        self._states_bytes = self._layout.state_bytes
        self.snapshot_bytes = self._layout.kv_bytes + self._states_bytes  # one block's KV and the states
        if budget_bytes < self.snapshot_bytes:
            raise ValueError(
                f"budget_bytes={budget_bytes} is smaller than one snapshot ({self.snapshot_bytes} bytes for "
                f"block_size={block_size} of {self.cfg.name} in {self.dtype}): nothing could be cached"
            )
        self.root = _Node(parent=None, block=b"", depth=0, layout=self._layout)
        self._kv_pool = SlotPool(self._layout.kv_bytes, self.device)
        self._state_pool = SlotPool(self._states_bytes, self.device)
        self.nbytes = 0
        self.evictions = 0
        # the eviction candidates of the prefill call in progress (see _make_room): (its pinned set,
        # a heap of (score, order, leaf), the next order number); None between calls
        self._victims: tuple[set[int], list, Any] | None = None
        self._clock = 0
        # restore plans: a table per cache, in the cache's attachments under this key (its token
        # object, held by the key, is unique to this PrefixCache); the tables are held weakly here
        self._plans_key = ("labkit.PrefixCache.plans", object())
        self._plan_tables: weakref.WeakSet[_PlanTable] = weakref.WeakSet()
        weakref.finalize(self, _clear_tables, self._plan_tables)
        self.last_copies: _Store | None = None  # the latest prefill's snapshot copies (their launches)
        self.warm_up_s: float | None = None
        if warm_up is not None:
            self.warm_up(warm_up)

    @property
    def paying_depth(self) -> int:
        """Admission "paying": the shallowest boundary (in blocks) whose states are stored, the first
        where the FLOPs a hit there saves (``flops_per_token * depth * block_size``) exceed the states'
        bytes times the device's exchange rate (:data:`EXCHANGE_RATES`)."""
        cost = self.exchange_rate * self._states_bytes
        return max(1, math.floor(cost / (self.flops_per_token * self.block_size)) + 1)

    @torch.no_grad()
    def warm_up(self, decoder: Decoder) -> float:
        """Pay the first call's costs now (kernels compile, the miss's and the hit's paths run once;
        a ``fused+graph`` decoder captures a shape's graphs when the shape comes back, so those are
        paid by the traffic that repeats them) on a prompt of its own, then
        forget it: the trie is empty again and the decoder's cache reset. Returns (and keeps as
        ``warm_up_s``) the seconds it took. The decoder must run this cache's model (else the
        error :meth:`prefill` gives)."""
        room = getattr(getattr(decoder, "cache", None), "max_len", 1)
        ids = (torch.arange(min(2 * self.block_size + 1, room), dtype=torch.int64) % self.cfg.vocab_size)[None]
        self._check(decoder, ids)  # a decoder of another model is refused before anything runs
        _WeightsCheck(self, decoder.model)()
        t0 = time.perf_counter()
        for _ in range(2):  # a miss that stores snapshots, then a hit that restores them
            self.prefill(decoder, ids.to(self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.clear()
        decoder.cache.reset()
        self.warm_up_s = time.perf_counter() - t0
        return self.warm_up_s

    @property
    def reserved_bytes(self) -> int:
        """Device memory the snapshot pools hold (``nbytes`` of it in use; the rest free slots)."""
        return self._kv_pool.reserved + self._state_pool.reserved

    # -- look-up -------------------------------------------------------------------------------------
    def _path(self, keys: list[bytes], max_blocks: int) -> list[_Node]:
        """The cached nodes along a prompt's block keys (:func:`_block_keys`), at most ``max_blocks``
        deep, root excluded: one dict look-up per block."""
        node, path = self.root, []
        for key in keys[:max_blocks]:
            node = node.children.get(key)
            if node is None:
                break
            path.append(node)
        return path

    def _usable_blocks(self, length: int) -> int:
        return (length - 1) // self.block_size  # the last token always runs: its logits are the output

    @staticmethod
    def _stated_depths(path: list[_Node]) -> set[int]:
        """Depths (in blocks) along a path where a restore can stop: the nodes that hold states."""
        return {n.depth for n in path if n.has_states}

    def lookup(self, tokens: torch.Tensor | list[int]) -> int:
        """How many tokens of a one-sequence prompt ``prefill`` would restore (a multiple of block_size)."""
        host = tokens.detach().cpu() if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens), dtype=torch.int64)
        keys = _block_keys(host.reshape(1, -1), self.block_size)[0]
        return max(self._stated_depths(self._path(keys, self._usable_blocks(host.numel()))), default=0) * self.block_size

    def __len__(self) -> int:
        """Nodes held: snapshots (with admission "ends", also blocks of KV alone)."""
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    # -- checks --------------------------------------------------------------------------------------
    def _check(self, decoder: Decoder, input_ids: torch.Tensor,
               host_ids: torch.Tensor | None = None) -> tuple[HybridLM, HybridCache, list]:
        """The model and cache and the block keys of the prompt's rows, once the decoder, its cache
        and the prompt are found to fit this PrefixCache (else an error); the weights are checked
        apart (:class:`_WeightsCheck`). ``host_ids``: the prompt on the host, its range already
        checked (:meth:`prefill`)."""
        if not isinstance(decoder, Decoder):
            raise TypeError(f"PrefixCache.prefill needs a labkit.decode.Decoder (a rung's decoder, e.g. from "
                            f"labkit.decode.make_decoder), got a {type(decoder).__name__}")
        model, cache = decoder.model, decoder.cache
        if not isinstance(model, HybridLM) or not isinstance(cache, HybridCache):
            raise TypeError("PrefixCache.prefill needs a decoder whose .model is a HybridLM and .cache a HybridCache")
        if model.cfg != self.cfg:
            raise ValueError(
                f"this PrefixCache holds snapshots of {self.cfg.name!r}; the decoder runs {model.cfg.name!r} "
                "(another model configuration): make a PrefixCache for that model"
            )
        if model.dtype != self.dtype or model.device != self.device:
            raise ValueError(
                f"this PrefixCache holds {self.dtype} snapshots on {self.device}; the model is {model.dtype} "
                f"on {model.device}: make a PrefixCache for that model"
            )
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be a non-empty [batch, tokens] tensor, got {getattr(input_ids, 'shape', input_ids)!r}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32, got {input_ids.dtype}")
        if host_ids is not None:
            if (not isinstance(host_ids, torch.Tensor) or host_ids.device.type != "cpu"
                    or host_ids.shape != input_ids.shape or host_ids.dtype != input_ids.dtype):
                raise ValueError(f"host_ids must be input_ids copied to the CPU: {input_ids.dtype}, of shape "
                                 f"{tuple(input_ids.shape)}")
            host = host_ids
        else:
            # one copy to the host (the look-up reads the tokens there anyway), one device sync; the
            # range is checked here: a one-token tail is not checked by the model, and a longer one is
            # not checked again (prefill_continuation(ids_checked=True))
            host = input_ids.cpu()
            lo, hi = map(int, torch.aminmax(host))  # one reduction for both ends
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got [{lo}, {hi}]")
        if cache.cfg != self.cfg or cache.dtype != self.dtype:
            raise ValueError(
                f"the decoder's cache was made for {cache.cfg.name!r} in {cache.dtype}; this PrefixCache holds "
                f"{self.cfg.name!r} snapshots in {self.dtype}: use a cache made by the model"
            )
        B, T = input_ids.shape
        if B != cache.batch_size:
            raise ValueError(f"input batch {B} does not match the cache's batch {cache.batch_size}")
        if T > cache.max_len:  # checked here: the cache is reset before the decoder could check it
            raise CacheFullError(
                f"the prompt has {T} tokens but the decoder's cache holds max_len={cache.max_len}; "
                "make a larger cache with model.new_cache(batch_size, max_len=...)"
            )
        return model, cache, _block_keys(host, self.block_size)

    def _check_weights(self, model: HybridLM, key: WeightsKey) -> None:
        """Refuse a model whose weights are not the ones the snapshots were made from: a model object
        seen before must hold the key it was accepted at; a new one must hold the same values (names,
        shapes, dtypes, fingerprint) as the model this cache was made for, and is then bound too."""
        if key == self._weights:
            return
        seen = self._accepted.get(model)
        if seen is not None and key == seen:
            return
        if seen is not None:
            raise ValueError(
                "the model's weights changed (replaced, moved or modified in place) since this PrefixCache "
                "was made: its snapshots no longer describe this model; make a new PrefixCache"
            )
        if not key.same_values(self._weights):
            raise ValueError(
                "this model's weights are not the ones this PrefixCache's snapshots were made from (another "
                "model of the same configuration, or edited): make a PrefixCache for this model"
            )
        self._accepted[model] = key

    # -- prefill -------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, decoder: Decoder, input_ids: torch.Tensor, *, weights: WeightsKey | None = None,
                host_ids: torch.Tensor | None = None) -> PrefixPrefill:
        """Reset ``decoder.cache``, restore the batch's longest cached prefix, prefill the rest, and
        return the last-token logits. Raises (ValueError, CacheFullError) before the cache or the
        snapshots change if the decoder's model is not this cache's, or the prompt does not fit; if
        the model's weights are not the snapshots' (:meth:`_check_weights`), before the snapshots
        change, leaving the decoder's cache reset (empty).

        The weights are checked the way the decoder wants them (:class:`_WeightsCheck`): a rung that
        replays a captured prefill (``fused+graph``: a steady hit's restore and tail, a miss of a
        shape seen before) launches it first and checks while the device runs it, dropping the
        replay if the check fails; any other checks before it runs anything. ``weights``: the model's
        :func:`~labkit.weights.weights_key` if the caller has just taken it (with its fingerprint,
        nothing is read here). ``host_ids``: ``input_ids`` copied to the host with their range checked
        (the look-up hashes the tokens there: without them, a copy and a device sync here)."""
        if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1:
            input_ids = input_ids[None]
        model, cache, keys = self._check(decoder, input_ids, host_ids)
        key = _WeightsCheck(self, model, cache, weights)
        input_ids = input_ids.to(model.device)
        B, T = input_ids.shape
        bs = self.block_size
        usable = self._usable_blocks(T)
        paths = [self._path(row, usable) for row in keys]
        stated = [self._stated_depths(p) for p in paths]
        row_hits = [max(d, default=0) * bs for d in stated]
        hit_blocks = max(set.intersection(*stated), default=0)  # a depth where every row can stop
        self._clock += 1  # a new call: the recency scores of the candidates change
        self._victims = None
        for path in paths:
            for node in path:
                node.last_used = self._clock

        start = hit_blocks * bs
        restore = None
        if hit_blocks:  # the restore runs with the rest of the prompt (in its graph, where it is captured)
            restore = _Restore(cache, self._plan(cache, [p[:hit_blocks] for p in paths]), start)
            restore.stage()
            cache.reset(zero=False)
            cache.advance_host(start)  # the device lengths are set by the restore
        else:  # a miss: the prefill reads the states from zero and writes its own keys and values
            cache.reset(keys_values=False)
        # current[r]: the node of row r at the boundary just passed (None: not stored, so no deeper ones)
        current: list[_Node | None] = [p[hit_blocks - 1] if hit_blocks else self.root for p in paths]
        pinned = {id(n) for p in paths for n in p}
        # which new boundaries get states: all ("every"), or (Marconi's admission, "ends") only the
        # deepest one of this prompt and its branch point (the deepest one already in the trie, where
        # the next prompt that shares this prefix is likely to leave it)
        count = (T - start) // bs
        if self.admission == "every":
            admit = [set(range(count)) for _ in paths]
        elif self.admission == "paying":  # boundaries deep enough that a hit there pays for the copies
            admit = [set(range(max(0, self.paying_depth - hit_blocks - 1), count)) for _ in paths]
        else:
            admit = [{count - 1, len(p) - hit_blocks - 1} - {-1} for p in paths]
        if start and T - start < bs:
            # no boundary to read: replayable (fused+graph); the ids were checked here already. The
            # key is taken once, when the rung asks: called again it only returns it (or takes it,
            # for a rung that never asked)
            logits = decoder.prefill_continuation(input_ids[:, start:], ids_checked=True, weights=key, before=restore)
            key()
            return PrefixPrefill(logits=logits, restored=start, row_hits=row_hits)
        store = self.last_copies = _Store(CacheSpans.of(cache, self._layout))
        if not start and not count:  # nothing to read or restore: the decoder's own prefill (replayable)
            logits = decoder.prefill_checked(input_ids, ids_checked=True, weights=key)
            key()
            return PrefixPrefill(logits=logits, restored=0, row_hits=row_hits)
        # the delta rule's state checkpoints at the block boundaries, where the decoder's rule takes them
        multiple = decoder.checkpoint_multiple
        every = bs if count and multiple and bs % multiple == 0 else None
        base = None
        # the rung may run the rest as its own prefill, the restore first (fused+graph: one replay of both)
        read = decoder.prefill_reading(input_ids[:, start:], every,
                                       lambda cores, taken: _BoundaryStates(cores, taken, cache, bs, count),
                                       ids_checked=True, weights=key, before=restore)
        if read is not None:
            logits, boundaries = read
            key()
        else:
            key()  # before anything runs eagerly
            if restore is not None:
                restore()
            checkpoints = [] if every else None
            base = decoder.prefill_cores(every, checkpoints) if every else decoder.prefill_cores()
            if base is None:  # it lends none: its own prefill, block by block
                logits = self._prefill_block_by_block(decoder, cache, input_ids, keys, start, current, pinned, admit,
                                                      store, key)
            else:  # one prefill of the rest, the states at its block boundaries read while it runs
                boundaries = _BoundaryStates(base, checkpoints, cache, bs, count)
                rest = input_ids[:, start:]
                model._check_input(rest, cache, check_ids=False)  # the ids' range was checked on the host
                logits = model.forward_checked(rest, cache, last_only=True, cores=boundaries.cores)[:, -1]
        if read is not None or base is not None:
            sources = boundaries.sources(self._layout)
            for j in range(boundaries.count):
                at = start + j * bs
                for r in range(B):
                    current[r] = self._snapshot(r, current[r], keys[r][at // bs], pinned,
                                                r * boundaries.count + j if j in admit[r] else None, store)
            store.run(sources)
        return PrefixPrefill(logits=logits, restored=start, row_hits=row_hits)

    def _prefill_block_by_block(self, decoder: Decoder, cache: HybridCache, input_ids: torch.Tensor, keys: list,
                                pos: int, current: list, pinned: set[int], admit: list[set[int]],
                                store: _Store, weights: "_WeightsCheck") -> torch.Tensor:
        """For a decoder that cannot lend its cores: its own prefill, one block at a time, each
        boundary's state read from the cache after the block (and copied before the next block moves it)."""
        bs, (B, T) = self.block_size, input_ids.shape
        first = pos
        # the cache's own state rows as the boundary states (one boundary per call of a block)
        sources = state_sources(self._layout, {i: s[:, None] for i, s in cache.conv_states.items()},
                                {i: s[:, None] for i, s in cache.recurrent_states.items()})
        while pos < T:
            end = min(pos + bs, T)
            logits = decoder.prefill_checked(input_ids[:, pos:end], ids_checked=True, weights=weights)
            if end - pos == bs:
                for r in range(B):
                    states = r if (pos - first) // bs in admit[r] else None
                    current[r] = self._snapshot(r, current[r], keys[r][pos // bs], pinned, states, store)
                store.run(sources)
            pos = end
        return logits

    def _plan(self, cache: HybridCache, paths: list[list[_Node]]) -> _RestorePlan:
        """The restore plan of ``paths`` (one per row, of equal length) into ``cache``: reused if made
        before (its nodes are alive: an eviction drops the plans through the node), else made."""
        nodes = [n for p in paths for n in p]
        table = cache.attachments.get(self._plans_key)
        if table is None:
            table = cache.attachments[self._plans_key] = _PlanTable()
            self._plan_tables.add(table)
        key, plans = tuple(map(id, nodes)), table.plans
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
        else:
            plan = plans[key] = _RestorePlan(tuple(nodes), self._restore_spans(cache, paths))
            while len(plans) > self.PLANS_PER_CACHE:
                plans.popitem(last=False)
        plan.uses += 1
        return plan

    def _restore_spans(self, cache: HybridCache, paths: list[list[_Node]]) -> Spans:
        """Every node's KV block to its positions in its row, and the deepest node's states into the
        row's state buffers: the spans of one restore (addresses from the cache's buffers and the
        nodes' slots, with numpy: no tensor is made)."""
        spans = CacheSpans.of(cache, self._layout)
        depth = len(paths[0])
        rows = np.repeat(np.arange(len(paths), dtype=np.int64), depth)
        depths = np.tile(np.arange(depth, dtype=np.int64), len(paths))
        kv_slots = np.array([n.kv_slot.address for p in paths for n in p], dtype=np.int64)
        state_slots = np.array([p[-1].state_slot.address for p in paths], dtype=np.int64)
        return Spans.join([spans.kv(rows, depths, kv_slots, to_slot=False),
                           spans.states_to_cache(np.arange(len(paths), dtype=np.int64), state_slots)], self.device)

    def _drop_plans(self, node: _Node | None = None) -> None:
        """Forget the restore plans through ``node`` (all of them: None), in every cache's table."""
        for table in list(self._plan_tables):
            if node is None:
                table.plans.clear()
            else:
                for key in [k for k, plan in table.plans.items() if any(n is node for n in plan.nodes)]:
                    del table.plans[key]

    # -- storing and eviction ------------------------------------------------------------------------
    def _snapshot(self, r: int, parent: _Node | None, block: bytes, pinned: set[int], states: int | None,
                  store: _Store) -> _Node | None:
        """The node for row ``r`` after ``block`` below ``parent``: found, or made now for the cache's
        KV of that block and, with ``states`` (the boundary's index in the call's state sources), the
        row's states at the boundary (a node found without states gets them). What it stores is
        queued on ``store``: the caller runs it before the sources change."""
        if parent is None:
            return None
        node = parent.children.get(block)
        if node is not None and states is not None and not node.has_states:
            if self._make_room(pinned | {id(node)}, self._states_bytes):
                node.state_slot = self._take(self._state_pool, self._kv_pool)
                store.states(states, node.state_slot)
                self.nbytes += self._states_bytes
        if node is None:
            with_states = states is not None
            if not self._make_room(pinned, self.snapshot_bytes if with_states else self.snapshot_bytes - self._states_bytes):
                return None
            node = _Node(parent=parent, block=block, depth=parent.depth + 1, layout=self._layout,
                         kv_slot=self._take(self._kv_pool, self._state_pool))
            store.kv(r, node.depth - 1, node.kv_slot)
            if with_states:
                node.state_slot = self._take(self._state_pool, self._kv_pool)
                store.states(states, node.state_slot)
            parent.children[block] = node
            self.nbytes += node.nbytes
        node.last_used = self._clock
        pinned.add(id(node))
        return node

    def _take(self, pool: SlotPool, other: SlotPool) -> Slot:
        """A slot of ``pool`` for bytes ``_make_room`` has just made room for. A new one would take
        the pools past the budget only while the other pool keeps free slots: those are freed first
        (the bytes in use are within the budget, so that is always enough)."""
        if not pool.free and self.reserved_bytes + pool.slot_bytes > self.budget_bytes:
            other.release_free()
        return pool.take()

    def _leaves(self, pinned: set[int]) -> list[_Node]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif id(node) not in pinned:
                leaves.append(node)
        return leaves

    def _eviction_score(self, node: _Node) -> tuple:
        """Lowest goes first. A leaf without states saves nothing and goes before any other. lru: last
        use. flops: FLOPs a hit on it saves per byte it holds, then last use."""
        if self.policy == "lru":
            return (node.has_states, node.last_used)
        saved = self.flops_per_token * node.depth * self.block_size
        return (node.has_states, saved / node.nbytes, node.last_used)

    def _make_room(self, pinned: set[int], need: int) -> bool:
        """Evict unpinned leaves, lowest :meth:`_eviction_score` first, until ``need`` more bytes fit
        the budget; False if they cannot.

        The candidates are walked once per prefill call (per ``pinned`` set, which a call only grows),
        into a heap kept through the call: a node's score does not change within a call, a node
        pinned since is skipped, and a parent left without children joins the heap. Walking the trie
        for every eviction instead cost a miss at the budget one walk of every stored node per block
        it stores (its own snapshots evict one node each)."""
        if self.nbytes + need <= self.budget_bytes:
            return True
        if self._victims is None or self._victims[0] is not pinned:
            heap = [(self._eviction_score(n), i, n) for i, n in enumerate(self._leaves(pinned))]
            heapq.heapify(heap)
            self._victims = (pinned, heap, itertools.count(len(heap)))
        _, heap, order = self._victims
        while self.nbytes + need > self.budget_bytes:
            while heap and id(heap[0][2]) in pinned:  # pinned after the heap was made: stays pinned
                heapq.heappop(heap)
            if not heap:
                return False
            victim = heapq.heappop(heap)[2]
            parent = victim.parent
            del parent.children[victim.block]
            self._drop_plans(victim)
            self.nbytes -= victim.nbytes
            self._kv_pool.give(victim.kv_slot)
            self._state_pool.give(victim.state_slot)
            self.evictions += 1
            if parent is not self.root and not parent.children and id(parent) not in pinned:
                heapq.heappush(heap, (self._eviction_score(parent), next(order), parent))
        return True

    def clear(self) -> None:
        """Drop every snapshot and the restore plans made from them, and free the pools' memory."""
        self.root.children.clear()
        self._victims = None
        self._drop_plans()
        self._kv_pool.clear()
        self._state_pool.clear()
        self.nbytes = 0

    def __repr__(self) -> str:
        return (
            f"PrefixCache({self.cfg.name}, {self.dtype}, block_size={self.block_size}, policy={self.policy}, "
            f"snapshots={len(self)}, {self.nbytes}/{self.budget_bytes} bytes)"
        )


class _BoundaryStates:
    """The conv windows and recurrent states at the block boundaries of one prefill call, read while it
    runs: ``cores`` wrap the decoder's own prefill cores ``base`` (:meth:`Decoder.prefill_cores`), whose
    delta rule appends its state checkpoints to ``checkpoints`` (None: it takes none).

    The model calls ``short_conv`` or ``gdn_inputs`` once per conv or GDN layer and the delta rule
    once per GDN layer, in layer order, so the n-th call belongs to the n-th such layer of the cache.
    Both keep the decoder's own implementation (fused kernels stay fused): a conv window after ``e``
    tokens is rows ``e .. e+K-2`` of (old window, the conv's inputs), and the inputs are in the
    projection they are handed: Gated DeltaNet's raw q|k|v columns, LFM2's B * x (one product over
    the K-1 rows before each boundary, rounded to the projection's dtype as the conv rounds it).
    Where a block is at least K-1 tokens the windows are those rows alone, one gather per layer;
    a shorter block also reaches into the old window, read before the core updates it.
    A recurrent state comes from the delta rule's checkpoints when the decoder's rule takes them and
    the block is a multiple of its chunk (one walk, no re-run); otherwise the delta rule is called
    piece by piece between boundaries (the same function, rounded as a block-by-block prefill
    would be) and the state is read between the pieces.
    """

    def __init__(self, base: MixerCores, checkpoints: list[torch.Tensor] | None, cache: HybridCache, every: int,
                 count: int) -> None:
        self.every, self.count = every, count
        self._conv_layers, self._gdn_layers = list(cache.conv_states), list(cache.recurrent_states)
        self._conv_calls = self._gdn_calls = 0
        self.conv: dict[int, torch.Tensor] = {}  # layer -> [B, count, K-1, C]
        self.recurrent: dict[int, torch.Tensor] = {}  # layer -> [B, count, Hv, K, V] float32
        self.from_kernel = checkpoints is not None
        self._checkpoints = checkpoints
        self.base = base
        self.cores = replace(base, delta_rule=self._delta_rule, short_conv=self._short_conv,
                             gdn_inputs=self._gdn_inputs)

    def begin(self) -> None:
        """Before each forward through ``cores`` (a captured one runs it for its warm-up and again for
        its capture): the calls are counted from the first layer again, and the checkpoints of an
        earlier forward are dropped."""
        self._conv_calls = self._gdn_calls = 0
        if self._checkpoints is not None:
            self._checkpoints.clear()

    def _ends(self) -> list[int]:
        return [self.every * (j + 1) for j in range(self.count)]

    def _windows(self, inputs, proj: torch.Tensor, state: torch.Tensor, width: int) -> torch.Tensor:
        """[B, count, width, C] windows at the boundaries, in ``state``'s dtype, from the projection
        ``proj`` [B, T, P] whose rows ``inputs`` maps to the conv's inputs [..., C]."""
        bs, n = self.every, self.count
        if bs >= width:  # the rows before each boundary, all inside the call: a strided view, one copy
            rows = proj[:, : n * bs].reshape(proj.shape[0], n, bs, proj.shape[-1])[:, :, bs - width:]
            return inputs(rows).to(state.dtype).contiguous()
        u = torch.cat((state.to(proj.dtype), inputs(proj)), dim=1)
        return torch.stack([u[:, e : e + width] for e in self._ends()], dim=1).to(state.dtype)

    def _next_conv_layer(self) -> int:
        layer = self._conv_layers[self._conv_calls]
        self._conv_calls += 1
        return layer

    def _short_conv(self, proj: torch.Tensor, state: torch.Tensor | None, weight: torch.Tensor, **kwargs):
        layer = self._next_conv_layer()
        if self.count:
            H = proj.shape[-1] // 3
            if state is None:
                state = proj.new_zeros(proj.shape[0], weight.shape[1] - 1, H)
            self.conv[layer] = self._windows(short_conv_input, proj, state, weight.shape[1] - 1)
        return self.base.short_conv(proj, state, weight, **kwargs)

    def _gdn_inputs(self, proj: torch.Tensor, conv_state: torch.Tensor | None, conv_weight: torch.Tensor, *args,
                    **kwargs):
        layer = self._next_conv_layer()
        if self.count:
            C = args[-1].conv_dim if args else kwargs["dims"].conv_dim
            if conv_state is None:
                conv_state = proj.new_zeros(proj.shape[0], conv_weight.shape[1] - 1, C)
            # the raw q|k|v columns: gdn_inputs_ref's conv input
            self.conv[layer] = self._windows(lambda x: x[..., :C], proj, conv_state, conv_weight.shape[1] - 1)
        return self.base.gdn_inputs(proj, conv_state, conv_weight, *args, **kwargs)

    def _delta_rule(self, q, k, v, g, beta, state=None):
        layer = self._gdn_layers[self._gdn_calls]
        self._gdn_calls += 1
        if not self.count:
            return self.base.delta_rule(q, k, v, g, beta, state)
        if self.from_kernel:
            out = self.base.delta_rule(q, k, v, g, beta, state)
            self.recurrent[layer] = self._checkpoints[-1]
            return out
        outs, states, a = [], [], 0
        cuts = self._ends() + ([q.shape[1]] if self._ends()[-1] < q.shape[1] else [])
        for b in cuts:
            o, state = self.base.delta_rule(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], state)
            outs.append(o)
            if len(states) < self.count:
                states.append(state.clone())  # a copy: a fused rule updates the state in place
            a = b
        self.recurrent[layer] = torch.stack(states, dim=1)
        return torch.cat(outs, dim=1), state

    def sources(self, layout: SnapshotLayout) -> tuple:
        """The boundary states this prefill read, as :func:`labkit.prefix_store.state_sources` of
        ``layout``: boundary ``j`` of row ``r`` is index ``r * count + j``."""
        if self._conv_calls != len(self._conv_layers) or self._gdn_calls != len(self._gdn_layers) \
                or len(self.conv) != len(self._conv_layers):
            raise RuntimeError("the prefill did not call every layer's conv and delta rule once: no snapshot taken")
        return state_sources(layout, self.conv, self.recurrent)
