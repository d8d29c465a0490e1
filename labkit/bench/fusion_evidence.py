"""Evidence for the mechanisms notebook 02 names: measured, never asserted from a model of the GPU.

- :func:`fit_fixed_cost`: least-squares ``t = t0 + bytes / BW`` over kernels each timed alone in a
  CUDA graph; ``t0`` is what every kernel costs however few bytes it moves (ramp-up, tail, the
  graph's own step to the next node), the part a step of ~70 kernels pays ~70 times.
- :func:`gdn_block_v_rows`: the Gated DeltaNet step per ``block_v``: programs against the SM count,
  and the registers / spills / warps of the kernel Triton compiled (:func:`kernel_resources`).
- :func:`host_costs`: where the eager ``fused`` backend's host time goes (a bare Triton launch,
  labkit's argument checks, Triton's Python launcher, the launch itself), with a cProfile of steps.
- :func:`pdl_timelines`: one ``fused+graph`` step with and without programmatic dependent launch,
  kernel by kernel as the profiler (CUPTI) saw them, so overlaps are measured, not drawn.
- :func:`norm_prologue_rows`: each projection with and without its RMSNorm prologue, beside a
  standalone norm kernel.

``python -m labkit.bench.fusion_evidence`` runs them all at the real shapes on a GPU and writes
``data/bench/<gpu>/fusion-evidence.json`` (notebook 02 reads it where there is no GPU).
"""

from __future__ import annotations

import cProfile
import math
import pstats
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..model import HybridLM
from ..ops.features import MissingFeature, features
from . import ops as opbench


# -- the per-kernel fixed cost ------------------------------------------------------------------------
@dataclass(frozen=True)
class FixedCostFit:
    """``us = t0_us + bytes / bytes_per_s * 1e6``, fitted over ``points`` kernels."""

    t0_us: float
    bytes_per_s: float
    points: int
    rms_residual_us: float

    def predict_us(self, nbytes: float) -> float:
        return self.t0_us + nbytes / self.bytes_per_s * 1e6


def fit_fixed_cost(nbytes: Sequence[float], us: Sequence[float]) -> FixedCostFit:
    """Least-squares fit of ``us = t0 + bytes / BW`` (ordinary, unweighted) over kernels timed alone.

    Needs at least two points with different byte counts and a rising line (a positive bandwidth);
    anything else raises ValueError rather than return a meaningless fit.
    """
    x = [float(b) for b in nbytes]
    y = [float(t) for t in us]
    if len(x) != len(y):
        raise ValueError(f"need as many byte counts as times, got {len(x)} and {len(y)}")
    if len(x) < 2:
        raise ValueError(f"a line needs at least 2 points, got {len(x)}")
    if not all(math.isfinite(v) for v in x + y):
        raise ValueError("bytes and times must be finite numbers")
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        raise ValueError("all points move the same bytes: the slope (bandwidth) is undetermined")
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx  # µs per byte
    if slope <= 0:
        raise ValueError(f"time does not grow with bytes (slope {slope:.3g} µs/byte): no bandwidth to fit")
    t0 = my - slope * mx
    rms = math.sqrt(sum((b - (t0 + slope * a)) ** 2 for a, b in zip(x, y)) / len(x))
    return FixedCostFit(t0, 1e6 / slope, len(x), rms)


def linear_points(model: HybridLM, batch: int = 1) -> list[dict]:
    """Every fused projection of ``model``'s decode step timed alone (graph, cold L2): op, bytes, µs."""
    rows = []
    for case in opbench.linear_cases(model):
        t = opbench.time_linear(model, case, batch, "triton")
        rows.append(dict(model=model.cfg.name, batch=batch, op=case.name, bytes=t.bytes, us=t.us, config=t.extra["config"]))
    return rows


# -- block_v of the Gated DeltaNet step -----------------------------------------------------------------
def compiled_kernels(jit_fn, **constexprs) -> list:
    """The kernels Triton has compiled from ``jit_fn`` (on any device) whose constexpr arguments
    have the given values, e.g. ``compiled_kernels(_gdn_decode_kernel, BLOCK_V=16, USE_PDL=False)``."""
    index = {name: jit_fn.arg_names.index(name) for name in constexprs}
    found = []
    for caches in jit_fn.device_caches.values():
        for kernel in caches[0].values():
            consts = getattr(getattr(kernel, "src", None), "constants", {})
            if all(consts.get((i,)) == constexprs[name] for name, i in index.items()):
                found.append(kernel)
    return found


def kernel_resources(kernel) -> dict:
    """Registers per thread, spilled registers, warps and shared memory of a compiled Triton kernel
    (read from the loaded binary: GPU only)."""
    if getattr(kernel, "function", None) is None:
        kernel._init_handles()
    return dict(n_regs=int(kernel.n_regs), n_spills=int(kernel.n_spills), num_warps=int(kernel.metadata.num_warps),
                shared_bytes=int(kernel.metadata.shared))


def resident_programs_per_sm(n_regs: int, num_warps: int, regs_per_sm: int = 65536, max_warps: int = 64,
                             max_blocks: int = 32) -> int:
    """How many programs of a kernel fit on one SM by registers and warps (Hopper's limits: 64 K
    registers, 64 warps, 32 blocks per SM; shared memory is not the limit for these kernels)."""
    if n_regs < 1 or num_warps < 1:
        raise ValueError(f"need positive registers and warps, got {n_regs} and {num_warps}")
    per_warp = -(-n_regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
    return max(0, min(regs_per_sm // (per_warp * num_warps), max_warps // num_warps, max_blocks))


def gdn_block_v_rows(model: HybridLM, batches: Sequence[int], block_vs: Sequence[int]) -> list[dict]:
    """Per (batch, block_v): programs launched, the SM count, µs per step of one layer (graph, cold
    L2), and the compiled kernel's registers, spills and warps."""
    from ..ops import gated_delta_decode as gdd
    from ..ops.launch import cdiv, num_sms

    cfg = model.cfg
    sms = num_sms()
    rows = []
    for b in batches:
        for bv in block_vs:
            t = opbench.time_gdn(model, b, "triton", block_v=bv)
            programs = b * cfg.gdn_num_v_heads * cdiv(cfg.gdn_v_head_dim, bv)
            row = dict(model=cfg.name, batch=b, block_v=bv, programs=programs, sms=sms, us=t.us, bytes=t.bytes)
            kernels = compiled_kernels(gdd._gdn_decode_kernel, BLOCK_V=bv, USE_PDL=False)
            if kernels:
                row.update(kernel_resources(kernels[0]))
                row["resident_per_sm"] = resident_programs_per_sm(row["n_regs"], row["num_warps"])
            rows.append(row)
    return rows


# -- host cost of the eager fused backend ----------------------------------------------------------------
def _per_call_us(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Host microseconds per call of ``fn`` (wall clock over ``calls`` calls, best of 3 runs, after
    a warm-up): what the CPU spends issuing it while the GPU keeps up."""
    for _ in range(min(calls, 50)):
        fn()
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


class _NoLaunch:
    """Stands in for ``_linear_kernel``: ``[grid](...)`` does nothing, so timing ``linear()`` with it
    gives labkit's own host code (checks, config, grid) without Triton's launcher."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _host_groups(stats: pstats.Stats) -> dict[str, float]:
    """Self time (seconds) per group of functions: labkit's Python, Triton's Python launcher, the C
    call that launches a Triton kernel, torch's Python, other C calls (torch ops, tensor attributes)."""
    groups = dict.fromkeys(GROUPS, 0.0)
    for (path, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():
        if "/labkit/" in path:
            key = GROUPS[0]
        elif "/triton/" in path:
            key = GROUPS[1]
        elif path == "~" and "launch" in name:
            key = GROUPS[2]
        elif "/torch/" in path:
            key = GROUPS[3]
        elif path == "~":
            key = GROUPS[4]
        else:
            key = GROUPS[5]
        groups[key] += tottime
    return groups


GROUPS = ("labkit Python (checks, plan, dispatch)", "Triton launcher (Python)", "kernel launch call (C)",
          "torch Python", "other C calls (torch ops, tensor attributes)", "other Python")


def host_costs(model: HybridLM, case_name: str = "mlp.gate_up+norm+swiglu", calls: int = 2000,
               steps: int = 20) -> dict:
    """What one eager call costs the host, from the bottom up (µs per call):

    - ``torch_add_us``: an eager ``x.add_(1)`` on one element (PyTorch's dispatcher and launch);
    - ``bare_triton_us``: a one-line Triton kernel launched from Python (Triton's launcher alone);
    - ``linear_us``: ``labkit.ops.linear`` on a real projection, config and workspace given as the
      fused backend gives them; ``labkit_checks_us``: the same call with the launch stubbed out;
    - ``step``: one eager ``fused`` decode step: µs, kernels (from the profiler), µs per kernel, and
      a cProfile of ``steps`` steps grouped by whose code ran (scaled to the measured step time).
    """
    import triton
    import triton.language as tl

    from ..decode.registry import make_decoder
    from ..ops import linear as lin
    from ..lab.profile import profile_decode

    dev = model.device
    opbench._need_cuda(dev)

    @triton.jit
    def _one_store(x_ptr):
        tl.store(x_ptr, 1.0)

    x1 = torch.zeros(1, device=dev)
    out = {"torch_add_us": _per_call_us(lambda: x1.add_(1.0), calls, dev),
           "bare_triton_us": _per_call_us(lambda: _one_store[(1,)](x1), calls, dev)}

    case = next(c for c in opbench.linear_cases(model) if c.name == case_name)
    x, res, state = opbench._linear_inputs(model, case, 1)
    config = opbench.case_config(model, case, 1)
    ws = lin.LinearWorkspace.allocate(*lin.LinearWorkspace.needed(1, case.outputs, config, case.row_blocks), dev)
    y = torch.empty(1, case.outputs, dtype=x.dtype, device=dev)
    common = opbench._linear_common(model, case)

    def call():
        lin.linear(x, case.weight, out=y, config=config, workspace=ws, **common)

    out["linear_us"] = _per_call_us(call, calls, dev)
    real = lin._linear_kernel
    lin._linear_kernel = _NoLaunch()
    try:
        out["labkit_checks_us"] = _per_call_us(call, calls, dev)
    finally:
        lin._linear_kernel = real
    out["triton_launch_us"] = out["linear_us"] - out["labkit_checks_us"]
    out["case"] = case.name

    prof = profile_decode(model, "fused", 1, context=32, steps=3, warmup=1)
    cache = model.new_cache(1, 64 + steps)
    decoder = make_decoder("fused", model, cache)
    token = decoder.prefill(torch.zeros(1, 8, dtype=torch.long, device=dev)).argmax(-1)
    decoder.step(token)
    torch.cuda.synchronize(dev)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        decoder.step(token)
    torch.cuda.synchronize(dev)
    profiler.disable()
    groups = _host_groups(pstats.Stats(profiler))
    total = sum(groups.values()) or 1.0
    step_us = prof.step_ms * 1e3
    out["step"] = dict(model=model.cfg.name, step_us=step_us, kernels=prof.kernels_per_step,
                       us_per_kernel=step_us / prof.kernels_per_step if prof.kernels_per_step else None,
                       groups_us={k: step_us * v / total for k, v in groups.items()})
    return out


# -- programmatic dependent launch, kernel by kernel ------------------------------------------------------
def timeline_summary(spans: Sequence) -> dict:
    """From one step's kernels (start, duration in µs, in start order): the span from the first
    start to the last end, the sum of durations, how many kernels start before the previous one
    ends (overlap), and the median gap between a kernel's end and the next one's start."""
    if not spans:
        raise ValueError("no kernels in the timeline")
    spans = sorted(spans, key=lambda s: s["start_us"])
    gaps = [b["start_us"] - (a["start_us"] + a["dur_us"]) for a, b in zip(spans, spans[1:])]
    end = max(s["start_us"] + s["dur_us"] for s in spans)
    ordered = sorted(gaps)
    return dict(kernels=len(spans), span_us=end - spans[0]["start_us"], busy_sum_us=sum(s["dur_us"] for s in spans),
                overlapping=sum(g < 0 for g in gaps), median_gap_us=ordered[len(ordered) // 2] if ordered else 0.0)


def pdl_missing(model: HybridLM) -> str | None:
    """Why ``model``'s GPU cannot run the PDL evidence (a GPU older than sm_90), or None."""
    try:
        features(model.device).require("pdl", "the PDL evidence", "It is recorded as skipped on this GPU.")
    except MissingFeature as e:
        return str(e)
    return None


def pdl_timelines(model: HybridLM, batch: int = 1) -> dict:
    """One ``fused+graph`` and one ``fused+graph+pdl`` step under the profiler: each kernel's start
    and duration (µs from the step's first kernel), the step time measured outside the profiler,
    and :func:`timeline_summary` of each. On a GPU without PDL the second is ``{"skipped": why}``."""
    from ..lab.profile import profile_decode

    out = {}
    for backend in ("fused+graph", "fused+graph+pdl"):
        if backend.endswith("+pdl") and (why := pdl_missing(model)):
            out[backend] = {"skipped": why}
            continue
        p = profile_decode(model, backend, batch, context=128, steps=5, warmup=3)
        spans = [dict(name=s.name, family=s.family, start_us=s.start_us, dur_us=s.dur_us) for s in p.timeline]
        out[backend] = dict(step_us=p.step_ms * 1e3, kernels_per_step=p.kernels_per_step, spans=spans,
                            summary=timeline_summary(spans) if spans else None)
    return out


def pdl_chain_rows(model: HybridLM, batch: int = 1) -> list[dict]:
    """Each fused projection chained with copies of itself in one graph (cold L2), launched plainly
    and with programmatic dependent launch: µs per kernel of each, same configuration."""
    from ..ops.linear import LinearWorkspace, linear
    from ..lab.timing import cold_l2_copies, measure

    rows = []
    for case in opbench.linear_cases(model):
        x, res, state = opbench._linear_inputs(model, case, batch)
        weights = [case.weight] + [case.weight.clone() for _ in range(cold_l2_copies(case.nbytes, model.device) - 1)]
        config = opbench.case_config(model, case, batch)
        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, case.outputs, config, case.row_blocks), model.device)
        y = torch.empty(batch, case.outputs, dtype=x.dtype, device=model.device)
        conv = None if state is None else (state, case.conv_weight)
        common = opbench._linear_common(model, case)
        row = dict(model=model.cfg.name, batch=batch, op=case.name, bytes=case.nbytes, config=repr(config))
        for pdl in (False, True):
            calls = [lambda w=w: linear(x, w, out=y if res is None else None, residual=res, short_conv=conv,
                                        config=config, workspace=ws, pdl=pdl, **common) for w in weights]
            row["pdl_us" if pdl else "plain_us"] = measure(calls, device=model.device, graph=True).us
        rows.append(row)
        del weights
    return rows


# -- the norm prologue -----------------------------------------------------------------------------------
def norm_prologue_rows(model: HybridLM, batch: int = 1) -> list[dict]:
    """Each projection that carries the RMSNorm prologue, timed with it and without it (same
    configuration, graph, cold L2), and a standalone ``torch.nn.functional.rms_norm`` of its input
    rows in a graph: the kernel the prologue replaces."""
    from ..lab.timing import measure

    rows = []
    for case in opbench.linear_cases(model):
        if case.norm_weight is None:
            continue
        with_norm = opbench.time_linear(model, case, batch, "triton").us
        without = opbench.time_linear(model, case.without_norm(), batch, "triton").us
        x = torch.randn(batch, case.weight.shape[1], dtype=case.weight.dtype, device=model.device)
        w = case.norm_weight
        norm_us = measure(lambda: torch.nn.functional.rms_norm(x, (x.shape[1],), w, model.cfg.norm_eps),
                          device=model.device, graph=True).us
        rows.append(dict(model=model.cfg.name, batch=batch, op=case.name, with_norm_us=with_norm,
                         without_norm_us=without, prologue_us=with_norm - without, separate_norm_us=norm_us))
    return rows


# -- batch 16: the tl.dot configurations ----------------------------------------------------------------
def batch_config_rows(model: HybridLM, batch: int = 16) -> list[dict]:
    """Each fused projection at ``batch``: the configuration it runs with, whether that came from the
    tuning file or the heuristic, and its time beside cuBLAS's matmul alone."""
    from .. import tuning
    from ..ops.linear import tuning_key

    table = tuning.device_table(model.device) or {}
    rows = []
    for case in opbench.linear_cases(model):
        cfg = opbench.case_config(model, case, batch)
        key = tuning_key(batch, case.outputs, case.weight.shape[1], row_blocks=case.row_blocks)
        tri = opbench.time_linear(model, case, batch, "triton").us
        cub = opbench.time_linear(model, case, batch, "cublas").us
        rows.append(dict(model=model.cfg.name, batch=batch, op=case.name, config=repr(cfg),
                         tuned=key in table, triton_us=tri, cublas_us=cub,
                         ratio=tri / cub))
    return rows


PARTS = ("launch", "block_v", "fit", "pdl", "pdl_chain", "host", "norm", "batch16")
COMMAND = "python -m labkit.bench.fusion_evidence"


def collect(models: dict[str, HybridLM], parts: Sequence[str] = PARTS, log=print,
            on_part: Callable[[dict], None] | None = None) -> dict:
    """Every part of the evidence for ``models`` (name -> model on a GPU; the Gated DeltaNet parts use
    the first model with GDN layers). A part that fails is recorded as ``{"error": ...}``, and the
    rest still run; ``on_part(doc)`` is called after each (e.g. to write the file as it grows). On a GPU
    without PDL (older than sm_90) the PDL evidence is recorded as ``{"skipped": why}``."""
    from ..lab.hw import measure_launch_overhead

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    gdn = next((m for m in models.values() if "gdn" in m.cfg.layer_types), None)
    every = lambda fn: [r for m in models.values() for r in fn(m)]  # noqa: E731
    missing = [why for why in map(pdl_missing, models.values()) if why]
    steps = {
        "launch": lambda: measure_launch_overhead(device="cuda"),
        "block_v": lambda: gdn_block_v_rows(gdn, (1, 16), (4, 8, 16, 32, 64, 128)) if gdn else [],
        "fit": lambda: every(lambda m: linear_points(m, 1)),
        "pdl": lambda: {n: pdl_timelines(m, 1) for n, m in models.items()},
        "pdl_chain": lambda: ({"skipped": missing[0]} if missing else every(lambda m: pdl_chain_rows(m, 1))),
        "host": lambda: {n: host_costs(m) for n, m in models.items()},
        "norm": lambda: every(lambda m: norm_prologue_rows(m, 1)),
        "batch16": lambda: every(lambda m: batch_config_rows(m, 16)),
    }
    doc: dict = {"kind": "fusion-evidence"}
    for name in parts:
        t0 = time.perf_counter()
        try:
            doc[name] = steps[name]()
        except Exception as exc:  # one failed part must not lose the others
            doc[name] = {"error": f"{type(exc).__name__}: {exc}"}
        said = next((f" ({k}: {doc[name][k]})" for k in ("error", "skipped") if isinstance(doc[name], dict) and k in doc[name]), "")
        log(f"{name}: {time.perf_counter() - t0:.1f} s{said}")
        if on_part is not None:
            on_part(doc)
    return doc


def write_evidence(doc: dict, facts, command: str = COMMAND, path=None):
    """``doc`` with its provenance (GPU, versions, date, command) as
    ``data/bench/<gpu>/fusion-evidence.json`` (or ``path``); returns the path."""
    import json
    from pathlib import Path

    from .results import provenance, results_dir

    path = Path(path) if path else results_dir() / facts.slug / "fusion-evidence.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**provenance(facts, command), **doc}, indent=1, default=str) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    import argparse

    from ..lab.hw import device_facts
    from ..lab.notebooks import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="results file (default data/bench/<gpu>/fusion-evidence.json)")
    ap.add_argument("--parts", default=",".join(PARTS))
    args = ap.parse_args(argv)
    facts = device_facts("cuda")
    models = {n: load_model(n, torch.bfloat16, "cuda") for n in ("lfm2-350m", "qwen3.5-0.8b")}
    doc = collect(models, args.parts.split(","), on_part=lambda d: write_evidence(d, facts, path=args.out))
    if isinstance(doc.get("fit"), list):
        pts = [r for r in doc["fit"] if not r["op"].startswith("lm_head")]
        f = fit_fixed_cost([r["bytes"] for r in pts], [r["us"] for r in pts])
        print(f"fit over {f.points} layer projections: t = {f.t0_us:.2f} µs + bytes / {f.bytes_per_s / 1e12:.2f} TB/s "
              f"(rms residual {f.rms_residual_us:.2f} µs)")
    print(write_evidence(doc, facts, path=args.out))


if __name__ == "__main__":
    main()
