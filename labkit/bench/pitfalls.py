"""``python -m labkit bench pitfalls``: the article's pitfalls reproduced on this GPU (labkit.lab.pitfalls).

Three sections, each written to ``data/bench/<gpu>/<name>.json`` (kind ``pitfalls``):

- ``smem``: the device's shared-memory limits (CUDA runtime and torch's view), a CUDA kernel
  launched at 48 KB and 64 KB without opting in, then after cudaFuncSetAttribute at 64 KB, at the
  opt-in limit and 1 KB past it, and a Triton matmul at a 96 KB and a 256 KB tiling: what launched,
  the runtime's error text where it did not, and whether the output matched torch;
- ``host``: the host work torch.profiler finds in a decode step of ``--backend`` (default the
  fused one), clean and wrapped two wrong ways (positions kept on the host; ``.item()`` each step);
- ``tf32``: fp32 matmul TFLOP/s with TF32 off and on, and bf16, at aligned and unaligned sizes,
  each with its error against float64.

Exit status 1 when the run disagrees with what labkit.lab.pitfalls states (a launch that should
have failed ran, a broken step went unnoticed, a section crashed); findings in the clean step are
recorded, not an error. Needs a CUDA GPU (exit 2 without); the parts that run on a CPU are
tests/test_pitfalls.py.
"""

from __future__ import annotations

import argparse
import shlex
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

SECTIONS = ("smem", "host", "tf32")
QUICK_SIZES = (1024, 1023)


def run_smem() -> tuple[dict, list[str]]:
    from ..lab import pitfalls as pf

    limits, report = pf.device_smem_limits()
    rows, failed = [], {}
    build_error = report["cudaDeviceGetAttribute"].get("error")
    if build_error:  # the extension did not build (limits from torch): not built a second time
        failed["cuda_smem_demo"] = build_error
    for demo in (pf.cuda_smem_demo, pf.triton_smem_demo):  # one failing (a build) leaves the other to run
        if demo.__name__ in failed:
            continue
        try:
            rows += demo(limits)
        except Exception as exc:  # noqa: BLE001 - recorded in the file and as a surprise
            traceback.print_exc()
            failed[demo.__name__] = f"{type(exc).__name__}: {exc}"[:2000]
    for r in rows:
        outcome = "launched" + ("" if r.correct is None else f", output {'matches' if r.correct else 'DIFFERS'}")
        shown = outcome if r.launched else f"failed: {r.error}"
        print(f"smem {r.api:6s} {r.case:60s} {r.shared_bytes:7d} B {r.verdict:9s} {shown}")
        if r.opt_in_error:
            print(f"{'':12s}cudaFuncSetAttribute: {r.opt_in_error}")
    return {"limits": asdict(limits), "limits_seen": report, "launches": [asdict(r) for r in rows],
            "failed": failed, "verdicts": pf.VERDICTS}, \
        pf.smem_surprises(rows) + [f"{name} failed: {text}" for name, text in failed.items()]


def run_host(model_name: str, backend: str, steps: int) -> tuple[dict, list[str]]:
    import labkit

    from ..lab import pitfalls as pf

    model = labkit.build(model_name, dtype=torch.bfloat16, device="cuda", seed=0)
    reports = pf.decode_host_work(model, backend, steps=steps)
    for name, report in reports.items():
        print(f"host {backend} step, {name}:\n  " + str(report).replace("\n", "\n  "))
    return {"model": model_name, "backend": backend, "steps": steps,
            "variants": {name: [asdict(w) for w in report] for name, report in reports.items()}}, \
        pf.host_work_surprises(reports)


def run_tf32(sizes: tuple[int, ...], repeats: int) -> tuple[dict, list[str]]:
    from ..lab import pitfalls as pf

    rows = pf.tf32_table("cuda", sizes, repeats=repeats)
    for r in rows:
        print(f"tf32 n={r.n:5d} {r.mode:4s} {r.ms:8.3f} ms {r.tflops:7.1f} TFLOP/s rel err {r.rel_err:.2e}")
    summary = pf.tf32_summary(rows)
    for n, ratios in summary["speed_over_fp32"].items():
        print(f"tf32 n={n}: " + ", ".join(f"{m} {v:.2f}x fp32" for m, v in ratios.items()))
    bad = [f"n={r.n} {r.mode}: error {r.rel_err} is not finite" for r in rows if not r.rel_err < float("inf")]
    return {"rows": [asdict(r) for r in rows], "summary": summary}, bad


def main(argv: list[str]) -> int:
    from ..config import PRESETS
    from ..lab.hw import device_facts
    from ..lab.pitfalls import TF32_SIZES
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_document

    p = argparse.ArgumentParser(prog="labkit bench pitfalls", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="the sections to run")
    p.add_argument("--model", choices=sorted(PRESETS), default="lfm2-350m",
                   help="host: the preset whose decode step is profiled (random bf16 weights)")
    p.add_argument("--backend", default="fused", help="host: the backend whose step is profiled")
    p.add_argument("--steps", type=positive_int, default=3, help="host: profiled steps per variant")
    p.add_argument("--sizes", nargs="+", type=positive_int, default=None, help="tf32: matrix sizes (default "
                   f"{' '.join(map(str, TF32_SIZES))})")
    p.add_argument("--repeats", type=positive_int, default=10, help="tf32: timed calls per matmul")
    p.add_argument("--quick", action="store_true", help=f"a fast self-check: tf32 at {QUICK_SIZES} only, 3 repeats")
    p.add_argument("--name", type=results_name, default="pitfalls", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench pitfalls launches CUDA and Triton kernels and profiles a GPU decode step: it needs a CUDA GPU "
              "(what runs without one is checked by python -m pytest tests/test_pitfalls.py)")
        return 2
    sizes = tuple(args.sizes or (QUICK_SIZES if args.quick else TF32_SIZES))
    runs = {"smem": run_smem, "host": lambda: run_host(args.model, args.backend, args.steps),
            "tf32": lambda: run_tf32(sizes, 3 if args.quick else args.repeats)}
    doc, surprises = {}, []
    for section in SECTIONS:
        if section not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            doc[section], found = runs[section]()
        except Exception as exc:  # noqa: BLE001 - recorded in the file; the other sections still run
            traceback.print_exc()
            doc[section], found = {"error": f"{type(exc).__name__}: {exc}"}, [f"{section} failed: {exc!r}"]
        doc[section]["seconds"] = time.perf_counter() - t0
        surprises += found
    doc["surprises"] = surprises
    command = shlex.join(["python", "-m", "labkit", "bench", "pitfalls", *argv])
    path = write_document(args.name, "pitfalls", doc, device_facts("cuda"), command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    for s in surprises:
        print(f"SURPRISE: {s}")
    return 1 if surprises else 0
