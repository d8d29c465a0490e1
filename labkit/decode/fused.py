"""The fused decode rungs: one token per sequence through Triton kernels, eager or in one CUDA graph.

Per block, four or five launches instead of the reference's dozens:

    conv:       in_proj (+ RMSNorm, + short conv and its state shift)        -> out_proj (+ residual)
    attention:  wqkv (+ RMSNorm)     -> norm, RoPE, cache write, attention   -> wo (+ residual)
    gdn:        in_proj (+ RMSNorm)  -> conv, norms, gates, delta rule, gated norm -> out_proj (+ residual)
    mlp:        gate_up (+ RMSNorm, SwiGLU) -> down (+ residual)

then the final RMSNorm + LM head (full logits, or only the greedy token). What a step reads is a
typed :class:`labkit.decode.plan.StepPlan`, built once from the model's modules. Every buffer is
allocated once, every position comes from ``cache.lengths`` on the device and nothing in a step
reads back to the host, so the whole step can be captured in one ``torch.cuda.CUDAGraph`` and
replayed per token:

- ``"fused"``: the kernels, launched eagerly (also on the CPU, in Triton's interpreter);
- ``"fused+graph"``: the same launches captured once, replayed per token (CUDA only);
- ``"fused+graph+pdl"``: as above, each kernel launched with programmatic dependent launch, so it
  is scheduled while its predecessor drains and waits (``griddepcontrol.wait``) only before touching
  that predecessor's output, and releases its own successor first thing. Where the kernels wait
  and release is :data:`labkit.ops.linear.PDL_PLACEMENT` (and ``PDL_RELEASE_EARLY`` in the mixer
  kernels), chosen by measuring every placement in the chained step (``python -m labkit bench
  chain``). Hopper or newer; opt-in.

A decoder lives with its cache (``cache.attachments``), and ``generate`` keeps caches per model
(see :func:`labkit.decode.registry.pooled_decoder`), so graphs are captured once and replayed by later
calls. A graph replays the tensors it captured: each prefill checks that the model still holds the
same weights (:func:`labkit.weights.weights_key`), and otherwise rebuilds the plan and recaptures;
a prompt length with a captured graph replays it first and is checked while it runs (a replay on
replaced weights reads the old ones, which its graph holds, and is dropped).

The prefill (the model's forward with fused cores, and its graphs) is :mod:`labkit.decode.fused_prefill`.
``step`` returns the logits in a buffer that the next step overwrites; ``step_greedy`` returns next
tokens without writing logits at all.
"""

from __future__ import annotations

from typing import Any

import torch

from . import graphs
from .fused_prefill import FusedPrefill
from .plan import AttentionLayerPlan, ConvLayerPlan, LinearPlan, StepPlan, build_step_plan
from .protocol import Decoder
from ..cache import HybridCache
from ..model import HybridLM
from ..ops.features import features
from ..weights import WeightsKey, weights_key


def _load_ops() -> Any:
    """The Triton ops, imported when a fused rung is selected (clear error without triton)."""
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


class FusedDecoder(FusedPrefill, Decoder):
    """Triton decode step for a :class:`~labkit.model.HybridLM` over a :class:`~labkit.cache.HybridCache`."""

    checkpoint_multiple = 64  # the chunk kernel's chunk: its state checkpoints fall on multiples of it

    def __init__(self, model: HybridLM, cache: HybridCache, *, graph: bool = False, pdl: bool = False) -> None:
        self._attn, self._chunk, self._gdn, self._head, self._launch, self._lin = _load_ops()
        self._fusions = _load_prefill_fusions()
        super().__init__(model, cache)
        self.cfg = model.cfg
        self.graph, self.pdl = graph, pdl
        self.plan: StepPlan | None = None
        self._graphs: dict[bool, Any] = {}
        self._weights: WeightsKey | None = None
        self.captures = 0  # how many times the graphs were (re)captured
        self._init_prefills(graph)
        self.refresh()

    # -- construction ------------------------------------------------------------------------------
    def _check_model(self) -> None:
        model, cache, device = self.model, self.cache, self.model.device
        if cache.cfg != model.cfg:
            raise ValueError("the cache was made for another model configuration")
        if cache.device != device or cache.dtype != model.dtype:
            raise ValueError(f"cache is {cache.dtype} on {cache.device}; the model is {model.dtype} on {device}")
        if self.pdl:  # first: on an older GPU this is the reason the rung cannot be made
            features(device).require("pdl", 'backend "fused+graph+pdl"',
                                     'Use backend "fused+graph": the same kernels and graph, without PDL.')
        if (self.graph or self.pdl) and not graphs.GRAPHS.available(device):
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

    @property
    def hopper_features(self) -> frozenset[str]:
        return frozenset({"pdl"} if self.pdl else ())

    def refresh(self, weights: WeightsKey | None = None) -> bool:
        """Rebuild the plan (and recapture the graphs) if the model's tensors changed since they were
        made: replaced, modified in place, or moved. True when it rebuilt. Called by every prefill
        (under fused+graph, while a captured prompt length's graph runs): once per sequence, never
        per token. ``weights``: the model's :func:`weights_key`, when the caller has just taken it
        (walking the model costs ~0.2 ms on Qwen3.5-0.8B)."""
        key = weights_key(self.model, values=False) if weights is None else weights
        if key.same_tensors(self._weights):
            return False
        self._weights, self._graphs, self.plan = None, {}, None  # if this fails, nothing stale is left
        self._forget_prefills()
        self._check_model()
        with torch.inference_mode(False):  # the plan's buffers are written by later steps, in any mode
            self.plan = build_step_plan(self.model, self.cache)
            if self.graph:
                self._graphs = {greedy: self._capture(greedy) for greedy in (False, True)}
                self.captures += 1
        self._weights = key
        return True

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

        return graphs.capture(step, [*cache.conv_states.values(), *cache.recurrent_states.values()], device,
                              step_and_advance)

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
    recaptured if the model's tensors changed (:meth:`FusedDecoder.refresh`). A reused decoder is
    checked against the weights by its next prefill, as every prefill is (under fused+graph while
    the prompt's graph runs), not here: a check here would be a second walk of the model, ahead of
    the prefill, on every ``generate`` call."""
    key = ("labkit.decode.fused", id(model), graph, pdl)
    decoder = cache.attachments.get(key)
    if isinstance(decoder, FusedDecoder) and decoder.model is model:
        return decoder
    decoder = FusedDecoder(model, cache, graph=graph, pdl=pdl)
    cache.attachments[key] = decoder
    return decoder

