"""The fused decode backends: one token per sequence through Triton kernels, eager or in one CUDA graph.

Per block, four or five launches instead of the reference's dozens:

    conv:       in_proj (+ RMSNorm, + short conv and its state shift)        -> out_proj (+ residual)
    attention:  wqkv (+ RMSNorm)     -> norm, RoPE, cache write, attention   -> wo (+ residual)
    gdn:        in_proj (+ RMSNorm)  -> conv, norms, gates, delta rule, gated norm -> out_proj (+ residual)
    mlp:        gate_up (+ RMSNorm, SwiGLU) -> down (+ residual)

then the final RMSNorm + LM head (full logits, or only the greedy token). What a step reads is a
typed :class:`StepPlan`, built once from the model's modules (a renamed or missing parameter fails
there, naming the layer and the attribute). Every buffer is allocated once, every position comes
from ``cache.lengths`` on the device and nothing in a step reads back to the host, so the whole
step can be captured in one ``torch.cuda.CUDAGraph`` and replayed per token:

- ``"fused"``: the kernels, launched eagerly (also on the CPU, in Triton's interpreter);
- ``"fused+graph"``: the same launches captured once, replayed per token (CUDA only);
- ``"fused+graph+pdl"``: as above, each kernel launched with programmatic dependent launch, so it
  is scheduled while its predecessor drains and waits (``griddepcontrol.wait``) only before touching
  that predecessor's output, and releases its own successor first thing. Where the kernels wait
  and release is the GPU's tuning file's (:func:`labkit.tuning.pdl_placement`; ``release_early`` in the mixer
  kernels), chosen by measuring every placement in the chained step (``python -m labkit bench
  chain``). Hopper or newer; opt-in.

A decoder lives with its cache (``cache.attachments``), and ``generate`` keeps caches per model
(see :func:`labkit.decode.registry.pooled_decoder`), so graphs are captured once and replayed by later
calls. A graph replays the tensors it captured: before each prefill the decoder checks that the
model still holds the same parameters, unmodified (``_version``), on the same device and dtype,
and otherwise rebuilds its plan and recaptures.

Prefill runs the model's own forward (projections through cuBLAS, the structure of every mixer
from ``labkit.ops.mixers``) with its inner cores swapped for faster implementations of the same
functions (:func:`prefill_cores`): the chunked Triton delta rule, which reads the cache's recurrent
state and writes the final one back in place; SDPA's causal form of attention for prompts that
start every sequence, and its bottom-right causal form over the keys in use for prompts that
continue a cache (every row at one length); and one Triton kernel for each element-wise chain
between the GEMMs (:mod:`labkit.ops.prefill_fusions`: the RMSNorms, the GDN conv + gates + L2 norm and its gated
output norm, LFM2's short conv, the MLP's SwiGLU, attention's q/k norm + RoPE). It fills the same cache the fused step reads. Under
``"fused+graph"`` the prefill of a fresh cache is also captured, one CUDA graph per prompt length
(the last ``graphs`` lengths kept), once a length comes back (``capture_at``: ``tuning.settings("fused_prefill")``):
it pays an eager warm-up and the capture once, later prompts of that length replay it, without
the host's launch overhead. A prompt that
continues cached sequences runs eagerly. ``step`` returns the logits in a buffer that the next
step overwrites; ``step_greedy`` returns next tokens without writing logits at all.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Union

import torch
from torch import nn

from .. import tuning
from .registry import register
from ..cache import HybridCache
from ..model import HybridLM, attention_dims, gdn_dims
from ..ops.mixers import DeltaRule, MixerCores, attend_causal, attend_continuing, attend_ref
from ..tuning import linear_config as tuned_linear_config
from ..weights import weights_key as weights_key  # re-exported: callers import it from labkit.decode.fused


def _load_ops() -> Any:
    """The Triton ops, imported when a fused backend is selected (clear error without triton)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - triton ships with CUDA torch; CPU installs add it
        raise ImportError(
            "the fused backends need Triton: it ships with CUDA builds of PyTorch; on a CPU-only "
            "machine install it (pip install 'triton>=3.6') and set TRITON_INTERPRET=1 before importing it"
        ) from e
    from ..ops import attention_decode, chunk_delta_rule, gated_delta_decode, greedy_head, launch, linear

    return attention_decode, chunk_delta_rule, gated_delta_decode, greedy_head, launch, linear


def _load_prefill_fusions() -> Any:
    from ..ops import prefill_fusions

    return prefill_fusions


def chunked_delta_rule(kernel: Callable[..., tuple], dtype: torch.dtype, checkpoint_every: int | None = None,
                       checkpoints: list[torch.Tensor] | None = None) -> DeltaRule:
    """``kernel`` (:func:`labkit.ops.chunk_delta_rule.chunk_delta_rule`) behind the reference delta
    rule's signature: q, k, v enter in the model's ``dtype`` (the reference hands them over in
    float32; bf16 operands are what the kernel's tensor-core products take) and the state is
    updated in place and returned, so the cache's recurrent state is read and written once.

    With ``checkpoint_every`` (a multiple of the kernel's 64-token chunk), each call also appends to
    ``checkpoints`` the states after every ``checkpoint_every`` of its tokens, [B, n, Hv, K, V]
    float32 (n = T // checkpoint_every), written by the same walk (no second pass)."""

    def delta_rule(q, k, v, g, beta, state=None):
        q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
        extra = {}
        if checkpoint_every is not None:
            B, T = q.shape[:2]
            shape = (B * (T // checkpoint_every), v.shape[2], q.shape[3], v.shape[3])
            buf = torch.empty(shape, dtype=torch.float32, device=q.device)
            extra = dict(checkpoints=buf, checkpoint_every=checkpoint_every)
            checkpoints.append(buf.view(B, T // checkpoint_every, *shape[1:]))
        return kernel(q, k, v, g.contiguous(), beta.contiguous(), state, final_state=state, **extra)

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
    (norms, the convs, the GDN gates and output norm, SwiGLU, q/k norm + RoPE) are one kernel each."""
    lengths = set(cache.host_lengths)
    if lengths == {0}:
        attend = attend_causal
    elif len(lengths) == 1:
        attend = partial(attend_continuing, start=lengths.pop())
    else:
        attend = attend_ref
    if fusions is None:
        return MixerCores(delta_rule=delta_rule, attend=attend)
    return MixerCores(delta_rule=delta_rule, attend=attend, gdn_inputs=fusions.gdn_inputs,
                      gated_norm=fusions.gated_rms_norm_rows, short_conv=fusions.short_conv_prefill,
                      rms_norm=fusions.rms_norm_rows, swiglu=fusions.swiglu_rows,
                      norm_rope=partial(fusions.norm_rope_rows, **tuning.settings("norm_rope", cache.device)))


# -- graphs: the one seam the CPU tests replace ---------------------------------------------------
class CudaGraphs:
    """How the graph backends capture and replay a step. The CPU tests swap ``GRAPHS`` for a stand-in
    that records the step and re-runs it on replay, so capture, replay and reuse run without a GPU."""

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def warm_up(self, step: Callable[[], None], device: torch.device) -> None:
        """Run ``step`` once outside any capture (kernels compile and load), on a side stream as
        torch.cuda.graph asks."""
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(device).wait_stream(side)

    def capture(self, step: Callable[[], None], device: torch.device) -> Any:
        """A graph of ``step``'s launches (not run now); ``.replay()`` runs them."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize(device)
        return graph


GRAPHS = CudaGraphs()



@dataclass
class PrefillGraph:
    """The captured prefill of one prompt length: replay after copying the prompt into ``ids``; the
    last-token logits are then ``out["logits"]``."""

    graph: Any
    ids: torch.Tensor
    out: dict


# -- the plan: what one step reads, typed, built from the model's modules -------------------------
@dataclass(frozen=True)
class LinearPlan:
    weight: torch.Tensor
    config: Any  # LinearConfig
    norm_weight: torch.Tensor | None = None  # RMSNorm in the prologue
    row_blocks: int = 1  # 2: SwiGLU's gate|up, 3: the short conv's B|C|x
    impl: str = "triton"  # "torch": unfused through cuBLAS, where the tuning file measured that faster

    @property
    def outputs(self) -> int:
        return self.weight.shape[0] // self.row_blocks


@dataclass(frozen=True)
class MlpPlan:
    gate_up: LinearPlan  # mlp norm + gate|up, SwiGLU in the epilogue
    down: LinearPlan  # + residual


@dataclass(frozen=True)
class ConvLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + B|C|x, the short conv and its state shift in the epilogue
    conv_weight: torch.Tensor
    out_proj: LinearPlan
    mlp: MlpPlan


@dataclass(frozen=True)
class AttentionLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + the model's wqkv: q|k|v(|gate)
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    inv_freq: torch.Tensor
    out_proj: LinearPlan  # the model's wo
    mlp: MlpPlan


@dataclass(frozen=True)
class GdnLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + q|k|v|z|b|a
    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: LinearPlan
    mlp: MlpPlan


LayerPlan = Union[ConvLayerPlan, AttentionLayerPlan, GdnLayerPlan]


@dataclass
class StepPlan:
    """Everything a decode step touches besides the cache; a captured graph holds these very tensors."""

    embed: torch.Tensor
    layers: list[LayerPlan]
    head: LinearPlan  # final norm + LM head -> logits
    greedy: LinearPlan  # the same, argmax only
    eps: float
    unit_offset: bool
    # static buffers: one per distinct shape, reused by every layer
    tokens: torch.Tensor
    h: torch.Tensor
    act: torch.Tensor
    logits: torch.Tensor
    next_tokens: torch.Tensor
    proj: dict[str, torch.Tensor]  # per mixer kind (the conv's projection never leaves its kernel)
    mixed: dict[str, torch.Tensor]
    linear_ws: Any  # LinearWorkspace
    head_buffers: Any  # GreedyHeadBuffers
    attn_dims: Any = None
    attn_ws: Any = None
    gdn_dims: Any = None
    gdn_ws: Any = None
    placement: Any = None  # PdlPlacement of the linear kernels (tuning.pdl_placement)
    attn_args: Any = None  # attention_decode's tuned keywords (chunk, release_early)
    gdn_args: Any = None  # gdn_decode's tuned keywords (block_v, release_early)

    def activations(self) -> list[torch.Tensor]:
        """The buffers a step writes before reading (tests poison them)."""
        return [self.h, self.act, self.logits, *self.proj.values(), *self.mixed.values()]


def _tensor(owner: nn.Module, path: str, where: str) -> torch.Tensor:
    obj: Any = owner
    for part in path.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor):
        found = "missing" if obj is None else f"a {type(obj).__name__}, not a tensor"
        raise ValueError(f"{where}: the fused backend reads `{path}`, which is {found} (renamed or deleted?)")
    return obj


def _layer_plan(i: int, kind: str, block: nn.Module, plan: Callable[..., LinearPlan]) -> LayerPlan:
    where = f"model.layers[{i}] ({kind} block)"

    def get(path: str) -> torch.Tensor:
        return _tensor(block, path, where)

    norm = get("mixer_norm.weight")
    mlp = MlpPlan(plan(get("mlp.gate_up"), get("mlp_norm.weight"), row_blocks=2), plan(get("mlp.down")))
    if kind == "conv":
        return ConvLayerPlan(i, plan(get("mixer.in_proj"), norm, row_blocks=3), get("mixer.conv_weight"),
                             plan(get("mixer.out_proj")), mlp)
    if kind == "attention":
        return AttentionLayerPlan(i, plan(get("mixer.wqkv"), norm), get("mixer.q_norm.weight"),
                                  get("mixer.k_norm.weight"), get("mixer.inv_freq"), plan(get("mixer.wo")), mlp)
    if kind == "gdn":
        return GdnLayerPlan(i, plan(get("mixer.in_proj"), norm), get("mixer.conv_weight"), get("mixer.A_log"),
                            get("mixer.dt_bias"), get("mixer.norm_weight"), plan(get("mixer.out_proj")), mlp)
    raise TypeError(f"{where}: no fused kernels for a {kind!r} mixer")


class FusedDecoder:
    """Triton decode step for a :class:`~labkit.model.HybridLM` over a :class:`~labkit.cache.HybridCache`."""

    def __init__(self, model: HybridLM, cache: HybridCache, *, graph: bool = False, pdl: bool = False) -> None:
        self._attn, self._chunk, self._gdn, self._head, self._launch, self._lin = _load_ops()
        self._fusions = _load_prefill_fusions()
        self.model, self.cache, self.cfg = model, cache, model.cfg
        self.graph, self.pdl = graph, pdl
        self.plan: StepPlan | None = None
        self._graphs: dict[bool, Any] = {}
        self._continuations: dict[tuple, PrefillGraph] = {}  # (lengths, shape) -> its captured prefill
        self._weights: tuple | None = None
        self.captures = 0  # how many times the graphs were (re)captured
        # fused+graph: the prefill of a fresh cache is captured per prompt length too (PrefillGraph)
        self.graph_prefill = graph
        self.prefill_policy = tuning.settings("fused_prefill", model.device)  # capture_at, graphs
        self._prefill_graphs: OrderedDict[int, PrefillGraph] = OrderedDict()
        self._prefill_seen: OrderedDict[int, int] = OrderedDict()  # how often each length came (the last 64)
        self.prefill_captures = 0
        self.last_prefill_capture_s: float | None = None  # warm-up + capture of the latest new length
        self.refresh()

    # -- construction ------------------------------------------------------------------------------
    def _check_model(self) -> None:
        model, cache, device = self.model, self.cache, self.model.device
        if cache.cfg != model.cfg:
            raise ValueError("the cache was made for another model configuration")
        if cache.device != device or cache.dtype != model.dtype:
            raise ValueError(f"cache is {cache.dtype} on {cache.device}; the model is {model.dtype} on {device}")
        if (self.graph or self.pdl) and not GRAPHS.available(device):
            raise RuntimeError(
                f"the fused+graph backends capture the decode step in a CUDA graph, which needs a CUDA GPU; "
                f"the model is on {device}. Use backend='fused' to run the same kernels eagerly "
                "(on a CPU, in Triton's interpreter)"
            )
        if device.type != "cuda" and not self._launch.interpreting():
            raise RuntimeError(
                f"the fused backend runs Triton kernels, which need a CUDA GPU; for a model on {device}, set "
                "TRITON_INTERPRET=1 before importing triton (or labkit) to run them in Triton's interpreter"
            )
        if self.pdl and torch.cuda.get_device_capability(device)[0] < 9:
            raise RuntimeError("programmatic dependent launch needs a Hopper (sm_90) or newer GPU")

    @property
    def checked_weights(self) -> tuple | None:
        """The model's :func:`weights_key` as the latest :meth:`refresh` took it (None before one
        succeeded): a caller that has just refreshed the decoder (``generate``, through
        ``fused_decoder``) passes it on instead of taking the key again."""
        return self._weights

    def refresh(self, weights: tuple | None = None) -> bool:
        """Rebuild the plan (and recapture the graphs) if the model's tensors changed since they were
        made: replaced, modified in place, or moved. True when it rebuilt. Called by every prefill
        and when ``generate`` reuses the decoder: once per sequence, never per token. ``weights``:
        the model's :func:`weights_key`, when the caller has just taken it (walking the model costs
        ~0.2 ms on Qwen3.5-0.8B)."""
        key = weights_key(self.model) if weights is None else weights
        if key == self._weights:
            return False
        self._weights, self._graphs, self.plan = None, {}, None  # if this fails, nothing stale is left
        self._continuations = {}
        self._prefill_graphs.clear()
        self._check_model()
        self.plan = self._make_plan()
        if self.graph:
            self._graphs = {greedy: self._capture(greedy) for greedy in (False, True)}
            self.captures += 1
        self._weights = key
        return True

    def _make_plan(self) -> StepPlan:
        model, cfg, cache, lin = self.model, self.cfg, self.cache, self._lin
        B, H, dt, dev = cache.batch_size, cfg.hidden_size, model.dtype, model.device

        def plan(weight: torch.Tensor, norm: torch.Tensor | None = None, row_blocks: int = 1,
                 argmax: bool = False, head: bool = False) -> LinearPlan:
            n, k = weight.shape
            config = tuned_linear_config(B, n // row_blocks, k, row_blocks=row_blocks, argmax=argmax, device=dev)
            # the LM head stays on the Triton kernel: its greedy path must sum as its logits path does
            impl = "triton" if head else tuning.linear_impl(B, n // row_blocks, k, row_blocks=row_blocks, device=dev)
            return LinearPlan(weight, config, norm, row_blocks, impl)

        layers = [_layer_plan(i, kind, block, plan) for i, (kind, block) in enumerate(zip(cfg.layer_types, model.layers))]
        embed = _tensor(model, "embed.weight", "model")
        final_norm = _tensor(model, "final_norm.weight", "model")
        lm_head = embed if cfg.tie_embeddings else _tensor(model, "lm_head", "model")
        head, greedy = plan(lm_head, final_norm, head=True), plan(lm_head, final_norm, argmax=True, head=True)

        proj: dict[str, torch.Tensor] = {}
        mixed: dict[str, torch.Tensor] = {}
        for layer in layers:
            kind = cfg.layer_types[layer.index]
            if kind not in mixed:
                mixed[kind] = torch.empty(B, layer.out_proj.weight.shape[1], dtype=dt, device=dev)
                if not isinstance(layer, ConvLayerPlan):
                    proj[kind] = torch.empty(B, layer.in_proj.weight.shape[0], dtype=dt, device=dev)

        need_p = need_c = 0
        for p in [head, greedy, *(q for x in layers for q in (x.in_proj, x.out_proj, x.mlp.gate_up, x.mlp.down))]:
            np_, nc = lin.LinearWorkspace.needed(B, p.outputs, p.config, p.row_blocks)
            need_p, need_c = max(need_p, np_), max(need_c, nc)

        step = StepPlan(
            embed=embed, layers=layers, head=head, greedy=greedy, eps=cfg.norm_eps, unit_offset=cfg.norm_unit_offset,
            tokens=torch.zeros(B, dtype=torch.long, device=dev),
            h=torch.empty(B, H, dtype=dt, device=dev),
            act=torch.empty(B, cfg.intermediate_size, dtype=dt, device=dev),
            logits=torch.empty(B, cfg.vocab_size, dtype=dt, device=dev),
            next_tokens=torch.empty(B, dtype=torch.long, device=dev),
            proj=proj, mixed=mixed,
            linear_ws=lin.LinearWorkspace.allocate(need_p, need_c, dev),
            head_buffers=self._head.GreedyHeadBuffers.allocate(B, cfg.vocab_size, greedy.config, dev),
            placement=tuning.pdl_placement(dev),
        )
        if "attention" in cfg.layer_types:
            step.attn_dims = attention_dims(cfg)
            tuned = tuning.settings("attention_decode", dev)
            chunk, _ = self._attn.attention_chunk(cache.max_len, cfg.head_dim, min_chunk=tuned["min_chunk"],
                                                  max_chunks=tuned["max_chunks"])
            step.attn_args = dict(chunk=chunk, release_early=tuned["release_early"])
            step.attn_ws = self._attn.AttentionWorkspace.allocate(B, step.attn_dims, -(-cache.max_len // chunk), dev)
        if "gdn" in cfg.layer_types:
            step.gdn_dims = gdn_dims(cfg)
            step.gdn_ws = self._gdn.GdnWorkspace.allocate(B, step.gdn_dims, dev)
            tuned = tuning.settings("gated_delta_decode", dev)
            block_v = self._gdn.gdn_block_v(B, step.gdn_dims, block_v=tuned["block_v"],
                                            narrow_block_v=tuned["narrow_block_v"], programs_per_sm=tuned["programs_per_sm"])
            step.gdn_args = dict(block_v=block_v, release_early=tuned["release_early"])
        return step

    # -- one step ----------------------------------------------------------------------------------
    def _linear(self, plan: StepPlan, p: LinearPlan, x: torch.Tensor, *, out: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, short_conv: tuple | None = None) -> None:
        if p.impl == "torch":
            self._linear_unfused(plan, p, x, out=out, residual=residual, short_conv=short_conv)
            return
        self._lin.linear(
            x, p.weight, out=out, residual=residual, norm_weight=p.norm_weight, norm_eps=plan.eps,
            norm_unit_offset=plan.unit_offset, swiglu=p.row_blocks == 2, short_conv=short_conv, config=p.config,
            workspace=plan.linear_ws, pdl=self.pdl, placement=plan.placement,
        )

    def _linear_unfused(self, plan: StepPlan, p: LinearPlan, x: torch.Tensor, *, out: torch.Tensor | None,
                        residual: torch.Tensor | None, short_conv: tuple | None) -> None:
        """The measured dispatch (``impl == "torch"``, batch >= 16 only): the same function as the
        fused kernel with cuBLAS doing the matmul and each fusion a one-kernel op
        (:func:`labkit.ops.linear.linear_unfused`), written into the step's buffers, because at this
        shape that measured faster."""
        self._lin.linear_unfused(x, p.weight, out=out, residual=residual, norm_weight=p.norm_weight,
                                 norm_eps=plan.eps, norm_unit_offset=plan.unit_offset, swiglu=p.row_blocks == 2,
                                 short_conv=short_conv)

    def _forward(self, plan: StepPlan, greedy: bool) -> None:
        """Launch one decode step for ``plan.tokens``; ``cache.lengths`` is not advanced here."""
        cache, h, pdl = self.cache, plan.h, self.pdl
        torch.index_select(plan.embed, 0, plan.tokens, out=h)
        for layer in plan.layers:
            i = layer.index
            if isinstance(layer, ConvLayerPlan):
                mixed = plan.mixed["conv"]
                self._linear(plan, layer.in_proj, h, out=mixed, short_conv=(cache.conv_states[i], layer.conv_weight))
            elif isinstance(layer, AttentionLayerPlan):
                proj, mixed = plan.proj["attention"], plan.mixed["attention"]
                self._linear(plan, layer.in_proj, h, out=proj)
                self._attn.attention_decode(
                    proj, layer.q_norm, layer.k_norm, layer.inv_freq, cache.keys[i], cache.values[i], cache.lengths,
                    plan.attn_dims, plan.eps, plan.unit_offset, out=mixed, workspace=plan.attn_ws, pdl=pdl,
                    **plan.attn_args,
                )
            else:
                proj, mixed = plan.proj["gdn"], plan.mixed["gdn"]
                self._linear(plan, layer.in_proj, h, out=proj)
                self._gdn.gdn_decode(
                    proj, cache.conv_states[i], layer.conv_weight, layer.A_log, layer.dt_bias, layer.norm_weight,
                    cache.recurrent_states[i], plan.gdn_dims, plan.eps, out=mixed, workspace=plan.gdn_ws, pdl=pdl,
                    **plan.gdn_args,
                )
            self._linear(plan, layer.out_proj, mixed, residual=h)
            self._linear(plan, layer.mlp.gate_up, h, out=plan.act)
            self._linear(plan, layer.mlp.down, plan.act, residual=h)
        if greedy:
            self._head.greedy_head(
                h, plan.greedy.weight, norm_weight=plan.greedy.norm_weight, norm_eps=plan.eps,
                norm_unit_offset=plan.unit_offset, tokens_out=plan.next_tokens, config=plan.greedy.config,
                buffers=plan.head_buffers, workspace=plan.linear_ws, pdl=pdl, placement=plan.placement,
            )
        else:
            self._linear(plan, plan.head, h, out=plan.logits)

    @torch.no_grad()
    def _capture(self, greedy: bool) -> Any:
        """Capture one step (with the device-side length increment) in a graph.

        Kernels compile and load on a first eager run outside the capture; that run shifts the conv
        and recurrent states, so they are saved and put back (the k/v it writes at position
        ``lengths`` are rewritten by the next real step). The graph binds this plan's tensors.
        """
        cache, plan, device = self.cache, self.plan, self.model.device

        def step() -> None:
            self._forward(plan, greedy)

        def step_and_advance() -> None:
            self._forward(plan, greedy)
            cache.lengths.add_(1)

        states = [*cache.conv_states.values(), *cache.recurrent_states.values()]
        saved = [s.clone() for s in states]
        GRAPHS.warm_up(step, device)
        for s, copy in zip(states, saved):
            s.copy_(copy)
        del saved
        return GRAPHS.capture(step_and_advance, device)

    def _run(self, tokens: torch.Tensor, greedy: bool) -> None:
        cache, plan = self.cache, self.plan
        if plan is None or self._weights is None:
            raise RuntimeError("this decoder has no valid plan: rebuilding it for the model's current weights "
                               "failed (see that error); fix the model, then prefill again")
        B = cache.batch_size
        if not isinstance(tokens, torch.Tensor) or tokens.shape != (B,):
            raise ValueError(f"tokens must be a [{B}] tensor (one per sequence), got {getattr(tokens, 'shape', tokens)!r}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be int64 or int32, got {tokens.dtype}")
        cache.check_room(B, 1)
        plan.tokens.copy_(tokens)
        if self.graph:
            self._graphs[greedy].replay()
            cache.advance_host(1)  # the graph advanced the device lengths
        else:
            self._forward(plan, greedy)
            cache.advance(1)

    # -- Decoder protocol ----------------------------------------------------------------------------
    checkpoint_multiple = 64  # the chunk kernel's chunk: its state checkpoints fall on multiples of it

    def prefill_cores(self, checkpoint_every: int | None = None,
                      checkpoints: list[torch.Tensor] | None = None) -> MixerCores:
        """The mixer cores of the next prefill into this decoder's cache (after :meth:`refresh`):
        the chunk kernel and the fused element-wise kernels; with ``checkpoint_every``, the delta
        rule also appends its state checkpoints to ``checkpoints`` (see :func:`chunked_delta_rule`):
        what :class:`labkit.PrefixCache` snapshots."""
        self.refresh()
        rule = chunked_delta_rule(self._chunk.chunk_delta_rule, self.model.dtype, checkpoint_every, checkpoints)
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
        cache = self.cache
        if not (self.graph_prefill and all(n == 0 for n in cache.host_lengths)):
            return self.forward_prefill(input_ids, last_only=True)[:, -1]
        self.refresh()
        self.model._check_input(input_ids, cache)
        T = input_ids.shape[1]
        self._prefill_seen[T] = self._prefill_seen.pop(T, 0) + 1
        while len(self._prefill_seen) > 64:
            self._prefill_seen.popitem(last=False)
        entry = self._prefill_graphs.get(T)
        if entry is None and self._prefill_seen[T] < self.prefill_policy["capture_at"]:
            return self.forward_prefill(input_ids, last_only=True)[:, -1]
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

    def _capture_prefill(self, input_ids: torch.Tensor) -> "PrefillGraph":
        """Warm up (kernels compile) and capture the prefill of ``input_ids``' shape into this cache
        as it stands (fresh, or holding a restored prefix). The warm-up writes the cache: its states
        and device lengths are put back after it, and the host lengths never move (``run`` puts them
        back: the caller advances them after each replay)."""
        cache, model, device = self.cache, self.model, self.model.device
        ids = input_ids.clone()
        out: dict[str, torch.Tensor] = {}
        cores = self.prefill_cores()

        def run() -> None:
            host = list(cache.host_lengths)
            out["logits"] = model.forward_checked(ids, cache, last_only=True, cores=cores)
            cache._host_lengths = host

        states = [*cache.conv_states.values(), *cache.recurrent_states.values(), cache.lengths]
        saved = [s.clone() for s in states]
        GRAPHS.warm_up(run, device)
        for s, copy in zip(states, saved):
            s.copy_(copy)
        return PrefillGraph(GRAPHS.capture(run, device), ids, out)

    CONTINUATIONS = 8  # captured continuation prefills kept per decoder (least recently used dropped)

    @torch.no_grad()
    def prefill_continuation(self, input_ids: torch.Tensor, *, ids_checked: bool = False,
                             weights: tuple | None = None) -> torch.Tensor:
        """Last-token logits [B, vocab] after ``input_ids`` [B, T] that continue the cached sequences
        (a prompt's tail after a restored prefix). With ``graph``, the prefill is captured once per
        (cached length, T) and replayed: an eager prefill of a few tokens costs its launches, not its
        arithmetic. The inputs are checked eagerly first; the first call of a shape runs it once
        outside the capture (kernels compile), putting the states it shifts back, as ``_capture``
        does. The returned logits are overwritten by the next replay of the same shape (as ``step``'s).
        Without ``graph``, or for an empty cache, this is :meth:`prefill`.

        A caller that has already checked the token ids' range on the host (``ids_checked``: reading
        them from the device is a sync) and taken the model's :func:`weights_key` (``weights``), as
        :class:`labkit.PrefixCache` does, passes them; shapes, dtype, device and room are checked."""
        cache = self.cache
        if not self.graph or cache.seq_len == 0:
            return self.prefill(input_ids)
        self.refresh(weights)
        self.model._check_input(input_ids, cache, check_ids=not ids_checked)
        key = (cache.host_lengths, tuple(input_ids.shape))
        entry = self._continuations.pop(key, None)
        if entry is None:
            entry = self._capture_prefill(input_ids)
            self.captures += 1
        self._continuations[key] = entry  # most recently used last
        while len(self._continuations) > self.CONTINUATIONS:
            self._continuations.pop(next(iter(self._continuations)))
        entry.ids.copy_(input_ids)
        entry.graph.replay()
        cache.advance_host(input_ids.shape[1])  # the graph advanced the device lengths
        return entry.out["logits"][:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] after ``tokens`` [B]; the buffer is overwritten by the next step."""
        self._run(tokens, greedy=False)
        return self.plan.logits

    @torch.no_grad()
    def step_greedy(self, tokens: torch.Tensor) -> torch.Tensor:
        """The argmax tokens [B] after ``tokens`` [B], without writing logits; overwritten next step."""
        self._run(tokens, greedy=True)
        return self.plan.next_tokens


def fused_decoder(model: HybridLM, cache: HybridCache, *, graph: bool = False, pdl: bool = False) -> FusedDecoder:
    """A FusedDecoder for (model, cache), reused while the cache lives: captured graphs stay valid
    because the cache never moves its buffers (``cache.reset()`` zeroes them in place), and they are
    recaptured if the model's tensors changed (:meth:`FusedDecoder.refresh`)."""
    key = ("labkit.decode.fused", id(model), graph, pdl)
    decoder = cache.attachments.get(key)
    if isinstance(decoder, FusedDecoder) and decoder.model is model:
        decoder.refresh()
        return decoder
    decoder = FusedDecoder(model, cache, graph=graph, pdl=pdl)
    cache.attachments[key] = decoder
    return decoder


register("fused", lambda model, cache: fused_decoder(model, cache), pooled=True)
register("fused+graph", lambda model, cache: fused_decoder(model, cache, graph=True), pooled=True)
register("fused+graph+pdl", lambda model, cache: fused_decoder(model, cache, graph=True, pdl=True), pooled=True)
