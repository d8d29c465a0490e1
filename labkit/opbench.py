"""Single decode ops at the real model shapes, timed the way a decode step runs them.

A decode step streams every weight once, so an op is timed inside a CUDA graph (what the
``fused+graph`` step replays) over enough copies of its weights, or of its recurrent state, that
nothing is served from the L2 cache: ``us`` is what one call costs in the middle of a step, and
``bytes / us`` compares with the measured HBM bandwidth. Three implementations of each projection:

- ``"triton"``: labkit's fused kernel (:mod:`labkit.ops.linear`): norm prologue, epilogue, one launch;
- ``"torch"``: the same function unfused (:func:`labkit.ops.linear.linear_ref`: separate norm,
  cuBLAS matmul, separate epilogue), each piece a kernel of its own, also replayed from a graph;
- ``"cublas"``: the matmul alone (``torch.mm``), the weight stream without any fusion.

The Gated DeltaNet step is timed whole (:func:`labkit.ops.gated_delta_decode.gdn_decode`: conv,
gates, delta rule and gated norm), and beside it flash-linear-attention's
``fused_recurrent_gated_delta_rule`` (the delta rule alone), where fla is installed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from .model import HybridLM


def _need_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise RuntimeError(f"op timings need a CUDA GPU (CUDA graphs); the model is on {device}")


def graph_us(calls: Callable[[], object], n_calls: int, reps: int = 15) -> float:
    """Median microseconds per call of ``calls()`` (which launches ``n_calls`` ops), captured once in
    a CUDA graph and replayed ``reps`` times: each op pays what it pays inside a decode graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (Triton compiles, cuBLAS picks kernels) outside the capture
        calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n_calls)
    return statistics.median(times)


def copies_for(nbytes: int, device: torch.device | str = "cuda", cap: int = 64) -> int:
    """Copies to rotate over so that the working set is ~3x the L2 cache: each call then streams
    its operand from HBM, as in a decode step where the other layers' weights evicted it."""
    props = torch.cuda.get_device_properties(torch.device(device))
    l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
    return max(1, min(cap, math.ceil(3 * l2 / max(nbytes, 1))))


@dataclass
class LinearCase:
    """One projection of a decode step, as the fused backend runs it."""

    name: str
    weight: torch.Tensor  # [row_blocks * outputs, K]
    norm_weight: torch.Tensor | None = None
    residual: bool = False
    swiglu: bool = False
    conv_weight: torch.Tensor | None = None  # LFM2's short conv fused into in_proj

    @property
    def row_blocks(self) -> int:
        return 2 if self.swiglu else 3 if self.conv_weight is not None else 1

    @property
    def outputs(self) -> int:
        return self.weight.shape[0] // self.row_blocks

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def kwargs(self) -> dict:
        return {"norm_weight": self.norm_weight, "residual": self.residual, "swiglu": self.swiglu,
                "short_conv": self.conv_weight}

    def without_norm(self) -> "LinearCase":
        return LinearCase(self.name.replace("+norm", "") + " (no norm)", self.weight, None, self.residual,
                          self.swiglu, self.conv_weight)


def linear_cases(model: HybridLM, lm_head: bool = True) -> list[LinearCase]:
    """Every distinct projection of a decode step (the first layer of each kind), fused as in the
    ``fused`` backend: norms in the prologue, residual / SwiGLU / short conv in the epilogue."""
    cases, seen = [], set()
    for block in model.layers:
        if block.kind in seen:
            continue
        seen.add(block.kind)
        m, norm = block.mixer, block.mixer_norm.weight
        if block.kind == "conv":
            cases.append(LinearCase("conv.in_proj+norm+short_conv", m.in_proj, norm, conv_weight=m.conv_weight))
            cases.append(LinearCase("conv.out_proj+residual", m.out_proj, residual=True))
        elif block.kind == "attention":
            cases.append(LinearCase("attention.wqkv+norm", m.wqkv, norm))
            cases.append(LinearCase("attention.wo+residual", m.wo, residual=True))
        else:
            cases.append(LinearCase("gdn.in_proj+norm", m.in_proj, norm))
            cases.append(LinearCase("gdn.out_proj+residual", m.out_proj, residual=True))
    block = model.layers[0]
    cases.append(LinearCase("mlp.gate_up+norm+swiglu", block.mlp.gate_up, block.mlp_norm.weight, swiglu=True))
    cases.append(LinearCase("mlp.down+residual", block.mlp.down, residual=True))
    if lm_head:
        cases.append(LinearCase("lm_head+norm", model.lm_head_weight, model.final_norm.weight))
    return cases


@dataclass
class OpTiming:
    model: str
    batch: int
    op: str
    impl: str
    us: float
    bytes: int
    extra: dict = field(default_factory=dict)

    def bytes_per_s(self) -> float:
        return self.bytes / (self.us * 1e-6)


def _inputs(model: HybridLM, case: LinearCase, batch: int, seed: int = 0):
    gen = torch.Generator(device=model.device).manual_seed(seed)
    k, dt, dev = case.weight.shape[1], case.weight.dtype, model.device
    x = torch.randn(batch, k, dtype=dt, device=dev, generator=gen)
    res = torch.randn(batch, case.outputs, dtype=dt, device=dev, generator=gen) if case.residual else None
    state = None
    if case.conv_weight is not None:
        state = torch.randn(batch, case.conv_weight.shape[1] - 1, case.outputs, dtype=dt, device=dev, generator=gen)
    return x, res, state


def check_linear(model: HybridLM, case: LinearCase, batch: int, config=None) -> float:
    """Relative error of the fused kernel against :func:`labkit.ops.linear.linear_ref` (the output
    buffer poisoned with NaN first, so an element the kernel does not write fails)."""
    from .ops.linear import linear, linear_ref

    cfg = model.cfg
    x, res, state = _inputs(model, case, batch, seed=1)
    common = dict(norm_weight=case.norm_weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset,
                  swiglu=case.swiglu)
    conv = None if state is None else (state, case.conv_weight)
    ref = linear_ref(x, case.weight, residual=res, short_conv=conv, **common).double()
    out = torch.full((batch, case.outputs), float("nan"), dtype=x.dtype, device=x.device)
    if res is not None:
        out.copy_(res)
    got = linear(x, case.weight, out=out if res is None else None, residual=out if res is not None else None,
                 short_conv=None if state is None else (state.clone(), case.conv_weight), config=config, **common)
    got = got.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def time_linear(model: HybridLM, case: LinearCase, batch: int, impl: str = "triton", config=None) -> OpTiming:
    """Microseconds per call of one projection (see the module docstring for ``impl``)."""
    from .ops.linear import LinearWorkspace, linear, linear_config, linear_ref

    _need_cuda(model.device)
    cfg = model.cfg
    x, res, state = _inputs(model, case, batch)
    copies = copies_for(case.nbytes, model.device)
    weights = [case.weight] + [case.weight.clone() for _ in range(copies - 1)]
    common = dict(norm_weight=case.norm_weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset,
                  swiglu=case.swiglu)
    conv = None if state is None else (state, case.conv_weight)
    extra: dict = {}
    if impl == "triton":
        config = config or linear_config(batch, case.outputs, x.shape[1], row_blocks=case.row_blocks)
        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, case.outputs, config, case.row_blocks), x.device)
        y = torch.empty(batch, case.outputs, dtype=x.dtype, device=x.device)
        extra["config"] = repr(config)

        def calls():
            for w in weights:
                linear(x, w, out=y if res is None else None, residual=res, short_conv=conv, config=config,
                       workspace=ws, **common)
    elif impl == "torch":
        def calls():
            for w in weights:
                linear_ref(x, w, residual=res, short_conv=conv, **common)
    elif impl == "cublas":
        y_full = torch.empty(batch, case.weight.shape[0], dtype=x.dtype, device=x.device)

        def calls():
            for w in weights:
                torch.mm(x, w.t(), out=y_full)
    else:
        raise ValueError(f"unknown impl {impl!r}; one of 'triton', 'torch', 'cublas'")
    us = graph_us(calls, copies)
    return OpTiming(model.cfg.name, batch, case.name, impl, us, case.nbytes, extra)


def _gdn_operands(model: HybridLM, batch: int):
    from .ops.gated_delta_decode import GdnDims

    cfg = model.cfg
    if "gdn" not in cfg.layer_types:
        raise ValueError(f"{cfg.name} has no Gated DeltaNet layers")
    layer = model.layers[cfg.layer_types.index("gdn")].mixer
    dims = GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
    gen = torch.Generator(device=model.device).manual_seed(4)
    dt, dev = model.dtype, model.device
    proj = torch.randn(batch, dims.proj_dim, dtype=dt, device=dev, generator=gen)
    conv_state = torch.randn(batch, cfg.gdn_conv_kernel - 1, dims.conv_dim, dtype=dt, device=dev, generator=gen)
    state = 0.1 * torch.randn(batch, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, device=dev, generator=gen)
    weights = (layer.conv_weight, layer.A_log, layer.dt_bias, layer.norm_weight)
    return dims, proj, conv_state, state, weights


def check_gdn(model: HybridLM, batch: int, block_v: int | None = None) -> float:
    """Largest relative error of the fused Gated DeltaNet step (output and recurrent state) against
    :func:`labkit.ops.gated_delta_decode.gdn_decode_ref`."""
    from .ops.gated_delta_decode import gdn_decode, gdn_decode_ref

    dims, proj, conv_state, state, w = _gdn_operands(model, batch)
    eps = model.cfg.norm_eps
    c_ref, s_ref = conv_state.clone(), state.clone()
    out_ref, _, state_ref = gdn_decode_ref(proj, c_ref, *w, s_ref, dims, eps)
    out = gdn_decode(proj, conv_state, *w, state, dims, eps, block_v=block_v)

    def rel(a, b):
        a, b = a.double(), b.double()
        return float("inf") if not torch.isfinite(a).all() else ((a - b).norm() / b.norm()).item()

    return max(rel(out, out_ref), rel(state, state_ref))


def time_gdn(model: HybridLM, batch: int, impl: str = "triton", block_v: int | None = None) -> OpTiming:
    """One Gated DeltaNet decode step of one layer: ``"triton"`` is labkit's whole fused step
    (conv, gates, L2 norms, delta rule, gated RMSNorm); ``"fla"`` is fla's recurrent delta rule
    alone (q, k, v and gates given), the peer for the part that moves the state."""
    from .ops.gated_delta_decode import GdnWorkspace, gdn_decode

    _need_cuda(model.device)
    dims, proj, conv_state, state, w = _gdn_operands(model, batch)
    state_bytes = state.numel() * state.element_size()
    copies = copies_for(state_bytes, model.device)
    states = [state.clone() for _ in range(copies)]
    if impl == "triton":
        convs = [conv_state.clone() for _ in range(copies)]
        ws = GdnWorkspace.allocate(batch, dims, model.device)
        out = torch.empty(batch, dims.num_v_heads * dims.v_head_dim, dtype=model.dtype, device=model.device)
        nbytes = 2 * state_bytes + proj.numel() * 2 + 2 * conv_state.numel() * 2 + out.numel() * 2

        def calls():
            for c, s in zip(convs, states):
                gdn_decode(proj, c, *w, s, dims, model.cfg.norm_eps, out=out, workspace=ws, block_v=block_v)
    elif impl == "fla":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # the peer; ImportError if absent

        H, K, V, dt, dev = dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, model.dtype, model.device
        q = torch.randn(batch, 1, H, K, dtype=dt, device=dev)
        k = torch.nn.functional.normalize(torch.randn(batch, 1, H, K, device=dev), dim=-1).to(dt)
        v = torch.randn(batch, 1, H, V, dtype=dt, device=dev)
        g = -torch.rand(batch, 1, H, device=dev)
        beta = torch.rand(batch, 1, H, device=dev).to(dt)
        nbytes = 2 * state_bytes

        def calls():
            for s in states:
                fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=s, output_final_state=True)
    else:
        raise ValueError(f"unknown impl {impl!r}; one of 'triton', 'fla'")
    us = graph_us(calls, copies)
    extra = {"block_v": block_v} if block_v is not None else {}
    return OpTiming(model.cfg.name, batch, "gated deltanet step", impl, us, nbytes, extra)
