"""Where a prefill's device time goes, kernel by kernel.

    python -m labkit.bench.prefill_profile                                # both presets, 4,096 tokens
    python -m labkit.bench.prefill_profile --check --ablate all --sweep-gdn-inputs
    python -m labkit bench prefill-profile --models lfm2-350m --tokens 16384

For each preset (random weights, bf16, batch 1): the ``--backend`` prefill (default fused+graph) of
``--tokens`` tokens into a fresh cache, timed as a user calls it, ``decoder.prefill(ids)`` through
the public API (a runner of :func:`labkit.bench.decode.make_runner`, CUDA events around the call,
host work included: the median of ``--repeats`` runs after a warm-up that compiles the kernels and
captures the graph); then one more call under torch.profiler: for one CUDA graph replay, every
device kernel by name (memsets and copies too: each is a node of the graph) with its count and
device time, the kernels' sum, the device busy time (the union of their intervals: what is left
of the wall time is launch gaps and host work), and totals per family (GEMMs, attention, Triton
kernels, torch's own element-wise kernels, memory operations).

Options, each adding a section per preset:

- ``--attribution``: one eager prefill under the profiler (fused for fused+graph), naming the torch op that launched
  each kernel (a graph replay has no host ops to name): where a memset or a copy comes from;
- ``--check``: the prefill's last-token logits against a float32 run of the same weights, beside the
  bf16 reference's own distance from it (the criterion of tests/gpu/test_prefill_accuracy_gpu.py:
  within 1.5x the reference's error + 5e-3); every ablation below is checked the same way;
- ``--ablate NAME... | all``: each of :data:`labkit.decode.fused_prefill.FAST_PATHS` switched off in
  turn, timed and profiled as above: what that path saves, measured;
- ``--sweep-gdn-inputs``: :func:`labkit.ops.prefill_fusions.gdn_inputs` alone at the preset's shape,
  every launch setting of a small grid (tokens per program, warps, grid order) replayed in a CUDA
  graph (:func:`labkit.lab.timing.measure`), in GB/s of the bytes it must move, each checked to give
  the default's bits.

Writes ``data/bench/<gpu>/<name>.json`` (default ``prefill-profile``; kind ``prefill-profile``) and
prints the tables. Exit status 1 when a run failed or a check did not pass.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import re
import shlex
import sys
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..config import PRESETS
from ..model import HybridLM, build
from .decode import _error, _prompt, default_warmup, make_runner
from .ops import rel_err
from .results import DATA_DIR

FAMILIES = (
    ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|cublas", re.I)),
    ("attention", re.compile(r"flash|fmha|cudnn|sdpa|attention", re.I)),
    ("memory", re.compile(r"^memset|^memcpy|memcpy32|memset32", re.I)),
    ("triton", re.compile(r"^_\w+_kernel$")),  # labkit's kernels (their names: _<what>_kernel)
)
GDN_SWEEP = {"block_t": (16, 32, 64), "num_warps": (4, 8), "heads_first": (False, True)}


def family(name: str) -> str:
    """The family of a device kernel, by its name: gemm, attention, memory, triton, or torch (the rest:
    torch's own element-wise, copy and indexing kernels)."""
    for fam, pattern in FAMILIES:
        if pattern.search(name):
            return fam
    return "torch"


# -- one profiled call ------------------------------------------------------------------------------
@dataclass
class KernelRow:
    name: str
    family: str
    count: int
    device_ms: float


@dataclass
class ProfiledPrefill:
    """One preset's prefill with some fast paths switched off (``paths_off``; none: the product)."""

    model: str
    backend: str
    tokens: int
    paths_off: list[str] = field(default_factory=list)
    wall_ms: float | None = None  # median over the runs, as a user calls it
    wall_runs_ms: list[float] = field(default_factory=list)
    busy_ms: float | None = None  # the union of the kernels' intervals, in the profiled call
    # the profiled call's first kernel start to last kernel end: span - busy is the gaps between its
    # kernels. Under the profiler: the span can exceed the unprofiled wall time (13.24 against 13.08
    # ms for Qwen3.5's 4,096 tokens on an H100), so it is compared with busy, never with wall
    span_ms: float | None = None
    kernel_ms: float | None = None  # their sum
    kernels: int | None = None  # device kernels of the profiled call, memsets and copies included
    families: dict[str, dict] = field(default_factory=dict)  # family -> {"count", "device_ms"}
    table: list[KernelRow] = field(default_factory=list)  # by device time, longest first
    check: dict | None = None  # --check: errors from the float32 run
    error: str | None = None


def _device_events(prof) -> list:
    """The device's events of a profile: kernels, memsets, copies (not the GPU-side copies of
    ``record_function`` ranges, which span whole calls)."""
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in prof.events() if e.device_type == cuda and not getattr(e, "is_user_annotation", False)
            and not e.name.startswith("labkit::")]


def profiled(call: Callable[[], object], device: torch.device):
    """``call()`` once under torch.profiler (CPU and CUDA activity), synchronised inside it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof


def summarize(prof, row: ProfiledPrefill) -> None:
    """Fill ``row``'s kernel table, counts and busy time from a profile of one call."""
    from ..lab.profile import union_ms
    events = _device_events(prof)
    per_name: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        agg = per_name[e.name]
        agg[0] += 1
        agg[1] += (e.time_range.end - e.time_range.start) / 1e3
    row.table = sorted((KernelRow(n, family(n), c, ms) for n, (c, ms) in per_name.items()), key=lambda r: -r.device_ms)
    row.kernels = len(events)
    row.kernel_ms = sum(r.device_ms for r in row.table)
    row.busy_ms = union_ms([(e.time_range.start, e.time_range.end) for e in events]) if events else 0.0
    row.span_ms = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) / 1e3 if events else 0.0
    fams: dict[str, dict] = {}
    for r in row.table:
        f = fams.setdefault(r.family, {"count": 0, "device_ms": 0.0})
        f["count"] += r.count
        f["device_ms"] += r.device_ms
    row.families = dict(sorted(fams.items(), key=lambda kv: -kv[1]["device_ms"]))


def profile_prefill(model: HybridLM, backend: str, ids: torch.Tensor, warmup: int, repeats: int,
                    paths_off: tuple[str, ...] = ()) -> tuple[ProfiledPrefill, torch.Tensor | None]:
    """Time ``backend``'s prefill of ``ids`` into a fresh cache (the median of ``repeats`` calls after
    ``warmup``), then profile one more call. Returns the row and the last-token logits (None on an error)."""
    from ..lab.timing import measure

    row = ProfiledPrefill(model.cfg.name, backend, ids.shape[1], list(paths_off))
    try:
        runner = make_runner(model, backend, ids.shape[0], ids.shape[1] + 1)
        timing = measure(lambda: runner.prefill(ids), device=model.device, graph=False, warmup=warmup,
                         repeats=repeats, setup=runner.reset)
        row.wall_runs_ms, row.wall_ms = timing.runs_ms, timing.ms
        runner.reset()
        out: dict[str, torch.Tensor] = {}
        summarize(profiled(lambda: out.setdefault("logits", runner.prefill(ids)), model.device), row)
        return row, out["logits"].float().clone()  # a copy, outside the profile (a replay overwrites the view)
    except Exception as exc:  # recorded: one failed configuration does not stop the others
        row.error = _error(exc)
        return row, None


@contextmanager
def paths_switched_off(names: tuple[str, ...]) -> Iterator[None]:
    """The fused prefill with the named :data:`~labkit.decode.fused_prefill.FAST_PATHS` off, for the block."""
    from ..decode import fused_prefill

    saved = dict(fused_prefill.FAST_PATHS)
    try:
        for name in names:
            fused_prefill.FAST_PATHS[name] = False
        yield
    finally:
        fused_prefill.FAST_PATHS.update(saved)


# -- the sections ----------------------------------------------------------------------------------
@torch.no_grad()
def float32_check(model: HybridLM, ids: torch.Tensor) -> Callable[[torch.Tensor], dict]:
    """A check of last-token logits against a float32 run of the same weights: the returned function
    gives {"error", "reference_error", "bound", "passed"} for logits of the bf16 model (the bf16
    reference's own error from float32 sets the bound, as tests/gpu/test_prefill_accuracy_gpu.py does)."""
    T = ids.shape[1]
    ref = model(ids, cache=model.new_cache(ids.shape[0], T), last_only=True)[:, -1].float()
    truth_model = copy.deepcopy(model).float()
    truth = truth_model(ids, cache=truth_model.new_cache(ids.shape[0], T), last_only=True)[:, -1]
    del truth_model
    ref_err = rel_err(ref, truth)
    bound = 1.5 * ref_err + 5e-3

    def check(logits: torch.Tensor) -> dict:
        err = rel_err(logits, truth)
        return {"error": err, "reference_error": ref_err, "bound": bound, "passed": bool(err < bound)}

    return check


def eager_backend(backend: str) -> str:
    """The backend that launches what ``backend``'s graphs replay, eagerly (its prefill's kernels)."""
    return {"fused+graph": "fused", "fused+graph+pdl": "fused", "reference+graph": "reference"}.get(backend, backend)


def launched_by(model: HybridLM, backend: str, ids: torch.Tensor) -> dict[str, dict[str, int]]:
    """One eager prefill of ``backend`` (:func:`eager_backend`) under the profiler: for each device
    kernel's name, the torch ops that launched it and how often (``"(no torch op)"``: a launch
    outside torch's ops, e.g. Triton's)."""
    runner = make_runner(model, eager_backend(backend), ids.shape[0], ids.shape[1] + 1)
    runner.prefill(ids)  # compiles whatever the graph backend's warm-up did not
    runner.reset()
    prof = profiled(lambda: runner.prefill(ids), model.device)
    cpu = torch.autograd.DeviceType.CPU
    owners: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    seen: dict[str, int] = defaultdict(int)
    for op in prof.events():
        if op.device_type != cpu or op.name.startswith(("cuda", "cu")):  # the runtime's launch calls: not ops
            continue
        for k in getattr(op, "kernels", []):
            owners[k.name][op.name] += 1
            seen[k.name] += 1
    for e in _device_events(prof):
        seen[e.name] -= 1
    for name, unowned in seen.items():
        if unowned < 0:
            owners[name]["(no torch op)"] += -unowned
    return {k: dict(v) for k, v in owners.items()}


def gdn_inputs_bytes(T: int, dims, dtype_bytes: int = 2) -> int:
    """What gdn_inputs must move at batch 1: read q|k|v and the b, a gates of the projection, write
    q, k, v, and g, beta in float32 (the conv weights and the window: a few KB, left out)."""
    nv = dims.num_v_heads
    return T * (2 * dims.conv_dim * dtype_bytes + 2 * nv * dtype_bytes + 2 * nv * 4)


@torch.no_grad()
def sweep_gdn_inputs(model: HybridLM, tokens: int, copy_bytes_per_s: float | None, repeats: int = 20) -> list[dict]:
    """gdn_inputs alone at the model's first Gated DeltaNet layer and ``tokens`` tokens (batch 1, random
    projection), for every setting of :data:`GDN_SWEEP`, each replayed in a CUDA graph; every result
    compared bit for bit with the defaults'."""
    from ..lab.timing import measure
    from ..ops import prefill_fusions as pf

    layer = next(b.mixer for b in model.layers if b.kind == "gdn")
    dims, dev = layer.dims, model.device
    gen = torch.Generator(device=dev).manual_seed(0)
    proj = torch.randn(1, tokens, dims.proj_dim, generator=gen, device=dev).to(model.dtype)
    state = torch.randn(1, layer.conv_weight.shape[1] - 1, dims.conv_dim, generator=gen, device=dev).to(model.dtype)
    args = (proj, state, layer.conv_weight, layer.A_log, layer.dt_bias, dims)
    base = pf.gdn_inputs(*args)
    nbytes = gdn_inputs_bytes(tokens, dims, model.dtype.itemsize)
    rows = []
    for values in itertools.product(*GDN_SWEEP.values()):
        settings = dict(zip(GDN_SWEEP, values))
        row = {"settings": settings, "us": None, "bytes": nbytes}
        try:
            same = all(torch.equal(a, b) for a, b in zip(pf.gdn_inputs(*args, **settings), base))
            timing = measure(lambda: pf.gdn_inputs(*args, **settings), device=dev, warmup=2, repeats=repeats)
            row.update(us=timing.us, same_bits=same, bytes_per_s=nbytes / (timing.ms * 1e-3))
            if copy_bytes_per_s:
                row["pct_of_copy"] = 100 * row["bytes_per_s"] / copy_bytes_per_s
        except Exception as exc:
            row["error"] = _error(exc)
        rows.append(row)
    return rows


# -- printing ---------------------------------------------------------------------------------------
def print_profile(row: ProfiledPrefill, top: int) -> None:
    off = f" without {', '.join(row.paths_off)}" if row.paths_off else ""
    if row.error:
        print(f"== {row.model} {row.backend}{off}: FAILED {row.error}")
        return
    print(f"== {row.model} {row.backend}{off}, T={row.tokens}: wall {row.wall_ms:.3f} ms (median of "
          f"{len(row.wall_runs_ms)}), first kernel to last {row.span_ms:.3f} ms, device busy {row.busy_ms:.3f} ms, "
          f"kernels' sum {row.kernel_ms:.3f} ms, "
          f"{row.kernels} kernels")
    if row.families:
        print("   " + " | ".join(f"{f} {v['device_ms']:.3f} ms ({v['count']})" for f, v in row.families.items()))
    if row.check:
        c = row.check
        print(f"   check: {c['error']:.4f} from float32 (bf16 reference {c['reference_error']:.4f}, bound "
              f"{c['bound']:.4f}): {'passed' if c['passed'] else 'FAILED'}")
    for r in row.table[:top]:
        print(f"   {r.device_ms:8.3f} ms {r.count:5d}  {r.family:<9} {r.name[:110]}")


def print_ablation(base: ProfiledPrefill, row: ProfiledPrefill) -> None:
    if row.error or base.error:
        print(f"   without {', '.join(row.paths_off)}: FAILED {row.error or base.error}")
        return
    check = "" if not row.check else f", check {'passed' if row.check['passed'] else 'FAILED'}"
    print(f"   without {', '.join(row.paths_off):<22} wall {row.wall_ms:7.3f} ms ({row.wall_ms - base.wall_ms:+.3f}), "
          f"busy {row.busy_ms:7.3f} ms ({row.busy_ms - base.busy_ms:+.3f}), {row.kernels} kernels "
          f"({row.kernels - base.kernels:+d}){check}")


def print_sweep(rows: list[dict]) -> None:
    for r in rows:
        s = " ".join(f"{k}={v}" for k, v in r["settings"].items())
        if r.get("error"):
            print(f"   {s:<42} FAILED {r['error']}")
            continue
        pct = f" ({r['pct_of_copy']:.0f}% of copy)" if "pct_of_copy" in r else ""
        print(f"   {s:<42} {r['us']:8.1f} us {r['bytes_per_s'] / 1e9:7.0f} GB/s{pct}"
              f"{'' if r['same_bits'] else '  DIFFERENT BITS'}")


# -- the command ------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    from .cli import positive_int, results_name

    p = argparse.ArgumentParser(prog="python -m labkit.bench.prefill_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3.5-0.8b", "lfm2-350m"], choices=list(PRESETS))
    p.add_argument("--tokens", type=positive_int, default=4096)
    p.add_argument("--backend", default="fused+graph", help="a labkit backend (default fused+graph; on a CPU: fused)")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed calls (median)")
    p.add_argument("--warmup", type=int, default=None, help="calls before timing (default: until the graph is captured, +1)")
    p.add_argument("--device", default="auto")
    p.add_argument("--top", type=int, default=30, help="kernels printed per profile (all are written)")
    p.add_argument("--attribution", action="store_true", help="name the torch op that launches each kernel")
    p.add_argument("--check", action="store_true", help="last-token logits against a float32 run")
    p.add_argument("--ablate", nargs="+", default=[], metavar="PATH",
                   help="fast paths to switch off one at a time (labkit.decode.fused_prefill.FAST_PATHS), or all")
    p.add_argument("--sweep-gdn-inputs", action="store_true", help="gdn_inputs' launch settings, timed alone (CUDA)")
    p.add_argument("--name", type=results_name, default="prefill-profile", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    from ..decode.fused_prefill import FAST_PATHS
    from ..lab.hw import device_facts
    from ..lab.notebooks import cpu_environment
    from .results import write_document

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    ablate = list(FAST_PATHS) if args.ablate == ["all"] else args.ablate
    unknown = [a for a in ablate if a not in FAST_PATHS]
    if unknown:
        parser.error(f"argument --ablate: unknown path {unknown[0]!r}; choose from {', '.join(FAST_PATHS)} or all")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if not device.startswith("cuda"):
        cpu_environment()  # Triton's interpreter, chosen before triton is imported
    facts = device_facts(device, measure=device.startswith("cuda"))
    results, failed = [], False
    for name in args.models:
        model = build(name, dtype=torch.bfloat16, device=device, seed=0)
        ids = _prompt(model, 1, args.tokens)
        warmup = default_warmup(args.backend, model.device) if args.warmup is None else args.warmup
        check = float32_check(model, ids) if args.check else None
        entry: dict = {"model": name}
        runs = []
        for off in [(), *((p,) for p in ablate)]:
            with paths_switched_off(off):
                row, logits = profile_prefill(model, args.backend, ids, warmup, args.repeats, off)
            if check is not None and logits is not None:
                row.check = check(logits)
            failed |= bool(row.error) or bool(row.check and not row.check["passed"])
            runs.append(row)
            if off:
                print_ablation(runs[0], row)
            else:
                print_profile(row, args.top)
        entry["profile"], entry["ablations"] = asdict(runs[0]), [asdict(r) for r in runs[1:]]
        if args.attribution:
            try:
                entry["launched_by"] = launched_by(model, args.backend, ids)
            except Exception as exc:  # a diagnosis: its failure is recorded, the figures above stand
                entry["launched_by_error"] = _error(exc)
                print(f"   attribution FAILED {entry['launched_by_error']}")
            else:
                print("   launched by (eager prefill; memory and torch kernels): " + "; ".join(
                    f"{k[:48]} <- {v}" for k, v in entry["launched_by"].items() if family(k) in ("memory", "torch")))
        if args.sweep_gdn_inputs and "gdn" in model.cfg.layer_types:
            if device.startswith("cuda"):
                print(f"   gdn_inputs alone, {args.tokens} tokens:")
                entry["gdn_inputs_sweep"] = sweep_gdn_inputs(model, args.tokens, facts.copy_bytes_per_s)
                print_sweep(entry["gdn_inputs_sweep"])
                failed |= any(r.get("error") or not r.get("same_bits") for r in entry["gdn_inputs_sweep"])
            else:
                print("   --sweep-gdn-inputs times the kernel in CUDA graphs: skipped without a GPU")
        results.append(entry)
        # rewritten after each preset: a run stopped by a time limit keeps what it measured
        path = write_document(args.name, "prefill-profile", {
            "tokens": args.tokens, "backend": args.backend, "repeats": args.repeats, "fast_paths": list(FAST_PATHS),
            "results": results,
            "note": "wall: CUDA events around decoder.prefill (host work included), median of the repeats; the "
                    "kernel table: one profiled call (for a graph backend, one replay: memsets and copies are "
                    "graph nodes); busy: the union of the kernels' intervals",
        }, facts, command=shlex.join(["python", "-m", "labkit", "bench", "prefill-profile", *argv]), data_dir=args.data_dir)
        del model, check
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
