"""``python -m labkit bench counters`` and ``bench bank-conflicts``: hardware counters read with ncu.

    python -m labkit bench counters --model lfm2-350m qwen3.5-0.8b --name ncu-decode
    python -m labkit bench bank-conflicts --name bank-conflicts

``counters``: one eager decode step of each preset (``python -m labkit.lab.counters_target``) under
Nsight Compute with :data:`labkit.lab.counters.DECODE_METRICS`; writes every launch's counters and a
summary per kernel and launch shape to ``data/bench/<gpu>/<name>.json`` (kind ``ncu-decode``) and
prints the summary. Without ncu or its counters: a one-line reason, exit status 2, nothing written.

``bank-conflicts``: the three shared-tile transposes of :mod:`labkit.lab.bank_conflicts` checked
against ``x.t()``, timed, predicted from the bank arithmetic and (where ncu can read counters)
measured with the bank-conflict counters; kind ``bank-conflicts``. Without ncu the file still
holds the check, the times and the prediction, and says why the counters are missing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict
from pathlib import Path


def _command(what: str, argv: list[str]) -> str:
    return shlex.join(["python", "-m", "labkit", "bench", what, *argv])


def _usable(metrics) -> tuple[list[str] | None, str | None]:
    """(names ncu rejected on a one-kernel probe, None) or (None, why counters cannot be read)."""
    from ..lab import counters

    reason = counters.ncu_missing_reason()  # the probe answers for the permission itself
    if reason:
        return None, reason
    try:
        return counters.check_metrics(metrics).rejected, None
    except counters.CountersNotPermitted as exc:
        return None, str(exc)
    except counters.NcuError as exc:
        return None, f"ncu failed on a one-kernel probe: {exc}"


def main_counters(argv: list[str]) -> int:
    from ..config import PRESETS
    from ..lab import counters
    from ..lab.counters_target import EAGER_BACKENDS
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_document

    p = argparse.ArgumentParser(prog="labkit bench counters", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"], choices=list(PRESETS))
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--context", type=positive_int, default=32)
    p.add_argument("--steps", type=int, default=2, help="decode steps after the context, the last profiled (>= 2)")
    p.add_argument("--backend", choices=EAGER_BACKENDS, default="fused")
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds per preset's ncu run")
    p.add_argument("--name", type=results_name, default="ncu-decode", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("argument --steps: at least 2 (the first compiles and loads the kernels)")
    rejected, reason = _usable(counters.DECODE_METRICS)
    if reason:
        print(f"bench counters: {reason}")
        return 2
    if rejected:
        print(f"ncu rejects {', '.join(rejected)} here: measured without them")
    from ..lab.hw import device_facts

    facts = device_facts("cuda")
    launches, summaries, commands, names, errors = [], [], {}, {}, {}
    for model in args.model:
        target = [sys.executable, "-m", "labkit.lab.counters_target", "--model", model, "--batch", str(args.batch),
                  "--context", str(args.context), "--steps", str(args.steps), "--backend", args.backend]
        try:
            prof = counters.profile(target, counters.DECODE_METRICS, profile_from_start=False, rejected=rejected,
                                    timeout_s=args.timeout)
        except counters.CountersNotPermitted as exc:
            print(f"bench counters: {exc}")
            return 2
        except counters.NcuError as exc:  # recorded; the other presets still run
            print(f"bench counters: {model} FAILED: {exc}")
            errors[model] = str(exc)[-2000:]
            continue
        rejected, names, commands[model] = prof.rejected, prof.names, prof.command_line
        rows = counters.summarize(prof)
        total_us = sum(s.time_us or 0.0 for s in rows)
        total_bytes = sum(s.dram_bytes or 0.0 for s in rows)
        print(f"\n{model}, one {args.backend} decode step at batch {args.batch}, context {args.context}: "
              f"{len(prof.rows)} launches, {total_us:.1f} us of GPU time, {total_bytes / 1e6:.1f} MB from/to HBM "
              f"({total_bytes / max(total_us, 1e-9) / 1e6:.2f} TB/s over the kernels' time)")
        print(counters.format_summaries(rows, facts.copy_bytes_per_s))
        summaries += [{"model": model, **asdict(s)} for s in rows]
        launches += [{"model": model, "launch": r.launch, "kernel": r.kernel,
                      "name": counters.short_kernel_name(r.kernel), "op": counters.op_of(r.kernel),
                      "grid": r.grid, "block": r.block,
                      "metrics": {k: prof.value(r, k) for k, n in prof.names.items() if n},
                      "units": {k: r.metrics[n].base_unit for k, n in prof.names.items() if n and n in r.metrics}}
                     for r in prof.rows]
    meanings = [{"key": m.key, "name": names.get(m.key), "meaning": m.meaning} for m in counters.DECODE_METRICS]
    path = write_document(args.name, "ncu-decode", {
        "models": args.model, "backend": args.backend, "batch": args.batch, "context": args.context,
        "metrics": meanings, "rejected": rejected, "ncu_commands": commands, "errors": errors,
        "summary": summaries, "results": launches,
        "note": "values in base units (seconds, bytes, bytes/second, %); ncu flushes the caches before each replay "
                "pass, so every launch is measured with a cold L2, and with --clock-control none at the GPU's "
                "own clocks",
    }, facts, command=_command("counters", argv), data_dir=args.data_dir)
    print(f"wrote {path}")
    return 1 if errors else 0


def main_bank_conflicts(argv: list[str]) -> int:
    import torch

    from ..lab import bank_conflicts as bc
    from ..lab import counters
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_document

    p = argparse.ArgumentParser(prog="labkit bench bank-conflicts", description=__doc__.split("\n\n")[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", nargs=2, type=positive_int, default=[8192, 8192], metavar=("ROWS", "COLS"),
                   help="the timed matrix")
    p.add_argument("--profile-size", nargs=2, type=positive_int, default=[4096, 4096], metavar=("ROWS", "COLS"),
                   help="the matrix under ncu (whole tiles: multiples of 32 keep the prediction exact)")
    p.add_argument("--repeats", type=positive_int, default=20)
    p.add_argument("--no-counters", action="store_true", help="skip ncu")
    p.add_argument("--name", type=results_name, default="bank-conflicts", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench bank-conflicts runs CUDA kernels: it needs a CUDA GPU (the CPU tests check the bank "
              "arithmetic and compile the kernels: python -m pytest tests/test_counters.py)")
        return 2
    from ..lab.hw import device_facts

    failures = bc.check()
    if failures:
        print("the transposes do not match x.t():\n" + "\n".join(failures))
        return 1
    print(f"all {len(bc.LAYOUTS)} layouts match x.t() on {len(bc.CHECK_SHAPES)} shapes (poisoned outputs, "
          f"irregular sizes)")
    timed = {t.layout: t for t in bc.time_layouts(*args.size, repeats=args.repeats)}
    rows, cols = args.profile_size
    predicted = {layout: bc.predict(layout, rows, cols) for layout in bc.LAYOUTS}
    measured, command, note = None, None, None
    if args.no_counters:
        note = "skipped (--no-counters)"
    else:
        rejected, note = _usable(bc.bank_metrics())
        if note is None:
            try:
                measured, prof = bc.profile_layouts(rows, cols, rejected=rejected)
                command = prof.command_line
            except counters.NcuError as exc:
                note = str(exc)
    if note:
        print(f"no counters: {note}")
    results = []
    print(f"{'layout':<9} {'GB/s':>7} {'ms':>7}   predicted ld/st conflicts   measured ld/st conflicts   "
          f"wavefronts/request ld (pred, meas)")
    for layout in bc.LAYOUTS:
        t, pr = timed[layout], predicted[layout]
        m = (measured or {}).get(layout)
        per_req = pr.ld_wavefronts / pr.ld_requests
        meas_req = (m["wavefronts_ld"] / m["requests_ld"] if m and m.get("wavefronts_ld") is not None
                    and m.get("requests_ld") else None)
        ld, st = ((f"{m[k]:,.0f}" if m and m.get(k) is not None else "-") for k in ("bank_conflicts_ld", "bank_conflicts_st"))
        print(f"{layout:<9} {t.gb_per_s:7.0f} {t.ms:7.3f}   {pr.ld_conflicts:>12,} / {pr.st_conflicts:<10,} {ld:>12} / {st:<10} "
              f"  {per_req:.1f}, {'-' if meas_req is None else f'{meas_req:.1f}'}")
        results.append({"layout": layout, "timed": asdict(t), "prediction": pr.to_dict(), "counters": m})
    path = write_document(args.name, "bank-conflicts", {
        "banks": bc.BANKS, "bank_bytes": bc.BANK_BYTES, "tile": bc.TILE, "block": [bc.TILE, bc.BLOCK_ROWS],
        "checked_shapes": [list(s) for s in bc.CHECK_SHAPES], "profile_size": [rows, cols],
        "results": results, "counters_note": note, "ncu_command": command,
        "metrics": [{"key": m.key, "names": list(m.names), "meaning": m.meaning} for m in bc.bank_metrics()],
    }, device_facts("cuda", measure=False), command=_command("bank-conflicts", argv), data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0


def main(argv: list[str], what: str) -> int:
    return {"counters": main_counters, "bank-conflicts": main_bank_conflicts}[what](argv)
