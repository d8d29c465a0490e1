"""The fused prefill: the model's own forward with faster cores, and its CUDA graphs.

Prefill runs the model's own forward (projections through cuBLAS, the structure of every mixer
from ``labkit.ops.mixers``) with its inner cores swapped for faster implementations of the same
functions (:func:`prefill_cores`): the chunked Triton delta rule, which reads the cache's recurrent
state and writes the final one back in place; SDPA's causal form of attention for prompts that
start every sequence, and its bottom-right causal form over the keys in use for prompts that
continue a cache (every row at one length); and one Triton kernel for each element-wise chain
between the GEMMs (:mod:`labkit.ops.prefill_fusions`: the RMSNorms, the GDN conv + gates + L2 norm
and its gated output norm, LFM2's short conv, the MLP's SwiGLU, attention's q/k norm + RoPE with
the KV cache write, and its output gate), the convs writing the cache's new windows themselves, and
the residual adds inside the output projections' GEMMs. It fills the same cache the fused step
reads.

Under ``"fused+graph"`` the prefill of a fresh cache is also captured, one CUDA graph per prompt
length (the last ``graphs`` lengths kept), once a length comes back (``capture_at``; both from
``tuning.settings("fused_prefill")``): it pays an eager warm-up and the capture once, later prompts of that
length replay it, without the host's launch overhead. A prompt that continues cached sequences
(a prompt's tail after a restored prefix, :meth:`FusedPrefill.prefill_continuation`) is captured
per (cached length, tail length) once that shape comes back, and replayed, and so is a miss of
:class:`labkit.PrefixCache` (:meth:`FusedPrefill.prefill_reading`: the prefill with its block
boundaries read, per prompt shape).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Mapping

import torch

from . import graphs
from .protocol import taken
from .. import tuning
from ..cache import HybridCache
from ..ops.mixers import DeltaRule, MixerCores, attend_causal, attend_continuing, attend_ref, store_kv_ref, store_kv_slice

# The fused prefill's fast paths past the kernels themselves, each the same function as the
# reference it replaces (on; a benchmark turns one off to measure what it saves, see
# ``python -m labkit.bench.prefill_profile --ablate``):
# - "project_residual": the residual adds inside the output projections' GEMMs (one addmm_ each);
# - "store_kv_slice": the KV cache written by two slice copies where every row starts at one length;
# - "output_gate": Qwen3.5 attention's o * sigmoid(gate) in one kernel;
# - "conv_window_in_place": the conv kernels write the cache's new conv windows themselves;
# - "attention_inputs": attention's q/k norm + RoPE and the KV cache write in one kernel (else two
#   norm + RoPE kernels and the cache write by "store_kv_slice" or the indexed reference);
# - "gate_up_swiglu": the MLP's gate|up projection with SwiGLU in its epilogue: a few rows (a
#   prefix-cache hit's tail) by one skinny GEMM, a prompt by a tiled GEMM where the GPU's
#   prompt_gate_up settings turn it on (else cuBLAS, then the SwiGLU kernel);
# - "tail_attention": attention of up to 64 new tokens after a cache's prefix (a hit's tail) by the
#   key-split Triton kernels of labkit.ops.tail_attention (else SDPA's bottom-right causal form). Off:
#   slower than SDPA's flash kernels for Qwen3.5-0.8B (31.95 against 26.98 us a layer at 64 tokens
#   after 4,096, H100), level for LFM2-350M (19.19 against 19.07; data/bench/nvidia-h100-80gb-hbm3/tail-ops.json).
FAST_PATHS = {"project_residual": True, "store_kv_slice": True, "output_gate": True, "conv_window_in_place": True,
              "attention_inputs": True, "gate_up_swiglu": True, "tail_attention": False}


def chunked_delta_rule(kernel: Callable[..., tuple], dtype: torch.dtype, checkpoint_every: int | None = None,
                       checkpoints: list[torch.Tensor] | None = None,
                       settings: Mapping[str, Any] | None = None) -> DeltaRule:
    """``kernel`` (:func:`labkit.ops.chunk_delta_rule.chunk_delta_rule`) behind the reference delta
    rule's signature: q, k, v enter in the model's ``dtype`` (the reference hands them over in
    float32; bf16 operands are what the kernel's tensor-core products take) and the state is
    updated in place and returned, so the cache's recurrent state is read and written once.

    With ``checkpoint_every`` (a multiple of the kernel's 64-token chunk), each call also appends to
    ``checkpoints`` the states after every ``checkpoint_every`` of its tokens, [B, n, Hv, K, V]
    float32 (n = T // checkpoint_every), written by the same walk (no second pass).

    ``settings``: the kernel's launch settings (``tuning.settings("chunk_delta_rule", device)``);
    None leaves the kernel's own defaults."""
    settings = dict(settings or {})

    def delta_rule(q, k, v, g, beta, state=None):
        q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
        extra = {}
        if checkpoint_every is not None:
            B, T = q.shape[:2]
            shape = (B * (T // checkpoint_every), v.shape[2], q.shape[3], v.shape[3])
            buf = torch.empty(shape, dtype=torch.float32, device=q.device)
            extra = dict(checkpoints=buf, checkpoint_every=checkpoint_every)
            checkpoints.append(buf.view(B, T // checkpoint_every, *shape[1:]))
        return kernel(q, k, v, g.contiguous(), beta.contiguous(), state, final_state=state, **extra, **settings)

    return delta_rule


def prefill_cores(delta_rule: DeltaRule, cache: HybridCache, fusions: Any = None) -> MixerCores:
    """The cores of the fused prefill into ``cache``, as it stands now (build them right before the
    prefill they serve). Attention takes SDPA's causal form (flash on a GPU) when every sequence
    starts at position 0, so that the new tokens are all the keys; when every sequence continues the
    same number of cached tokens (a prompt's tail after a restored prefix), the bottom-right causal
    form over the keys in use (:func:`labkit.ops.mixers.attend_continuing`); otherwise the explicit
    mask over the whole buffer (:func:`labkit.ops.mixers.attend_ref`). All three compute the same
    function: this picks a form, not an approximation. With
    ``fusions`` (:mod:`labkit.ops.prefill_fusions`), the element-wise chains between the GEMMs
    (norms, the convs, the GDN gates and output norm, SwiGLU, the output gate) are one kernel
    each, and so are attention's q/k norm + RoPE with the KV cache write (a token's slot is its
    position, whatever the rows' lengths); the convs update the cache's windows in place, and the
    residual adds are folded into the output projections' GEMMs; the MLP gate|up of up to 64 rows
    (a hit's tail) is one skinny GEMM with SwiGLU in the epilogue (and with
    ``FAST_PATHS["tail_attention"]`` such a tail's attention comes from
    :func:`labkit.ops.tail_attention.attend_short_tail`). Without the fusions, when every
    row starts at one length, the KV cache is written by slice copies
    (:func:`labkit.ops.mixers.store_kv_slice`). :data:`FAST_PATHS` switches
    these off one by one (for measurements)."""
    lengths = set(cache.host_lengths)
    start = lengths.pop() if len(lengths) == 1 else None
    attend = attend_ref if start is None else attend_causal if start == 0 else partial(attend_continuing, start=start)
    store_kv = store_kv_ref
    slice_kv = start is not None and FAST_PATHS["store_kv_slice"]
    fused_kv = fusions is not None and FAST_PATHS["attention_inputs"]
    # the slots' positions, made once for every layer (the reference makes them per layer)
    slots = (torch.arange(cache.max_len, device=cache.device).expand(cache.batch_size, -1)
             if cache.keys and (slice_kv or fused_kv) else None)
    if slice_kv and slots is not None:
        store_kv = partial(store_kv_slice, start=start, key_positions=slots)
    if fusions is None:
        return MixerCores(delta_rule=delta_rule, attend=attend, store_kv=store_kv)
    if start is not None and start > 0 and FAST_PATHS["tail_attention"]:
        from ..ops.tail_attention import attend_short_tail  # Triton: loaded with the fusions

        attend = partial(attend_short_tail, start=start)
    fast = {}
    norm_rope_settings = tuning.settings("norm_rope", cache.device)
    if fused_kv and slots is not None:
        fast["attention_inputs"] = partial(fusions.attention_inputs, key_positions=slots,
                                           num_warps=norm_rope_settings["num_warps"])
    if FAST_PATHS["project_residual"]:
        fast["project"] = fusions.project_residual
    if FAST_PATHS["output_gate"]:
        fast["output_gate"] = fusions.sigmoid_gate_rows
    if FAST_PATHS["gate_up_swiglu"]:
        fast["gate_up"] = partial(fusions.gate_up_swiglu, **tuning.settings("tail_gate_up", cache.device),
                                  prompt=tuning.settings("prompt_gate_up", cache.device))
    in_place = FAST_PATHS["conv_window_in_place"]
    return MixerCores(delta_rule=delta_rule, attend=attend, store_kv=store_kv,
                      gdn_inputs=partial(fusions.gdn_inputs, update_state=in_place,
                                         **tuning.settings("gdn_inputs", cache.device)),
                      gated_norm=fusions.gated_rms_norm_rows,
                      short_conv=partial(fusions.short_conv_prefill, update_state=in_place),
                      rms_norm=fusions.rms_norm_rows, swiglu=fusions.swiglu_rows,
                      norm_rope=partial(fusions.norm_rope_rows, **norm_rope_settings), **fast)



@dataclass
class PrefillGraph:
    """The captured prefill of one prompt length: replay after copying the prompt into ``ids``; the
    last-token logits are then ``out["logits"]``. ``tensors``: the model's parameters and buffers at
    the capture (aliases of their storage), kept alive with the graph that reads them, so that a
    replay after they were replaced (``p.data = ...`` too) reads memory that is still theirs."""

    graph: Any
    ids: torch.Tensor
    out: dict
    tensors: list = field(default_factory=list)


class FusedPrefill:
    """The prefill half of :class:`labkit.decode.fused.FusedDecoder`: the cores it lends, the eager
    fused prefill, and its captured prefills. Uses the decoder's ``model``, ``cache``, ``graph``,
    ``refresh`` (which calls :meth:`_forget_prefills` when it rebuilds) and its loaded ops
    (``_chunk``, ``_fusions``)."""

    CONTINUATIONS = 8  # captured continuation prefills kept per decoder (least recently used dropped)

    def _init_prefills(self, graph: bool) -> None:
        self._continuations: dict[tuple, PrefillGraph] = {}  # (lengths, shape) -> its captured prefill
        # fused+graph: the prefill of a fresh cache is captured per prompt length too (PrefillGraph)
        self.graph_prefill = graph
        self.prefill_policy = tuning.settings("fused_prefill", self.model.device)  # capture_at, graphs
        # the chunk kernel's launch settings from the GPU's file; in the interpreter its own defaults
        # (whole heads per program: fewer programs to run one after another)
        self.chunk_settings = (tuning.settings("chunk_delta_rule", self.model.device)
                               if self.model.device.type == "cuda" else None)
        self._prefill_graphs: OrderedDict[int, PrefillGraph] = OrderedDict()
        self._prefill_seen: OrderedDict[int, int] = OrderedDict()  # how often each length came (the last 64)
        self.prefill_captures = 0
        self.last_prefill_capture_s: float | None = None  # warm-up + capture of the latest new length
        # PrefixCache's misses (prefill_reading): (shape, checkpoint_every) -> (its captured prefill, reader)
        self._reading_graphs: OrderedDict[tuple, tuple[PrefillGraph, Any]] = OrderedDict()
        self._reading_seen: OrderedDict[tuple, int] = OrderedDict()
        self._continuation_seen: OrderedDict[tuple, int] = OrderedDict()  # prefill_continuation's shapes

    def _capture_due(self, seen: OrderedDict, key: Any) -> bool:
        """Count one more call of ``key`` in ``seen`` (the 64 latest keys kept) and say whether its
        capture is due: from its ``capture_at``-th call. A capture costs several eager prefills of its
        shape, so a shape that never comes back (most prompt lengths, most restored tail lengths of a
        varied stream) runs eagerly instead."""
        seen[key] = seen.pop(key, 0) + 1
        while len(seen) > 64:
            seen.popitem(last=False)
        return seen[key] >= self.prefill_policy["capture_at"]

    def _forget_prefills(self) -> None:
        """Drop every captured prefill: they bind the plan's weights, which a refresh replaces."""
        self._continuations = {}
        self._prefill_graphs.clear()
        self._reading_graphs.clear()

    def prefill_cores(self, checkpoint_every: int | None = None,
                      checkpoints: list[torch.Tensor] | None = None) -> MixerCores:
        """The mixer cores of the next prefill into this decoder's cache (after :meth:`refresh`):
        the chunk kernel and the fused element-wise kernels; with ``checkpoint_every``, the delta
        rule also appends its state checkpoints to ``checkpoints`` (see :func:`chunked_delta_rule`):
        what :class:`labkit.PrefixCache` snapshots."""
        self.refresh()
        return self._cores(checkpoint_every, checkpoints)

    def _cores(self, checkpoint_every: int | None = None, checkpoints: list[torch.Tensor] | None = None) -> MixerCores:
        """:meth:`prefill_cores` for a caller that has just refreshed the decoder."""
        rule = chunked_delta_rule(self._chunk.chunk_delta_rule, self.model.dtype, checkpoint_every, checkpoints,
                                  self.chunk_settings)
        return prefill_cores(rule, self.cache, self._fusions)

    @torch.no_grad()
    def forward_prefill(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """The model's logits [B, T, vocab] ([B, 1, vocab] with ``last_only``) for the prompt
        ``input_ids`` [B, T], through the fused prefill, eagerly; the cache advances by T (checked
        for room before anything is written)."""
        return self.model(input_ids, cache=self.cache, last_only=last_only, cores=self.prefill_cores())

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Last-token logits [B, vocab] after the prompt ``input_ids`` [B, T]. Under fused+graph, a
        prompt into a fresh cache replays the graph of its length, captured when the length comes
        for the ``prefill_policy["capture_at"]``-th time (eager before)."""
        return self.prefill_checked(input_ids)

    @torch.no_grad()
    def prefill_checked(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                        weights: Any = None) -> torch.Tensor:
        """:meth:`prefill`, ``ids_checked`` and ``weights`` as for :meth:`prefill_continuation`:
        ``generate`` has checked the ids just before, so their read to the host (a sync) is not paid
        again in its time to first token; a captured length replays before the weights are taken."""
        cache = self.cache
        self.model._check_input(input_ids, cache, check_ids=not ids_checked)
        eager = not (self.graph_prefill and all(n == 0 for n in cache.host_lengths))
        T = input_ids.shape[1]
        if not eager and _untaken(weights) and T in self._prefill_graphs:
            entry = self._prefill_graphs[T]
            if self._replay_then_refresh(entry, input_ids, weights, self._prefill_seen, self._prefill_graphs, T):
                return entry.out["logits"][:, -1]
        else:
            self.refresh(taken(weights))
        due = not eager and self._capture_due(self._prefill_seen, T)
        entry = None if eager else self._prefill_graphs.get(T)
        if eager or (entry is None and not due):
            return self.model.forward_checked(input_ids, cache, last_only=True, cores=self._cores())[:, -1]
        if entry is None:
            t0 = time.perf_counter()
            entry = self._capture_prefill(input_ids)
            self.last_prefill_capture_s = time.perf_counter() - t0
            self.prefill_captures += 1
            self._prefill_graphs[T] = entry
            while len(self._prefill_graphs) > self.prefill_policy["graphs"]:
                self._prefill_graphs.popitem(last=False)  # the least recently used length
        self._prefill_graphs.move_to_end(T)
        entry.ids.copy_(input_ids)
        entry.graph.replay()
        cache.advance_host(T)  # the graph advanced the device lengths
        return entry.out["logits"][:, -1]

    def _replay_then_refresh(self, entry: PrefillGraph, input_ids: torch.Tensor, weights: Any,
                             seen: OrderedDict, graphs: dict, key: Any) -> bool:
        """Replay the captured prefill ``entry`` of ``input_ids`` *before* :meth:`refresh` checks the
        weights (``weights``: None or a caller's callable, see :class:`labkit.decode.Decoder`), so that
        the check (a walk of the model's tensors: 0.26 ms of host for LFM2-350M on an H100, 5% of its
        4,096-token prefill; with a caller's check, PrefixCache's, its fingerprint read too) runs while
        the device works instead of ahead of it. Safe because the graph holds the tensors of its
        capture (:class:`PrefillGraph`'s ``tensors``): a replay after the weights were replaced reads
        the old ones, whole. True: the replay stands; the call of ``key`` is counted in ``seen``, its
        entry in ``graphs`` made the most recently used, and the host lengths advanced. False:
        the replay ran on weights the model no longer has; its result is dropped, the refresh has
        rebuilt the plan and dropped the graphs, and the cache is put back as the caller handed it
        over (zero states, the same host lengths; device lengths zero until a restore or the prefill
        sets them), for the caller to prefill anew. If the check raises, the cache is left empty."""
        cache = self.cache
        host = list(cache.host_lengths)
        entry.ids.copy_(input_ids)
        entry.graph.replay()
        try:
            stale = self.refresh(taken(weights))
        except BaseException:
            cache.reset(keys_values=False)
            raise
        if stale:
            cache.reset(keys_values=False)
            cache._host_lengths = host
            return False
        self._capture_due(seen, key)
        graphs[key] = graphs.pop(key)  # most recently used last
        cache.advance_host(input_ids.shape[1])  # the graph advanced the device lengths
        return True

    @torch.no_grad()
    def prefill_reading(self, input_ids: torch.Tensor, checkpoint_every: int | None,
                        reader: Any, *, ids_checked: bool = False,
                        weights: Any = None, before: Any = None) -> tuple[torch.Tensor, Any] | None:
        """A prefill through the cores ``reader(cores, checkpoints)`` wraps (what :class:`labkit.PrefixCache`
        reads the block boundaries with), into a fresh cache (a miss) or, with ``before`` (a hit's
        restore, as for :meth:`prefill_continuation`), after a restored prefix (a hit whose tail
        reaches a boundary), captured and replayed as :meth:`prefill` is: under fused+graph, per
        (cached lengths, prompt shape, ``checkpoint_every``, ``before.key``) once it comes for the
        ``capture_at``-th time, ``before`` inside the graph; the reader of the capture is returned with
        the logits, its tensors rewritten by every replay (read them before the next). None where it is
        not captured (no graph, a cache holding tokens without ``before``, a shape not yet due): the
        caller runs ``before`` and the prefill eagerly. ``ids_checked``, ``weights``: as for
        :meth:`prefill_continuation`."""
        cache = self.cache
        if not self.graph_prefill or (before is None and any(cache.host_lengths)):
            return None
        self.model._check_input(input_ids, cache, check_ids=not ids_checked)
        key = (cache.host_lengths, tuple(input_ids.shape), checkpoint_every, None if before is None else before.key)
        entry = self._reading_graphs.get(key)
        if entry is not None and _untaken(weights) and self._replay_then_refresh(
                entry[0], input_ids, weights, self._reading_seen, self._reading_graphs, key):
            return entry[0].out["logits"][:, -1], entry[1]
        self.refresh(taken(weights))
        due = self._capture_due(self._reading_seen, key)
        entry = self._reading_graphs.get(key)
        if entry is None and not due:
            return None
        if entry is None:
            t0 = time.perf_counter()
            checkpoints: list[torch.Tensor] | None = [] if checkpoint_every else None
            read = reader(self.prefill_cores(checkpoint_every, checkpoints), checkpoints)
            graph = self._capture_prefill(input_ids, read.cores, before=_then(before, read.begin))
            entry = self._reading_graphs[key] = (graph, read)
            self.last_prefill_capture_s = time.perf_counter() - t0
            self.prefill_captures += 1
            while len(self._reading_graphs) > self.prefill_policy["graphs"]:
                self._reading_graphs.popitem(last=False)
        self._reading_graphs.move_to_end(key)
        graph, read = entry
        graph.ids.copy_(input_ids)
        graph.graph.replay()
        cache.advance_host(input_ids.shape[1])  # the graph advanced the device lengths
        return graph.out["logits"][:, -1], read

    @torch.inference_mode(False)  # its ``ids`` are written by later replays, in any mode
    def _capture_prefill(self, input_ids: torch.Tensor, cores: MixerCores | None = None,
                         before: Callable[[], None] | None = None) -> "PrefillGraph":
        """Warm up (kernels compile) and capture the prefill of ``input_ids``' shape into this cache
        as it stands (fresh, or holding a restored prefix). The warm-up writes the cache: its states
        and device lengths are put back after it, and the host lengths never move (``run`` puts them
        back: the caller advances them after each replay)."""
        cache, model, device = self.cache, self.model, self.model.device
        ids = input_ids.clone()
        out: dict[str, torch.Tensor] = {}
        cores = self.prefill_cores() if cores is None else cores

        def run() -> None:
            if before is not None:
                before()
            host = list(cache.host_lengths)
            out["logits"] = model.forward_checked(ids, cache, last_only=True, cores=cores)
            cache._host_lengths = host

        states = [*cache.conv_states.values(), *cache.recurrent_states.values(), cache.lengths]
        held = [t.detach() for t in (*model.parameters(), *model.buffers())]
        return PrefillGraph(graphs.capture(run, states, device), ids, out, held)

    @torch.no_grad()
    def prefill_continuation(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                             weights: Any = None, before: Any = None) -> torch.Tensor:
        """Last-token logits [B, vocab] after ``input_ids`` [B, T] that continue the cached sequences
        (a prompt's tail after a restored prefix). With ``graph``, the prefill is captured per
        (cached length, T, ``before.key``) once that shape comes for the ``capture_at``-th time
        (eager before, as :meth:`prefill`'s lengths), and replayed: an eager prefill of a few tokens
        costs its launches, not its arithmetic. ``before`` (PrefixCache's restore: it writes the
        cache's states, the restored keys and values and the lengths) runs right before the tail, inside the captured
        graph, so that a hit is one replay. The inputs are checked eagerly first; a capture runs the
        shape once outside it first (kernels compile), putting the states it shifts back
        (:func:`labkit.decode.graphs.capture`). The returned logits are overwritten by the next
        replay of the same shape (as ``step``'s). Without ``graph``, or for an empty cache, this is
        ``before()`` then :meth:`prefill`.

        A caller that has already checked the token ids' range on the host (``ids_checked``: reading
        them from the device is a sync) passes it; shapes, dtype, device and room are checked.
        ``weights`` (see :class:`labkit.decode.Decoder`): a key already taken; or None or a caller's
        check, taken while the replay runs where this shape's graph is captured with a ``before``
        (:meth:`_replay_then_refresh`: :class:`labkit.PrefixCache`'s steady hit is one replay with
        the walk of the model and the fingerprint's read behind it), else before anything runs. Only
        with a ``before``: a replay to drop must leave nothing that cannot be redone, and the restore
        rewrites every state the tail reads, whereas a tail after the cache's own prefix would have
        moved that prefix's states."""
        cache = self.cache
        if not self.graph or cache.seq_len == 0:
            if before is not None:
                weights = taken(weights)  # checked before the restore runs eagerly
                before()
            return self.prefill_checked(input_ids, ids_checked=ids_checked, weights=weights)
        self.model._check_input(input_ids, cache, check_ids=not ids_checked)
        key = (cache.host_lengths, tuple(input_ids.shape), None if before is None else before.key)
        entry = self._continuations.get(key)
        if (entry is not None and before is not None and _untaken(weights) and self._replay_then_refresh(
                entry, input_ids, weights, self._continuation_seen, self._continuations, key)):
            return entry.out["logits"][:, -1]
        self.refresh(taken(weights))
        due = self._capture_due(self._continuation_seen, key)
        entry = self._continuations.pop(key, None)
        if entry is None and not due:  # a tail shape seen too rarely yet to pay a capture: eager
            if before is not None:
                before()
            return self.model.forward_checked(input_ids, cache, last_only=True, cores=self._cores())[:, -1]
        if entry is None:
            entry = self._capture_prefill(input_ids, before=before)
            self.captures += 1
        self._continuations[key] = entry  # most recently used last
        while len(self._continuations) > self.CONTINUATIONS:
            self._continuations.pop(next(iter(self._continuations)))
        entry.ids.copy_(input_ids)
        entry.graph.replay()
        cache.advance_host(input_ids.shape[1])  # the graph advanced the device lengths
        return entry.out["logits"][:, -1]


def _untaken(weights: Any) -> bool:
    """Whether a prefill's ``weights`` is still to be taken (None, or a caller's check): a captured
    replay then goes first, and the key is taken while it runs."""
    return weights is None or callable(weights)


def _then(first: Callable[[], None] | None, second: Callable[[], None]) -> Callable[[], None]:
    """``second`` after ``first`` (None: ``second`` alone), as one callable."""
    if first is None:
        return second

    def both() -> None:
        first()
        second()

    return both
