"""``python -m labkit bench chain``: the decode step's projections chained back to back in one CUDA
graph, weights only, so that the cost of streaming the weights can be read apart from the mixers.

Every weight matrix of a preset (each layer's in/out projections and MLP, in step order) and the LM
head, each launched once with its own input and output buffers, captured in one graph and replayed:
no mixers, no data passing from kernel to kernel beyond what the stream (or PDL) orders. The GEMV
that runs each matrix is pluggable (:data:`GEMVS`, :func:`register_gemv`): any callable with
:func:`labkit.ops.linear.linear`'s signature. Built in:

- ``"linear"``: labkit's fused projection as the ``fused`` backend launches it (norm prologue,
  residual / SwiGLU / short-conv epilogue, the tuned configuration of this GPU), PDL on or off;
- ``"plain"`` / ``"plain-tma"``: :func:`labkit.ops.plain_gemv.plain_gemv` over the stacked weight,
  pointer loads or TMA tensor descriptors, no fusions (batch 1 only);
- ``"cuda-tma"``: :func:`labkit.cuda.tma_linear` (kernels/tma_gemv.cu, the CUDA C++ TMA weight
  stream, its tuned or default config) over the stacked weight, no fusions;
- ``"cublas"``: ``torch.mm`` over the stacked weight, no fusions;
- ``"step"``: as the fused step runs each projection: ``"linear"``, or ``"torch"`` at the keys
  the tuning file dispatches to it (batch >= 16);
- ``"torch"``: the fused function unfused (:func:`labkit.ops.linear.linear_unfused`: a one-kernel
  norm, cuBLAS's matmul, a one-kernel epilogue), what the step runs where the tuning file
  dispatches to cuBLAS. (Until 2026-12-01 this was :func:`labkit.ops.linear.linear_ref`, the
  float32 reference: ~10 kernels per norm, 641 kernels for LFM2-350M's chain at 1.7 ms.)

Outputs: the chain's total time and bytes / time; per group of kernels that share a tuning key
(:func:`labkit.ops.linear.tuning_key`), the time per kernel measured as a sub-chain of just that
group (with weight copies where the group alone would fit in L2), and the per-kernel fit
``t = t0 + bytes / BW`` over the groups (:func:`fit_per_kernel`), to set beside the plain chain's
~1.5 us + bytes / 4.3 TB/s. Every GEMV is checked against its reference at the real shapes, its
outputs poisoned with NaN first, before anything is timed.
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..model import HybridLM
from .ops import LinearCase, rel_err

BOUND = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}


# -- the fit -------------------------------------------------------------------------------------------
@dataclass
class KernelFit:
    """``us = t0_us + bytes / bytes_per_s * 1e6`` per kernel."""

    t0_us: float
    bytes_per_s: float
    r2: float

    def predict_us(self, nbytes: float) -> float:
        return self.t0_us + nbytes / self.bytes_per_s * 1e6


def fit_per_kernel(nbytes: Sequence[float], us: Sequence[float], weights: Sequence[float] | None = None) -> KernelFit:
    """Weighted least squares of ``us`` on ``nbytes`` (weights: how many kernels each point stands
    for). Needs two distinct sizes; a non-positive slope (time not growing with bytes) is an error,
    not a fit with an infinite bandwidth."""
    if len(nbytes) != len(us) or len(us) < 2:
        raise ValueError(f"need at least two (bytes, us) points of equal count, got {len(nbytes)} and {len(us)}")
    w = [1.0] * len(us) if weights is None else [float(v) for v in weights]
    if len(w) != len(us) or any(v <= 0 for v in w):
        raise ValueError("weights must be positive, one per point")
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, nbytes)) / sw
    my = sum(wi * y for wi, y in zip(w, us)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, nbytes))
    if sxx == 0:
        raise ValueError("all points have the same byte count: the fit needs two distinct sizes")
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, nbytes, us)) / sxx
    if not slope > 0:
        raise ValueError(f"time does not grow with bytes (slope {slope:.3g} us/byte): no bandwidth to fit")
    t0 = my - slope * mx
    syy = sum(wi * (y - my) ** 2 for wi, y in zip(w, us))
    resid = sum(wi * (y - t0 - slope * x) ** 2 for wi, x, y in zip(w, nbytes, us))
    return KernelFit(t0, 1e6 / slope, 1.0 - resid / syy if syy > 0 else 1.0)


# -- the chain -----------------------------------------------------------------------------------------
@dataclass
class ChainOp:
    """One projection of the step: layer, what it is (a :class:`LinearCase` with its fusions)."""

    layer: int  # -1: the LM head
    case: LinearCase

    @property
    def name(self) -> str:
        return f"{'head' if self.layer < 0 else f'L{self.layer}'} {self.case.name}"

    def key(self, batch: int):
        from ..ops.linear import tuning_key

        return tuning_key(batch, self.case.outputs, self.case.weight.shape[1], row_blocks=self.case.row_blocks)


def chain_ops(model: HybridLM, lm_head: bool = True) -> list[ChainOp]:
    """Every projection of a decode step, in step order, fused as the ``fused`` backend fuses them."""
    ops = []
    for i, block in enumerate(model.layers):
        m, norm = block.mixer, block.mixer_norm.weight
        if block.kind == "conv":
            ops += [ChainOp(i, LinearCase("conv.in_proj+norm+short_conv", m.in_proj, norm, conv_weight=m.conv_weight)),
                    ChainOp(i, LinearCase("conv.out_proj+residual", m.out_proj, residual=True))]
        elif block.kind == "attention":
            ops += [ChainOp(i, LinearCase("attention.wqkv+norm", m.wqkv, norm)),
                    ChainOp(i, LinearCase("attention.wo+residual", m.wo, residual=True))]
        else:
            ops += [ChainOp(i, LinearCase("gdn.in_proj+norm", m.in_proj, norm)),
                    ChainOp(i, LinearCase("gdn.out_proj+residual", m.out_proj, residual=True))]
        ops += [ChainOp(i, LinearCase("mlp.gate_up+norm+swiglu", block.mlp.gate_up, block.mlp_norm.weight, swiglu=True)),
                ChainOp(i, LinearCase("mlp.down+residual", block.mlp.down, residual=True))]
    if lm_head:
        ops.append(ChainOp(-1, LinearCase("lm_head+norm", model.lm_head_weight, model.final_norm.weight)))
    return ops


# -- pluggable GEMVs -----------------------------------------------------------------------------------
@dataclass
class Gemv:
    """A GEMV for the chain: ``fn`` has :func:`labkit.ops.linear.linear`'s signature. ``fused``:
    it runs the step's fusions (else it multiplies the stacked weight alone, output [M, rows]);
    ``batch1``: it only takes one row; ``configs``: it takes ``labkit.ops.linear`` configurations."""

    fn: Callable
    fused: bool = True
    batch1: bool = False
    configs: bool = False


def _linear(*args, **kwargs):
    from ..ops.linear import linear

    return linear(*args, **kwargs)


def _plain(style: str) -> Callable:
    def run(x, weight, *, out=None, pdl=False, **_):
        from ..ops.plain_gemv import plain_gemv

        k = weight.shape[1]
        if style == "descriptor":  # a TMA box side is at most 256 elements: the loop is pipelined instead
            return plain_gemv(x, weight, out=out, block_n=32, block_k=min(256, 1 << (k - 1).bit_length()),
                              style=style, num_warps=4, num_stages=3, pdl=pdl)
        return plain_gemv(x, weight, out=out, block_n=4, block_k=min(1024, 1 << (k - 1).bit_length()),
                          style=style, num_warps=4, num_stages=1, pdl=pdl)
    return run


def _cuda_tma(x, weight, *, out=None, pdl=False, **_):
    from ..cuda import tma_linear

    return tma_linear(x, weight, out=out, pdl=pdl)


def _cublas(x, weight, *, out=None, **_):
    return torch.mm(x, weight.t(), out=out)


def _torch(x, weight, *, out=None, residual=None, short_conv=None, pdl=False, **common):
    """The same function unfused (:func:`labkit.ops.linear.linear_unfused`): a one-kernel norm,
    cuBLAS's matmul (addmm with the residual), a one-kernel SwiGLU or short conv."""
    from ..ops.linear import linear_unfused

    return linear_unfused(x, weight, out=out, residual=residual, short_conv=short_conv, **common)


def _step(x, weight, *, swiglu=False, short_conv=None, **kwargs):
    """What the fused step runs: labkit's kernel, or the unfused path at keys the tuning file
    dispatches to it (:func:`labkit.tuning.linear_impl`)."""
    from .. import tuning

    row_blocks = 2 if swiglu else 3 if short_conv is not None else 1
    impl = tuning.linear_impl(x.shape[0], weight.shape[0] // row_blocks, weight.shape[1], row_blocks=row_blocks,
                              device=x.device)
    if impl == "torch":
        for name in ("config", "workspace", "placement"):
            kwargs.pop(name, None)
        return _torch(x, weight, swiglu=swiglu, short_conv=short_conv, **kwargs)
    return _linear(x, weight, swiglu=swiglu, short_conv=short_conv, **kwargs)


GEMVS: dict[str, Gemv] = {
    "linear": Gemv(_linear, fused=True, configs=True),
    "plain": Gemv(_plain("pointer"), fused=False, batch1=True),
    "plain-tma": Gemv(_plain("descriptor"), fused=False, batch1=True),
    "cuda-tma": Gemv(_cuda_tma, fused=False),
    "cublas": Gemv(_cublas, fused=False),
    "torch": Gemv(_torch, fused=True),
    "step": Gemv(_step, fused=True, configs=True),
}


def register_gemv(name: str, fn: Callable, *, fused: bool = True, batch1: bool = False, configs: bool = False) -> None:
    """Plug in another GEMV (e.g. a CUDA kernel with :func:`labkit.ops.linear.linear`'s signature)."""
    if name in GEMVS:
        raise ValueError(f"a GEMV named {name!r} is registered already")
    GEMVS[name] = Gemv(fn, fused, batch1, configs)


@dataclass
class _Bound:
    """One op's operands and the call that runs it."""

    op: ChainOp
    call: Callable[[], object]
    out: torch.Tensor
    reference: Callable[[], torch.Tensor]
    nbytes: int


def _bind(model: HybridLM, op: ChainOp, weight: torch.Tensor, batch: int, gemv: Gemv, pdl: bool, config,
          placement, workspace, gen: torch.Generator) -> _Bound:
    from ..ops.linear import linear_ref

    case, cfg = op.case, model.cfg
    k, dt, dev = weight.shape[1], weight.dtype, weight.device
    x = torch.randn(batch, k, dtype=dt, device=dev, generator=gen)
    nbytes = weight.numel() * weight.element_size()
    if not gemv.fused:
        out = torch.empty(batch, weight.shape[0], dtype=dt, device=dev)
        return _Bound(op, lambda: gemv.fn(x, weight, out=out, pdl=pdl), out, lambda: linear_ref(x, weight), nbytes)
    res = torch.randn(batch, case.outputs, dtype=dt, device=dev, generator=gen) if case.residual else None
    state = conv = None
    if case.conv_weight is not None:
        state = torch.randn(batch, case.conv_weight.shape[1] - 1, case.outputs, dtype=dt, device=dev, generator=gen)
        conv = (state, case.conv_weight)
    out = torch.empty(batch, case.outputs, dtype=dt, device=dev)
    common = dict(norm_weight=case.norm_weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset,
                  swiglu=case.swiglu)
    extra = {"config": config, "workspace": workspace, "placement": placement} if gemv.configs else {}
    # the residual goes out of place, so that replays do not grow it
    call = lambda: gemv.fn(x, weight, out=out, residual=res, short_conv=conv, pdl=pdl, **common, **extra)  # noqa: E731

    def reference() -> torch.Tensor:  # before the call: the conv state is shifted in place
        return linear_ref(x, weight, residual=res, short_conv=None if conv is None else (state.clone(), conv[1]),
                          **common)
    return _Bound(op, call, out, reference, nbytes)


class Chain:
    """The ops bound to operands for one GEMV, batch and PDL setting (``configs``: a LinearConfig
    per tuning key, overriding the GPU's table; ``copies``: each op repeated over that many weight
    copies, for sub-chains that would otherwise fit in L2)."""

    def __init__(self, model: HybridLM, ops: Sequence[ChainOp], batch: int, gemv: str = "linear", *, pdl: bool = False,
                 configs: dict | None = None, placement=None, copies: int = 1, seed: int = 0,
                 clones: dict | None = None) -> None:
        from .. import tuning
        from ..ops.linear import LinearWorkspace

        if gemv not in GEMVS:
            raise ValueError(f"unknown GEMV {gemv!r}; registered: {', '.join(GEMVS)}")
        g = GEMVS[gemv]
        if g.batch1 and batch != 1:
            raise ValueError(f"the {gemv!r} GEMV takes one row only, got batch {batch}")
        self.model, self.batch, self.gemv, self.pdl = model, batch, gemv, pdl
        self.configs = {}
        for op in ops:
            if g.configs:
                key = op.key(batch)
                cfg = (configs or {}).get(key) or tuning.linear_config(
                    batch, op.case.outputs, op.case.weight.shape[1], row_blocks=op.case.row_blocks, device=model.device)
                self.configs[op.name] = cfg
        need_p = need_c = 1
        if g.configs:
            for op in ops:
                p, c = LinearWorkspace.needed(batch, op.case.outputs, self.configs[op.name], op.case.row_blocks)
                need_p, need_c = max(need_p, p), max(need_c, c)
        self.workspace = LinearWorkspace.allocate(need_p, need_c, model.device) if g.configs else None
        gen = torch.Generator(device=model.device).manual_seed(seed)
        self.bound = []
        for copy in range(copies):
            for op in ops:
                w = op.case.weight
                if copy:  # ``clones`` keeps the copies between chains (a sweep builds many)
                    cache = {} if clones is None else clones
                    w = cache.setdefault((op.name, copy), w.clone())
                self.bound.append(_bind(model, op, w, batch, g, pdl, self.configs.get(op.name), placement,
                                        self.workspace, gen))

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.bound)

    def check(self, every_layer: bool = True) -> dict[str, float]:
        """Relative error of every op (first copy; else of one op per kind) against its reference,
        outputs poisoned first."""
        errs = {}
        seen = set()
        for b in self.bound:
            what = b.op.name if every_layer else b.op.case.name
            if what in seen:
                continue
            seen.add(what)
            ref = b.reference()
            b.out.fill_(float("nan"))
            b.call()
            errs[b.op.name] = rel_err(b.out, ref)
        return errs

    def time_ms(self, repeats: int = 20) -> float:
        """Milliseconds for one replay of the whole chain (median of ``repeats``)."""
        from ..lab.timing import measure

        return measure([b.call for b in self.bound], device=self.model.device, graph=True, repeats=repeats).ms \
            * len(self.bound)


def groups(ops: Sequence[ChainOp], batch: int) -> dict:
    """The ops by tuning key, largest total bytes first."""
    out: dict = {}
    for op in ops:
        out.setdefault(op.key(batch), []).append(op)
    return dict(sorted(out.items(), key=lambda kv: -sum(o.case.nbytes for o in kv[1])))


def copies_for(nbytes: int, device: torch.device) -> int:
    """Weight copies that take a sub-chain of ``nbytes`` to ~3x the L2 cache."""
    from ..lab.timing import cold_l2_copies

    return cold_l2_copies(nbytes, device, cap=16)


@dataclass
class ChainResult:
    model: str
    batch: int
    gemv: str
    pdl: bool
    placement: str | None
    kernels: int
    bytes: int
    ms: float
    tb_per_s: float
    max_rel_err: float
    groups: list = field(default_factory=list)  # {key, ops, kernels, bytes_per_kernel, us_per_kernel, config}
    fit: dict | None = None
    error: str | None = None


def placement_name(placement) -> str | None:
    return None if placement is None else f"{'preload' if placement.preload else 'no-preload'}+{placement.release}"


def parse_placement(text: str):
    """``"preload+early"``, ``"no-preload+end"``, ... (see :class:`labkit.ops.linear.PdlPlacement`)."""
    from ..ops.linear import PdlPlacement

    pre, _, release = text.partition("+")
    if pre not in ("preload", "no-preload") or not release:
        raise ValueError(f"a placement reads preload+<release> or no-preload+<release>, got {text!r}")
    return PdlPlacement(preload=pre == "preload", release=release)


def run_chain(model: HybridLM, batch: int, gemv: str = "linear", *, pdl: bool = False, placement=None,
              configs: dict | None = None, per_group: bool = True, repeats: int = 20,
              log: Callable[[str], None] = print) -> ChainResult:
    """Check, then time the whole chain and (``per_group``) each key's sub-chain; fit the groups."""
    from ..ops.linear import LinearConfig  # noqa: F401  (configs are LinearConfigs)

    ops = chain_ops(model)
    name = model.cfg.name
    try:
        chain = Chain(model, ops, batch, gemv, pdl=pdl, configs=configs, placement=placement)
        errs = chain.check()
        worst = max(errs.values())
        bound = BOUND[model.dtype]
        if not worst <= bound:
            bad = {k: v for k, v in errs.items() if not v <= bound}
            raise RuntimeError(f"wrong results (relative error > {bound}): {bad}")
        ms = chain.time_ms(repeats)
    except Exception as e:  # noqa: BLE001 - one variant failing is a result to record, not the end of the run
        log(f"{name:>14} B={batch:<3} {gemv:>10} pdl={pdl!s:5} {placement_name(placement)}: FAILED {e}")
        return ChainResult(name, batch, gemv, pdl, placement_name(placement), len(ops), 0, 0.0, 0.0, float("nan"),
                           error=f"{type(e).__name__}: {e}"[:400])
    res = ChainResult(name, batch, gemv, pdl, placement_name(placement), len(ops), chain.nbytes, ms,
                      chain.nbytes / (ms * 1e-3) / 1e12, worst)
    if per_group:
        for key, group in groups(ops, batch).items():
            nb = sum(o.case.nbytes for o in group)
            try:
                sub = Chain(model, group, batch, gemv, pdl=pdl, configs=configs, placement=placement,
                            copies=copies_for(nb, model.device))
                us = sub.time_ms(repeats) * 1e3 / len(sub.bound)
            except Exception as e:  # noqa: BLE001 - recorded beside the group
                res.groups.append({"key": key._asdict(), "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            res.groups.append({"key": key._asdict(), "ops": sorted({o.case.name for o in group}),
                               "kernels": len(group), "bytes_per_kernel": nb / len(group), "us_per_kernel": us,
                               "config": repr(chain.configs.get(group[0].name))})
        timed = [g for g in res.groups if "us_per_kernel" in g]
        if len({round(g["bytes_per_kernel"]) for g in timed}) >= 2:
            try:
                f = fit_per_kernel([g["bytes_per_kernel"] for g in timed], [g["us_per_kernel"] for g in timed],
                                   [g["kernels"] for g in timed])
                res.fit = {"t0_us": f.t0_us, "tb_per_s": f.bytes_per_s / 1e12, "r2": f.r2,
                           "sum_of_groups_ms": sum(g["us_per_kernel"] * g["kernels"] for g in timed) / 1e3}
            except ValueError as e:
                res.fit = {"error": str(e)}
    fit = "" if not res.fit or "t0_us" not in res.fit else \
        f"  fit {res.fit['t0_us']:.2f} us + bytes / {res.fit['tb_per_s']:.2f} TB/s (r2 {res.fit['r2']:.2f})"
    log(f"{name:>14} B={batch:<3} {gemv:>10} pdl={pdl!s:5} {placement_name(placement) or '':18} {len(ops)} kernels "
        f"{chain.nbytes / 1e6:7.1f} MB {ms:7.3f} ms {res.tb_per_s:5.2f} TB/s err {worst:.1e}{fit}")
    return res


# -- a measured timeline ----------------------------------------------------------------------------------
def timeline(model: HybridLM, ops: Sequence[ChainOp], *, pdl: bool, replays: int = 5) -> list[dict]:
    """Per kernel of a plain-GEMV chain over ``ops`` (batch 1, replayed from one graph): when its
    first and last programs started, passed the wait and ended, in microseconds from the first
    kernel's first start (the GPU's global timer, read by every program). With PDL, a kernel's
    programs start before the previous kernel ends; the wait is where they stand still."""
    from ..ops.plain_gemv import plain_gemv

    dev = model.device
    gen = torch.Generator(device=dev).manual_seed(0)
    runs = []
    for op in ops:
        w = op.case.weight
        x = torch.randn(1, w.shape[1], dtype=w.dtype, device=dev, generator=gen)
        out = torch.empty(1, w.shape[0], dtype=w.dtype, device=dev)
        block_k = min(1024, 1 << (w.shape[1] - 1).bit_length())
        stamps = torch.zeros(-(-w.shape[0] // 4), 3, dtype=torch.int64, device=dev)
        runs.append((op, stamps, lambda x=x, w=w, out=out, s=stamps, bk=block_k:
                     plain_gemv(x, w, out=out, block_n=4, block_k=bk, pdl=pdl, stamps=s)))
    for _, _, call in runs:  # compile outside the capture
        call()
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _, _, call in runs:
            call()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize(dev)
    t0 = min(int(s[:, 0].min()) for _, s, _ in runs)
    rows = []
    for op, s, _ in runs:
        s = (s.double() - t0) / 1e3
        rows.append({"op": op.name, "bytes": op.case.nbytes, "programs": s.shape[0],
                     "first_start_us": s[:, 0].min().item(), "last_start_us": s[:, 0].max().item(),
                     "first_past_wait_us": s[:, 1].min().item(), "last_end_us": s[:, 2].max().item()})
    return rows


@dataclass
class TimelineRow:
    """One kernel of :func:`timeline` in a results file (µs from the first kernel's first start)."""

    model: str
    pdl: bool
    op: str
    bytes: int
    programs: int
    first_start_us: float
    last_start_us: float
    first_past_wait_us: float
    last_end_us: float


def timeline_rows(model: HybridLM, layers: int, replays: int = 5) -> list[TimelineRow]:
    """:func:`timeline` of the first ``layers`` layers' projections, PDL off then on."""
    ops = [o for o in chain_ops(model, lm_head=False) if o.layer < layers]
    return [TimelineRow(model.cfg.name, pdl, **r) for pdl in (False, True)
            for r in timeline(model, ops, pdl=pdl, replays=replays)]


# -- tuning inside the chain -------------------------------------------------------------------------------
def sweep_key(model: HybridLM, ops: Sequence[ChainOp], batch: int, candidates: Sequence, *, pdl: bool, placement=None,
              repeats: int = 10, deadline: float | None = None, log: Callable[[str], None] = print) -> dict:
    """Time every candidate configuration of one tuning key as the sub-chain of the ops that share it
    (weight copies past L2), each checked first against its reference; the first candidate is the
    baseline. Candidates not reached before ``deadline`` (time.perf_counter()) are left out.
    Returns {"timed": [(us, config)], "rejected": [...], "skipped": [...]}."""
    bound = BOUND[model.dtype]
    key = ops[0].key(batch)
    copies = copies_for(sum(o.case.nbytes for o in ops), model.device)
    clones: dict = {}
    timed, rejected, skipped = [], [], []
    for i, cfg in enumerate(candidates):
        if i and deadline is not None and time.perf_counter() > deadline:
            break
        try:
            sub = Chain(model, ops, batch, "linear", pdl=pdl, configs={key: cfg}, placement=placement, copies=copies,
                        clones=clones)
            err = max(sub.check(every_layer=False).values())
            if not err <= bound:
                rejected.append({"config": repr(cfg), "rel_err": err})
                log(f"  !! {model.cfg.name} B={batch} {cfg}: relative error {err:.2e}")
                continue
            timed.append((sub.time_ms(repeats) * 1e3 / len(sub.bound), cfg))
        except Exception as e:  # noqa: BLE001 - compile/launch limits of one blocking: try the others
            if i == 0:
                raise
            skipped.append({"config": repr(cfg), "error": f"{type(e).__name__}: {e}"[:200]})
    return {"timed": timed, "rejected": rejected, "skipped": skipped}


# -- the CLI ---------------------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from ..model import build
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench chain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    p.add_argument("--gemvs", nargs="+",
                   default=["linear", "linear+pdl", "plain", "plain+pdl", "plain-tma", "plain-tma+pdl", "cublas", "torch"],
                   help=f"GEMVs ({', '.join(GEMVS)}), '+pdl' for programmatic dependent launch")
    p.add_argument("--placements", nargs="+", default=[None], type=parse_placement,
                   help="PDL placements of labkit.ops.linear to run (default: the code's own)")
    p.add_argument("--no-groups", action="store_true", help="time the whole chain only (no per-key sub-chains)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--timeline", type=int, default=0, metavar="LAYERS",
                   help="also stamp a plain-GEMV chain of the first model's first LAYERS layers, PDL off and on "
                        "(global timer per program) -> <name>-timeline.json")
    p.add_argument("--name", default="chain", help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench chain replays a CUDA graph: it needs a CUDA GPU (the CPU tests check the fit and the ops)")
        return 2
    facts = device_facts("cuda")
    rows = []
    t0 = time.perf_counter()
    command = shlex.join(["python", "-m", "labkit", "bench", "chain", *argv])
    for i, name in enumerate(args.models):
        model = build(name, dtype=torch.bfloat16, device="cuda", seed=0)
        if args.timeline and i == 0:
            stamped = timeline_rows(model, args.timeline)
            for r in stamped:
                print(f"timeline pdl={r.pdl!s:5} {r.op:34} start {r.first_start_us:7.2f}..{r.last_start_us:7.2f} "
                      f"past wait {r.first_past_wait_us:7.2f} end {r.last_end_us:7.2f} us")
            path = write_results(f"{args.name}-timeline", "chain-timeline", stamped, facts, command=command,
                                 data_dir=args.data_dir)
            print(f"wrote {path}")
        for b in args.batch:
            for spec in args.gemvs:
                gemv, pdl = spec.removesuffix("+pdl"), spec.endswith("+pdl")
                if GEMVS.get(gemv) is not None and GEMVS[gemv].batch1 and b != 1:
                    continue
                places = args.placements if gemv == "linear" and pdl else [None]  # no PDL: no placement to vary
                for pl in places:
                    rows.append(run_chain(model, b, gemv, pdl=pdl, placement=pl, per_group=not args.no_groups,
                                          repeats=args.repeats))
        del model
        torch.cuda.empty_cache()
    path = write_results(args.name, "chain", rows, facts, command=command, data_dir=args.data_dir)
    print(f"copy bandwidth {facts.copy_bytes_per_s / 1e12:.2f} TB/s; {time.perf_counter() - t0:.0f} s; wrote {path}")
    return 0 if not any(r.error for r in rows) else 1

