"""The fused decode backends: one token per sequence through Triton kernels, eager or in one CUDA graph.

Per block, four or five launches instead of the reference's dozens:

    conv:       in_proj (+ RMSNorm, + short conv and its state shift)        -> out_proj (+ residual)
    attention:  wqkv (+ RMSNorm)     -> norm, RoPE, cache write, attention   -> wo (+ residual)
    gdn:        in_proj (+ RMSNorm)  -> conv, norms, gates, delta rule, gated norm -> out_proj (+ residual)
    mlp:        gate_up (+ RMSNorm, SwiGLU) -> down (+ residual)

then the final RMSNorm + LM head (full logits, or only the greedy token). Every buffer is
allocated once, every position comes from ``cache.lengths`` on the device and nothing in a step
reads back to the host, so the whole step can be captured in one ``torch.cuda.CUDAGraph`` and
replayed per token:

- ``"fused"``: the kernels, launched eagerly (also on the CPU, in Triton's interpreter);
- ``"fused+graph"``: the same launches captured once, replayed per token (CUDA only);
- ``"fused+graph+pdl"``: as above, each kernel launched with programmatic dependent launch, so it
  is scheduled while its predecessor drains and waits (``griddepcontrol.wait``) only before touching
  that predecessor's output. Hopper or newer; experimental: ``tools/gpu_fused_check.py`` checks it.

Prefill runs the reference model (it fills the same cache the fused step reads). ``step`` returns
the logits in a buffer that the next step overwrites; ``step_greedy`` returns next tokens without
writing logits at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .backends import register
from .cache import HybridCache
from .model import Attention, GatedDeltaNet, HybridLM, ShortConv
from .tuning import linear_config as tuned_linear_config


def _load_ops() -> Any:
    """The Triton ops, imported when a fused backend is selected (clear error without triton)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:  # pragma: no cover - triton ships with CUDA torch; CPU installs add it
        raise ImportError(
            "the fused backends need Triton: it ships with CUDA builds of PyTorch; on a CPU-only "
            "machine install it (pip install 'triton>=3.6') and set TRITON_INTERPRET=1 before importing it"
        ) from e
    from .ops import attention_decode, gated_delta_decode, greedy_head, launch, linear

    return attention_decode, gated_delta_decode, greedy_head, launch, linear


@dataclass
class _LinearPlan:
    weight: torch.Tensor
    config: Any  # LinearConfig
    norm_weight: torch.Tensor | None = None
    row_blocks: int = 1  # 2: SwiGLU's gate|up, 3: the short conv's B|C|x

    @property
    def outputs(self) -> int:
        return self.weight.shape[0] // self.row_blocks


class FusedDecoder:
    """Triton decode step for a :class:`~labkit.model.HybridLM` over a :class:`~labkit.cache.HybridCache`."""

    def __init__(self, model: HybridLM, cache: HybridCache, *, graph: bool = False, pdl: bool = False) -> None:
        self._attn, self._gdn, self._head, launch, self._lin = _load_ops()
        cfg = model.cfg
        if cache.cfg != cfg:
            raise ValueError("the cache was made for another model configuration")
        if cache.device != model.device or cache.dtype != model.dtype:
            raise ValueError(f"cache is {cache.dtype} on {cache.device}; the model is {model.dtype} on {model.device}")
        device = model.device
        if (graph or pdl) and device.type != "cuda":
            raise RuntimeError(
                f"the fused+graph backends capture the decode step in a CUDA graph, which needs a CUDA GPU; "
                f"the model is on {device}. Use backend='fused' to run the same kernels eagerly "
                "(on a CPU, in Triton's interpreter)"
            )
        if device.type != "cuda" and not launch.interpreting():
            raise RuntimeError(
                f"the fused backend runs Triton kernels, which need a CUDA GPU; for a model on {device}, set "
                "TRITON_INTERPRET=1 before importing triton (or labkit) to run them in Triton's interpreter"
            )
        if pdl and torch.cuda.get_device_capability(device)[0] < 9:
            raise RuntimeError("programmatic dependent launch needs a Hopper (sm_90) or newer GPU")
        self.model, self.cache, self.cfg = model, cache, cfg
        self.graph, self.pdl = graph, pdl
        self._plan()
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}
        if graph:
            for greedy in (False, True):
                self._graphs[greedy] = self._capture(greedy)

    # -- construction ------------------------------------------------------------------------------
    def _plan(self) -> None:
        model, cfg, cache = self.model, self.cfg, self.cache
        lin = self._lin
        B, H, dt, dev = cache.batch_size, cfg.hidden_size, model.dtype, model.device
        eps, unit = cfg.norm_eps, cfg.norm_unit_offset
        self.eps, self.unit = eps, unit

        def plan(weight: torch.Tensor, norm: torch.Tensor | None = None, row_blocks: int = 1,
                 argmax: bool = False) -> _LinearPlan:
            n, k = weight.shape
            config = tuned_linear_config(B, n // row_blocks, k, row_blocks=row_blocks, argmax=argmax, device=dev)
            return _LinearPlan(weight, config, norm, row_blocks)

        self.layers: list[dict[str, Any]] = []
        for block in model.layers:
            mixer = block.mixer
            entry: dict[str, Any] = {"kind": block.kind, "mixer": mixer}
            if isinstance(mixer, ShortConv):  # in_proj and the conv in one kernel (its epilogue)
                entry["in"] = plan(mixer.in_proj, block.mixer_norm.weight, row_blocks=3)
                entry["out"] = plan(mixer.out_proj)
            elif isinstance(mixer, Attention):
                entry["in"] = plan(mixer.wqkv, block.mixer_norm.weight)
                entry["out"] = plan(mixer.wo)
            elif isinstance(mixer, GatedDeltaNet):
                entry["in"] = plan(mixer.in_proj, block.mixer_norm.weight)
                entry["out"] = plan(mixer.out_proj)
            else:  # pragma: no cover
                raise TypeError(f"no fused kernel for mixer {type(mixer).__name__}")
            entry["gate_up"] = plan(block.mlp.gate_up, block.mlp_norm.weight, row_blocks=2)
            entry["down"] = plan(block.mlp.down)
            self.layers.append(entry)
        self.head = plan(model.lm_head_weight, model.final_norm.weight)
        self.greedy = plan(model.lm_head_weight, model.final_norm.weight, argmax=True)

        # static buffers: one per distinct shape, reused by every layer
        self.tokens = torch.zeros(B, dtype=torch.long, device=dev)
        self.h = torch.empty(B, H, dtype=dt, device=dev)
        self.act = torch.empty(B, cfg.intermediate_size, dtype=dt, device=dev)
        self.logits = torch.empty(B, cfg.vocab_size, dtype=dt, device=dev)
        self.next_tokens = torch.empty(B, dtype=torch.long, device=dev)
        self.proj: dict[str, torch.Tensor] = {}
        self.mixed: dict[str, torch.Tensor] = {}
        for entry in self.layers:
            kind = entry["kind"]
            if kind not in self.mixed:
                if kind != "conv":  # the conv layers' projection never leaves its kernel
                    self.proj[kind] = torch.empty(B, entry["in"].weight.shape[0], dtype=dt, device=dev)
                self.mixed[kind] = torch.empty(B, entry["out"].weight.shape[1], dtype=dt, device=dev)

        need_p = need_c = 0
        for p in [self.head, self.greedy] + [e[name] for e in self.layers for name in ("in", "out", "gate_up", "down")]:
            np_, nc = lin.LinearWorkspace.needed(B, p.outputs, p.config, p.row_blocks)
            need_p, need_c = max(need_p, np_), max(need_c, nc)
        self.linear_ws = lin.LinearWorkspace.allocate(need_p, need_c, dev)
        self.head_buffers = self._head.GreedyHeadBuffers.allocate(B, cfg.vocab_size, self.greedy.config, dev)

        if "attention" in cfg.layer_types:
            self.attn_dims = self._attn.AttentionDims(
                cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.attn_output_gate
            )
            chunk, _ = self._attn.attention_chunk(cache.max_len, cfg.head_dim)
            n_splits = -(-cache.max_len // chunk)
            self.attn_ws = self._attn.AttentionWorkspace.allocate(B, self.attn_dims, n_splits, dev)
        if "gdn" in cfg.layer_types:
            self.gdn_dims = self._gdn.GdnDims(
                cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim
            )
            self.gdn_ws = self._gdn.GdnWorkspace.allocate(B, self.gdn_dims, dev)

    # -- one step ----------------------------------------------------------------------------------
    def _linear(self, p: _LinearPlan, x: torch.Tensor, *, out: torch.Tensor | None = None,
                residual: torch.Tensor | None = None, short_conv: tuple | None = None) -> None:
        self._lin.linear(
            x, p.weight, out=out, residual=residual, norm_weight=p.norm_weight, norm_eps=self.eps,
            norm_unit_offset=self.unit, swiglu=p.row_blocks == 2, short_conv=short_conv, config=p.config,
            workspace=self.linear_ws, pdl=self.pdl,
        )

    def _forward(self, greedy: bool) -> None:
        """Launch one decode step for ``self.tokens``; ``cache.lengths`` is not advanced here."""
        cache, h, pdl = self.cache, self.h, self.pdl
        torch.index_select(self.model.embed.weight, 0, self.tokens, out=h)
        for i, entry in enumerate(self.layers):
            kind, mixer = entry["kind"], entry["mixer"]
            mixed = self.mixed[kind]
            if kind == "conv":
                self._linear(entry["in"], h, out=mixed, short_conv=(cache.conv_states[i], mixer.conv_weight))
            elif kind == "attention":
                proj = self.proj[kind]
                self._linear(entry["in"], h, out=proj)
                self._attn.attention_decode(
                    proj, mixer.q_norm.weight, mixer.k_norm.weight, mixer.inv_freq, cache.keys[i], cache.values[i],
                    cache.lengths, self.attn_dims, self.eps, self.unit, out=mixed, workspace=self.attn_ws, pdl=pdl,
                )
            else:
                proj = self.proj[kind]
                self._linear(entry["in"], h, out=proj)
                self._gdn.gdn_decode(
                    proj, cache.conv_states[i], mixer.conv_weight, mixer.A_log, mixer.dt_bias, mixer.norm_weight,
                    cache.recurrent_states[i], self.gdn_dims, self.eps, out=mixed, workspace=self.gdn_ws, pdl=pdl,
                )
            self._linear(entry["out"], mixed, residual=h)
            self._linear(entry["gate_up"], h, out=self.act)
            self._linear(entry["down"], self.act, residual=h)
        if greedy:
            self._head.greedy_head(
                h, self.greedy.weight, norm_weight=self.greedy.norm_weight, norm_eps=self.eps,
                norm_unit_offset=self.unit, tokens_out=self.next_tokens, config=self.greedy.config,
                buffers=self.head_buffers, workspace=self.linear_ws, pdl=pdl,
            )
        else:
            self._linear(self.head, h, out=self.logits)

    @torch.no_grad()
    def _capture(self, greedy: bool) -> torch.cuda.CUDAGraph:
        """Capture one step (with the device-side length increment) in a CUDA graph.

        Kernels compile and load on a first eager run outside the capture; that run shifts the conv
        and recurrent states, so they are saved and put back (the k/v it writes at position
        ``lengths`` are rewritten by the next real step).
        """
        cache = self.cache
        states = [*cache.conv_states.values(), *cache.recurrent_states.values()]
        saved = [s.clone() for s in states]
        side = torch.cuda.Stream(device=self.model.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(greedy)
        torch.cuda.current_stream().wait_stream(side)
        for s, copy in zip(states, saved):
            s.copy_(copy)
        del saved
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._forward(greedy)
            cache.lengths.add_(1)
        torch.cuda.synchronize(self.model.device)
        return graph

    def _run(self, tokens: torch.Tensor, greedy: bool) -> None:
        cache = self.cache
        B = cache.batch_size
        if not isinstance(tokens, torch.Tensor) or tokens.shape != (B,):
            raise ValueError(f"tokens must be a [{B}] tensor (one per sequence), got {getattr(tokens, 'shape', tokens)!r}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be int64 or int32, got {tokens.dtype}")
        cache.check_room(B, 1)
        self.tokens.copy_(tokens)
        if self.graph:
            self._graphs[greedy].replay()
            cache.advance_host(1)
        else:
            self._forward(greedy)
            cache.advance(1)

    # -- Decoder protocol ----------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, cache=self.cache, last_only=True)[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, vocab] after ``tokens`` [B]; the buffer is overwritten by the next step."""
        self._run(tokens, greedy=False)
        return self.logits

    @torch.no_grad()
    def step_greedy(self, tokens: torch.Tensor) -> torch.Tensor:
        """The argmax tokens [B] after ``tokens`` [B], without writing logits; overwritten next step."""
        self._run(tokens, greedy=True)
        return self.next_tokens


def fused_decoder(model: HybridLM, cache: HybridCache, *, graph: bool = False, pdl: bool = False) -> FusedDecoder:
    """A FusedDecoder for (model, cache), reused while the cache lives: captured graphs stay valid
    because the cache never moves its buffers (``cache.reset()`` zeroes them in place)."""
    key = ("labkit.fused", id(model), graph, pdl)
    decoder = cache.attachments.get(key)
    if not isinstance(decoder, FusedDecoder) or decoder.model is not model:
        decoder = FusedDecoder(model, cache, graph=graph, pdl=pdl)
        cache.attachments[key] = decoder
    return decoder


register("fused", lambda model, cache: fused_decoder(model, cache))
register("fused+graph", lambda model, cache: fused_decoder(model, cache, graph=True))
register("fused+graph+pdl", lambda model, cache: fused_decoder(model, cache, graph=True, pdl=True))
