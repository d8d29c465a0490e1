"""Single decode ops at the real model shapes: checked against their references, then timed the way
a decode step runs them (``python -m labkit bench ops``; notebook 02; the GPU tests).

A decode step streams every weight once, so an op is timed inside a CUDA graph (what the
``fused+graph`` step replays) over enough copies of its weights, recurrent state or KV cache that
nothing is served from the L2 cache (:func:`labkit.lab.timing.measure` with
:func:`labkit.lab.timing.cold_l2_copies`): ``us`` is what one call costs in the middle of a step, and
``bytes / us`` compares with the measured HBM bandwidth. Three implementations of each projection:

- ``"triton"``: labkit's fused kernel (:mod:`labkit.ops.linear`): norm prologue, epilogue, one
  launch, with the configuration the fused backend uses on this GPU (:mod:`labkit.tuning`);
- ``"torch"``: the same function unfused (:func:`labkit.ops.linear.linear_ref`: separate norm,
  cuBLAS matmul, separate epilogue), each piece a kernel of its own, also replayed from a graph;
- ``"cublas"``: the matmul alone (``torch.mm``), the weight stream without any fusion.

The Gated DeltaNet step is timed whole (:func:`labkit.ops.gated_delta_decode.gdn_decode`: conv,
gates, delta rule and gated norm), and beside it flash-linear-attention's
``fused_recurrent_gated_delta_rule`` (the delta rule alone), where fla is installed. Attention
decode, the standalone short conv and the greedy LM head are timed as labkit runs them.

Every ``check_*`` returns the largest relative error of an op's outputs (and of the state it
updates in place) against its reference, on fresh random inputs, outputs poisoned with NaN first;
a non-finite value counts as an infinite error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import tuning
from ..model import HybridLM
from ..lab.timing import cold_l2_copies, measure


def _need_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise RuntimeError(f"op timings need a CUDA GPU (CUDA graphs); the model is on {device}")


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float64; infinite where either holds a NaN or an Inf."""
    got, ref = got.double(), ref.double()
    if not (torch.isfinite(got).all() and torch.isfinite(ref).all()):
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _generator(model: HybridLM, seed: int) -> torch.Generator:
    return torch.Generator(device=model.device).manual_seed(seed)


def _time(model: HybridLM, calls: list) -> float:
    """Microseconds per call of ``calls`` (one per copy of the operands), replayed from a graph."""
    return measure(calls, device=model.device, graph=True).us


@dataclass
class OpTiming:
    model: str
    batch: int
    op: str
    impl: str
    us: float
    bytes: int
    extra: dict = field(default_factory=dict)
    rel_err: float | None = None  # of the op against its reference, checked before it was timed

    def bytes_per_s(self) -> float:
        return self.bytes / (self.us * 1e-6)


# -- projections ---------------------------------------------------------------------------------------
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


def case_config(model: HybridLM, case: LinearCase, batch: int):
    """The configuration the fused backend launches ``case`` with at ``batch`` on the model's device."""
    return tuning.linear_config(batch, case.outputs, case.weight.shape[1], row_blocks=case.row_blocks,
                                device=model.device)


def _linear_inputs(model: HybridLM, case: LinearCase, batch: int, seed: int = 0):
    gen = _generator(model, seed)
    k, dt, dev = case.weight.shape[1], case.weight.dtype, model.device
    x = torch.randn(batch, k, dtype=dt, device=dev, generator=gen)
    res = torch.randn(batch, case.outputs, dtype=dt, device=dev, generator=gen) if case.residual else None
    state = None
    if case.conv_weight is not None:
        state = torch.randn(batch, case.conv_weight.shape[1] - 1, case.outputs, dtype=dt, device=dev, generator=gen)
    return x, res, state


def _linear_common(model: HybridLM, case: LinearCase) -> dict:
    cfg = model.cfg
    return dict(norm_weight=case.norm_weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset,
                swiglu=case.swiglu)


def check_linear(model: HybridLM, case: LinearCase, batch: int, config=None, seed: int = 1) -> float:
    """Relative error of the fused kernel (``config``, else the backend's) against
    :func:`labkit.ops.linear.linear_ref`, and for the short-conv epilogue of the shifted conv state
    against :func:`labkit.ops.short_conv.short_conv_decode_ref`."""
    from ..ops.linear import LinearWorkspace, linear, linear_ref
    from ..ops.short_conv import short_conv_decode_ref

    x, res, state = _linear_inputs(model, case, batch, seed)
    common = _linear_common(model, case)
    config = config or case_config(model, case, batch)
    if state is None:
        ref = linear_ref(x, case.weight, residual=res, **common)
    else:
        ref, state_ref = short_conv_decode_ref(linear_ref(x, case.weight, **common), state, case.conv_weight)
    out = torch.full((batch, case.outputs), float("nan"), dtype=x.dtype, device=x.device)
    if res is not None:
        out.copy_(res)  # the residual is added in place
    new_state = None if state is None else state.clone()
    ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, case.outputs, config, case.row_blocks), x.device)
    linear(x, case.weight, out=out if res is None else None, residual=out if res is not None else None,
           short_conv=None if state is None else (new_state, case.conv_weight), config=config, workspace=ws,
           **common)
    err = rel_err(out, ref)
    return err if state is None else max(err, rel_err(new_state, state_ref))


def time_linear(model: HybridLM, case: LinearCase, batch: int, impl: str = "triton", config=None) -> OpTiming:
    """Microseconds per call of one projection (see the module docstring for ``impl``)."""
    from ..ops.linear import LinearWorkspace, linear, linear_ref

    _need_cuda(model.device)
    x, res, state = _linear_inputs(model, case, batch)
    weights = [case.weight] + [case.weight.clone() for _ in range(cold_l2_copies(case.nbytes, model.device) - 1)]
    common = _linear_common(model, case)
    conv = None if state is None else (state, case.conv_weight)
    extra: dict = {}
    if impl == "triton":
        config = config or case_config(model, case, batch)
        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, case.outputs, config, case.row_blocks), x.device)
        y = torch.empty(batch, case.outputs, dtype=x.dtype, device=x.device)
        extra["config"] = repr(config)
        calls = [lambda w=w: linear(x, w, out=y if res is None else None, residual=res, short_conv=conv,
                                    config=config, workspace=ws, **common) for w in weights]
    elif impl == "torch":
        calls = [lambda w=w: linear_ref(x, w, residual=res, short_conv=conv, **common) for w in weights]
    elif impl == "cublas":
        y_full = torch.empty(batch, case.weight.shape[0], dtype=x.dtype, device=x.device)
        calls = [lambda w=w: torch.mm(x, w.t(), out=y_full) for w in weights]
    else:
        raise ValueError(f"unknown impl {impl!r}; one of 'triton', 'torch', 'cublas'")
    return OpTiming(model.cfg.name, batch, case.name, impl, _time(model, calls), case.nbytes, extra)


# -- Gated DeltaNet --------------------------------------------------------------------------------
def _gdn_operands(model: HybridLM, batch: int, seed: int = 4):
    from ..ops.gated_delta_decode import GdnDims

    cfg = model.cfg
    if "gdn" not in cfg.layer_types:
        raise ValueError(f"{cfg.name} has no Gated DeltaNet layers")
    layer = model.layers[cfg.layer_types.index("gdn")].mixer
    dims = GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
    gen = _generator(model, seed)
    dt, dev = model.dtype, model.device
    proj = torch.randn(batch, dims.proj_dim, dtype=dt, device=dev, generator=gen)
    conv_state = torch.randn(batch, cfg.gdn_conv_kernel - 1, dims.conv_dim, dtype=dt, device=dev, generator=gen)
    state = 0.1 * torch.randn(batch, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, device=dev, generator=gen)
    weights = (layer.conv_weight, layer.A_log, layer.dt_bias, layer.norm_weight)
    return dims, proj, conv_state, state, weights


def gdn_errors(model: HybridLM, batch: int, block_v: int | None = None, seed: int = 4) -> dict[str, float]:
    """Relative errors of the fused Gated DeltaNet step against
    :func:`labkit.ops.gated_delta_decode.gdn_decode_ref`, on fresh random inputs drawn from
    ``seed``: its output, and the conv and recurrent states it updates in place."""
    from ..ops.gated_delta_decode import gdn_decode, gdn_decode_ref

    dims, proj, conv_state, state, w = _gdn_operands(model, batch, seed)
    eps = model.cfg.norm_eps
    out_ref, conv_ref, state_ref = gdn_decode_ref(proj, conv_state, *w, state, dims, eps)
    out = torch.full_like(out_ref, float("nan"))
    gdn_decode(proj, conv_state, *w, state, dims, eps, out=out, block_v=block_v)
    return {"out": rel_err(out, out_ref), "conv_state": rel_err(conv_state, conv_ref), "state": rel_err(state, state_ref)}


def check_gdn(model: HybridLM, batch: int, block_v: int | None = None, seed: int = 4) -> float:
    """The largest of :func:`gdn_errors`."""
    return max(gdn_errors(model, batch, block_v, seed).values())


def time_gdn(model: HybridLM, batch: int, impl: str = "triton", block_v: int | None = None) -> OpTiming:
    """One Gated DeltaNet decode step of one layer: ``"triton"`` is labkit's whole fused step
    (conv, gates, L2 norms, delta rule, gated RMSNorm); ``"fla"`` is fla's recurrent delta rule
    alone (q, k, v and gates given), the peer for the part that moves the state."""
    from ..ops.gated_delta_decode import GdnWorkspace, gdn_decode

    _need_cuda(model.device)
    dims, proj, conv_state, state, w = _gdn_operands(model, batch)
    state_bytes = state.numel() * state.element_size()
    states = [state.clone() for _ in range(cold_l2_copies(state_bytes, model.device))]
    if impl == "triton":
        convs = [conv_state.clone() for _ in states]
        ws = GdnWorkspace.allocate(batch, dims, model.device)
        out = torch.empty(batch, dims.num_v_heads * dims.v_head_dim, dtype=model.dtype, device=model.device)
        nbytes = 2 * state_bytes + proj.numel() * 2 + 2 * conv_state.numel() * 2 + out.numel() * 2
        calls = [lambda c=c, s=s: gdn_decode(proj, c, *w, s, dims, model.cfg.norm_eps, out=out, workspace=ws,
                                             block_v=block_v) for c, s in zip(convs, states)]
    elif impl == "fla":
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # the peer; ImportError if absent

        H, K, V, dt, dev = dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, model.dtype, model.device
        q = torch.randn(batch, 1, H, K, dtype=dt, device=dev)
        k = torch.nn.functional.normalize(torch.randn(batch, 1, H, K, device=dev), dim=-1).to(dt)
        v = torch.randn(batch, 1, H, V, dtype=dt, device=dev)
        g = -torch.rand(batch, 1, H, device=dev)
        beta = torch.rand(batch, 1, H, device=dev).to(dt)
        nbytes = 2 * state_bytes
        calls = [lambda s=s: fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=s, output_final_state=True)
                 for s in states]
    else:
        raise ValueError(f"unknown impl {impl!r}; one of 'triton', 'fla'")
    extra = {"block_v": block_v} if block_v is not None else {}
    return OpTiming(model.cfg.name, batch, "gated deltanet step", impl, _time(model, calls), nbytes, extra)


# -- attention ---------------------------------------------------------------------------------------
def cache_lengths(batch: int, max_len: int) -> list[int]:
    """Cached positions per sequence: a long context for batch 1; for more, a long one, an empty
    one, a full-but-one one (the last slot) and a spread of others (many chunks to merge, RoPE at
    large angles, ragged lengths)."""
    long = max_len - 96 if max_len > 96 else max_len // 2
    if batch == 1:
        return [long]
    return ([long, 0, max_len - 1] + [(257 * i) % max_len for i in range(1, batch)])[:batch]


def _attention_operands(model: HybridLM, batch: int, max_len: int, lengths: list[int] | None, seed: int):
    from ..ops.attention_decode import AttentionDims

    cfg = model.cfg
    layer = model.layers[cfg.layer_types.index("attention")].mixer
    dims = AttentionDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.attn_output_gate)
    gen, dt, dev = _generator(model, seed), model.dtype, model.device
    proj = torch.randn(batch, dims.proj_dim, dtype=dt, device=dev, generator=gen)
    shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    keys = torch.randn(shape, dtype=dt, device=dev, generator=gen)
    values = torch.randn(shape, dtype=dt, device=dev, generator=gen)
    lengths = cache_lengths(batch, max_len) if lengths is None else lengths
    if len(lengths) != batch or not all(0 <= n < max_len for n in lengths):
        raise ValueError(f"need {batch} cache lengths in [0, {max_len}), got {lengths}")
    lengths = torch.tensor(lengths, dtype=torch.int32, device=dev)
    weights = (layer.q_norm.weight, layer.k_norm.weight, layer.inv_freq)
    return dims, proj, keys, values, lengths, weights


def check_attention(model: HybridLM, batch: int, max_len: int, lengths: list[int] | None = None,
                    seed: int = 5, chunk: int | None = None) -> float:
    """Largest relative error of the attention decode step (output, and the new key and value it
    writes into the cache) against :func:`labkit.ops.attention_decode.attention_decode_ref`."""
    from ..ops.attention_decode import attention_decode, attention_decode_ref

    cfg = model.cfg
    dims, proj, keys, values, lengths, w = _attention_operands(model, batch, max_len, lengths, seed)
    args = (dims, cfg.norm_eps, cfg.norm_unit_offset)
    out_ref, k_ref, v_ref = attention_decode_ref(proj, *w, keys, values, lengths, *args)
    out = torch.full_like(out_ref, float("nan"))
    attention_decode(proj, *w, keys, values, lengths, *args, out=out, chunk=chunk)
    return max(rel_err(out, out_ref), rel_err(keys, k_ref), rel_err(values, v_ref))


def time_attention(model: HybridLM, batch: int, max_len: int = 4096, lengths: list[int] | None = None,
                   chunk: int | None = None) -> OpTiming:
    """One attention decode step of one layer (norms, RoPE, cache write, attention over the cache);
    ``bytes`` counts the cached positions actually read; ``chunk``: positions per program (default
    :func:`~labkit.ops.attention_decode.attention_chunk`'s heuristic)."""
    from ..ops.attention_decode import AttentionWorkspace, attention_chunk, attention_decode

    _need_cuda(model.device)
    cfg = model.cfg
    dims, proj, keys, values, lengths, w = _attention_operands(model, batch, max_len, lengths, seed=5)
    chunk = chunk or attention_chunk(max_len, cfg.head_dim)[0]
    ws = AttentionWorkspace.allocate(batch, dims, -(-max_len // chunk), model.device)
    kv_bytes = 2 * keys.numel() * keys.element_size()
    kv = [(keys, values)] + [(keys.clone(), values.clone()) for _ in range(cold_l2_copies(kv_bytes, model.device, cap=16) - 1)]
    out = torch.empty(batch, dims.num_heads * dims.head_dim, dtype=model.dtype, device=model.device)
    calls = [lambda kk=kk, vv=vv: attention_decode(proj, *w, kk, vv, lengths, dims, cfg.norm_eps, cfg.norm_unit_offset,
                                                   out=out, workspace=ws, chunk=chunk) for kk, vv in kv]
    n_pos = int(lengths.sum()) + batch
    nbytes = 2 * n_pos * cfg.num_kv_heads * cfg.head_dim * keys.element_size() + proj.numel() * proj.element_size()
    context = {"max_len": max_len, "mean_context": float(lengths.float().mean())}
    return OpTiming(cfg.name, batch, "attention step", "triton", _time(model, calls), nbytes, context)


# -- short conv and greedy head --------------------------------------------------------------------
def _short_conv_operands(model: HybridLM, batch: int, seed: int):
    cfg = model.cfg
    if "conv" not in cfg.layer_types:
        raise ValueError(f"{cfg.name} has no short-conv layers")
    layer = model.layers[cfg.layer_types.index("conv")].mixer
    gen, H = _generator(model, seed), cfg.hidden_size
    proj = torch.randn(batch, 3 * H, dtype=model.dtype, device=model.device, generator=gen)
    state = torch.randn(batch, cfg.conv_kernel - 1, H, dtype=model.dtype, device=model.device, generator=gen)
    return proj, state, layer.conv_weight


def check_short_conv(model: HybridLM, batch: int, seed: int = 3) -> float:
    """Largest relative error of the standalone short-conv kernel (output and shifted state) against
    :func:`labkit.ops.short_conv.short_conv_decode_ref`."""
    from ..ops.short_conv import short_conv_decode, short_conv_decode_ref

    proj, state, conv_weight = _short_conv_operands(model, batch, seed)
    y_ref, state_ref = short_conv_decode_ref(proj, state, conv_weight)
    out = torch.full_like(y_ref, float("nan"))
    short_conv_decode(proj, state, conv_weight, out=out)
    return max(rel_err(out, y_ref), rel_err(state, state_ref))


def time_short_conv(model: HybridLM, batch: int) -> OpTiming:
    """The standalone short conv (conv, state shift, gates) of one layer; the fused backend runs it
    in in_proj's epilogue instead."""
    from ..ops.short_conv import short_conv_decode

    _need_cuda(model.device)
    proj, state, conv_weight = _short_conv_operands(model, batch, seed=3)
    out = torch.empty(batch, proj.shape[1] // 3, dtype=model.dtype, device=model.device)
    states = [state.clone() for _ in range(16)]  # small: these stay in L2 as in a step
    calls = [lambda s=s: short_conv_decode(proj, s, conv_weight, out=out) for s in states]
    nbytes = (proj.numel() + 2 * state.numel() + out.numel() + conv_weight.numel()) * proj.element_size()
    return OpTiming(model.cfg.name, batch, "short conv step", "triton", _time(model, calls), nbytes)


def _greedy_operands(model: HybridLM, batch: int, seed: int):
    cfg = model.cfg
    x = torch.randn(batch, cfg.hidden_size, dtype=model.dtype, device=model.device, generator=_generator(model, seed))
    norm = dict(norm_weight=model.final_norm.weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset)
    config = tuning.linear_config(batch, cfg.vocab_size, cfg.hidden_size, argmax=True, device=model.device)
    return x, norm, config


def check_greedy_head(model: HybridLM, batch: int, seed: int = 7) -> dict[str, float]:
    """The greedy LM head: ``logits_rel_err`` of the logits it writes against the reference
    projection, ``own_argmax_mismatch`` (fraction of rows whose token is not the argmax of the
    logits it wrote: must be 0) and ``ref_disagreement`` (fraction of rows whose token differs from
    :func:`labkit.ops.greedy_head.greedy_head_ref`: near-ties of rounded logits may flip)."""
    from ..ops.greedy_head import greedy_head, greedy_head_ref
    from ..ops.linear import linear_ref

    x, norm, config = _greedy_operands(model, batch, seed)
    w = model.lm_head_weight
    logits = torch.full((batch, w.shape[0]), float("nan"), dtype=w.dtype, device=w.device)
    tokens = greedy_head(x, w, logits_out=logits, config=config, **norm)
    return {
        "logits_rel_err": rel_err(logits, linear_ref(x, w, **norm)),
        "own_argmax_mismatch": (tokens != logits.argmax(-1)).float().mean().item(),
        "ref_disagreement": (tokens != greedy_head_ref(x, w, **norm)).float().mean().item(),
    }


def time_greedy_head(model: HybridLM, batch: int) -> OpTiming:
    """The final norm + LM head + argmax (two launches), without writing logits."""
    from ..ops.greedy_head import GreedyHeadBuffers, greedy_head

    _need_cuda(model.device)
    x, norm, config = _greedy_operands(model, batch, seed=7)
    w = model.lm_head_weight
    buffers = GreedyHeadBuffers.allocate(batch, w.shape[0], config, model.device)
    tokens = torch.empty(batch, dtype=torch.long, device=model.device)
    nbytes = w.numel() * w.element_size()
    weights = [w] + [w.clone() for _ in range(cold_l2_copies(nbytes, model.device, cap=4) - 1)]
    calls = [lambda w=w: greedy_head(x, w, tokens_out=tokens, config=config, buffers=buffers, **norm) for w in weights]
    return OpTiming(model.cfg.name, batch, "norm+lm_head+argmax", "triton", _time(model, calls), nbytes,
                    {"config": repr(config)})


# -- everything, as `python -m labkit bench ops` runs it --------------------------------------------
def bench_ops(model: HybridLM, batch: int, max_len: int = 4096, bound: float = 1e-2, peers: bool = True,
              copy_bytes_per_s: float | None = None, log=print) -> list[OpTiming]:
    """Check, then time, every op of ``model``'s decode step at ``batch``: each projection (triton,
    torch, cublas), the greedy head, the Gated DeltaNet step (and fla's, where installed),
    attention over ``max_len`` cached positions and the standalone short conv. A check above
    ``bound`` raises: a wrong kernel is not timed. Printed rows compare with ``copy_bytes_per_s``
    (:func:`labkit.lab.hw.device_facts`' measured copy bandwidth) where it is given."""
    rows: list[OpTiming] = []

    def checked(what: str, err: float) -> float:
        if not err <= bound:
            raise AssertionError(f"{model.cfg.name} B={batch} {what}: relative error {err:.2e} > {bound:.0e}")
        return err

    def add(row: OpTiming, err: float | None) -> None:
        row.rel_err = err
        rows.append(row)
        share = f" ({row.bytes_per_s() / copy_bytes_per_s:4.0%} of copy)" if copy_bytes_per_s else ""
        log(f"{row.model:>14} B={row.batch:<3} {row.op:34} {row.impl:7} {row.us:9.2f} µs "
            f"{row.bytes_per_s() / 1e9:8.0f} GB/s{share}")

    for case in linear_cases(model):
        err = checked(f"linear {case.name}", check_linear(model, case, batch))
        for impl in ("triton", "torch", "cublas"):
            add(time_linear(model, case, batch, impl), err if impl == "triton" else None)
    head = check_greedy_head(model, batch)
    checked("greedy head logits", head["logits_rel_err"])
    if head["own_argmax_mismatch"]:
        raise AssertionError(f"{model.cfg.name} B={batch}: greedy head tokens are not the argmax of its own logits")
    add(time_greedy_head(model, batch), head["logits_rel_err"])
    types = model.cfg.layer_types
    if "gdn" in types:
        add(time_gdn(model, batch), checked("gated deltanet step", check_gdn(model, batch)))
        if peers:
            try:
                add(time_gdn(model, batch, "fla"), None)
            except ImportError:
                log("  (fla is not importable: no peer timing for the Gated DeltaNet step)")
    if "attention" in types:
        add(time_attention(model, batch, max_len), checked("attention step", check_attention(model, batch, max_len)))
    if "conv" in types:
        add(time_short_conv(model, batch), checked("short conv step", check_short_conv(model, batch)))
    return rows
