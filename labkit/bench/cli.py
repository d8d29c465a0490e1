"""``python -m labkit bench <what>``: measure, print, write a results file (``--help`` lists the subcommands;
:data:`OWN_PARSERS` are those with their own options: ``python -m labkit bench <name> --help``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from ..config import PRESETS
from ..decode.fused_prefill import FAST_PATHS
from ..lab.hw import device_facts
from ..model import HybridLM, build
from .article_cache import add_arguments as add_article_cache_arguments
from .article_cache import command_line as article_cache_command
from .article_cache import run as run_article_cache
from .decode import PEERS, DecodeResult, time_decode, time_prefill
from .ops import bench_ops
from .results import (DATA_DIR, ResultsFileError, check_name, load_results, markdown_table, plot_prefill_file,
                      update_readme, write_results)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (batch sizes, repeats, token counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (budgets)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def results_name(text: str) -> str:
    """An argparse type: a results file's name (:func:`labkit.bench.results.check_name`)."""
    try:
        return check_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def known_impls() -> list[str]:
    """What ``--impls`` accepts: every labkit backend, then the peers."""
    from ..decode import reference_graph  # noqa: F401  registers "reference+graph"
    from ..decode.registry import BACKENDS

    return [*BACKENDS, *PEERS]


def _models(names: list[str], device: str, dtype: torch.dtype):
    """The presets one at a time (random weights), each freed before the next is built."""
    for n in names:
        if n not in PRESETS:
            raise SystemExit(f"unknown preset {n!r}; presets: {', '.join(PRESETS)}")
    for n in names:
        model: HybridLM = build(n, dtype=dtype, device=device, seed=0)
        yield model
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


def _print_rows(rows: list) -> None:
    for r in rows:
        if r.error:
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} FAILED {r.error}")
        elif isinstance(r, DecodeResult):
            pct = f"{r.pct_of_roofline:5.1f}% of roofline" if r.pct_of_roofline is not None else ""
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} {r.tokens_per_s:10.1f} tok/s "
                  f"{r.step_ms:8.3f} ms/step {r.achieved_bytes_per_s / 1e9:8.1f} GB/s {pct}")
            for w in r.wall_clock:
                setup = f", set-up {w['setup_s'] * 1e3:.1f} ms per call" if w["setup_s"] is not None else ""
                print(f"{'':>14} {'':>22} {'':5} {w['tokens_per_s']:10.1f} tok/s wall clock, generate() x{w['calls']} "
                      f"in {w['seconds']:.2f} s{setup}")
        else:
            first = f" (first call of a new decoder {r.first_call_ms:.1f} ms)" if r.first_call_ms is not None else ""
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} T={r.tokens:<5} {r.ms:10.2f} ms{first}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit bench", epilog="also, each with its own --help: " + ", ".join(OWN_PARSERS))
    sub = p.add_subparsers(dest="what", required=True)
    for what in ("decode", "prefill", "ops"):
        s = sub.add_parser(what)
        s.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"])
        s.add_argument("--batch", nargs="+", type=positive_int, default=[1] if what == "prefill" else [1, 16])
        s.add_argument("--device", default="auto")
        s.add_argument("--name", required=True, type=results_name, help="results go to data/bench/<gpu>/<name>.json")
        s.add_argument("--data-dir", type=Path, default=DATA_DIR)
        if what == "ops":
            s.add_argument("--max-len", type=positive_int, default=4096, help="KV cache slots of the attention step")
            s.add_argument("--no-peers", action="store_true", help="leave out fla's Gated DeltaNet step")
            continue
        s.add_argument("--impls", nargs="+", default=["reference", "transformers"],
                       help=f"labkit backends and/or peers {PEERS}")
        s.add_argument("--repeats", type=positive_int, default=5)
        if what == "decode":
            s.add_argument("--prompt", type=positive_int, default=128)
            s.add_argument("--new-tokens", type=positive_int, default=128)
            s.add_argument("--wall-calls", nargs="*", type=positive_int, default=[1, 10],
                           help="also time labkit.generate called N times in a row, set-up included (labkit backends)")
        else:
            s.add_argument("--lengths", nargs="+", type=positive_int, default=[512, 4096])
            s.add_argument("--peer-repeats", type=positive_int, default=None,
                           help="repeats for the peers (transformers is slow at long prompts); default --repeats")
            s.add_argument("--gdn-kernel", metavar="NAME", type=results_name,
                           help="first, in this process, the Gated DeltaNet kernel beside fla "
                                "(python -m labkit.bench.gdn_prefill: T = 1k..64k and 8 x 2k packed), to NAME.json: "
                                "with fla on the path, fla's autotuning is then paid once for it and transformers+fla")
            s.add_argument("--gdn-variants", nargs="*", default=["default"], help="its launch settings (gdn_prefill.VARIANTS)")
            s.add_argument("--plot", nargs="*", type=Path, default=None, metavar="MORE_JSON",
                           help="also draw prefill ms against prompt length: <name>.png beside the json, from "
                                "this run's rows and those of the given results files (e.g. a transformers+fla run)")
    ac = sub.add_parser("article-cache", help="the article's two-level cache: skipped work, error, bits per byte, "
                        "tok/s across thresholds (labkit.bench.article_cache)")
    add_article_cache_arguments(ac)
    ac.add_argument("--data-dir", type=Path, default=DATA_DIR)
    c = sub.add_parser("cache", help="the exact prefix cache: TTFT with hits, workloads, bf16 snapshots")
    c.add_argument("--models", nargs="+", default=None,
                   help="presets or shipped checkpoints (default: qwen3.5-0.8b on a GPU, byte-qwen3.5-6m on a CPU)")
    c.add_argument("--backends", nargs="+", default=None, help="default: fused fused+graph on a GPU, reference on a CPU")
    c.add_argument("--experiments", nargs="+", default=["ttft", "workload", "precision"])
    c.add_argument("--ttft-cases", nargs="+", default=None, metavar="PREFIX:SUFFIX:BLOCK",
                   help="default on a GPU: 4096:64:256 480:32:544 480:32:64")
    c.add_argument("--block-size", type=positive_int, default=None, help="workloads' block (default 256 on a GPU, 8 on a CPU)")
    c.add_argument("--budgets", nargs="+", type=positive_float, default=[8, 16], help="workload budgets, in snapshots")
    c.add_argument("--policies", nargs="+", default=["lru", "flops", "lru+ends", "flops+ends"],
                   help="eviction policy, +ends for Marconi-style admission (states at prompt ends and branch points)")
    c.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="auto: bf16 on a GPU")
    c.add_argument("--workloads", nargs="+", default=None, help="shared-prefix, multi-turn, unrelated (default: all)")
    c.add_argument("--steps", type=positive_int, default=None, help="precision: decode steps (default 1000 GPU, 30 CPU)")
    c.add_argument("--repeats", type=positive_int, default=5)
    c.add_argument("--warm-up", action="store_true",
                   help="ttft: pay the first call's compiles and captures at PrefixCache(..., warm_up=decoder), "
                        "reported apart (warm_up_ms) from the first miss and hit after it and the steady state")
    c.add_argument("--paths-off", nargs="+", default=[], metavar="PATH",
                   help="switch these fast paths of the fused prefill off for the whole run "
                        "(labkit.decode.fused_prefill.FAST_PATHS): what each saves, measured as the run without it")
    c.add_argument("--device", default="auto")
    c.add_argument("--name", required=True, type=results_name, help="results go to data/bench/<gpu>/<name>.json")
    c.add_argument("--data-dir", type=Path, default=DATA_DIR)
    sub.add_parser("hw")
    t = sub.add_parser("table")
    t.add_argument("--readme", type=Path, help="rewrite the results section of this README")
    t.add_argument("--data-dir", type=Path, default=DATA_DIR)
    return p


# subcommands with their own options (python -m labkit bench <name> --help): name -> (module, its main's extra args)
OWN_PARSERS = {
    "chain": ("labkit.bench.chain", ()),  # the step's projections chained in one graph
    "ladder": ("labkit.bench.ladder", ()),  # every rung, both models, batch 1 and 16: the headline figures
    "tma": ("labkit.bench.tma", ()),  # the CUDA TMA GEMV against Triton and cuBLAS
    "tma-alignment": ("labkit.bench.tma_alignment", ()),  # the TMA GEMV's weight base / row stride alignment
    "latency": ("labkit.bench.latency", ()),  # pointer-chase load latency per memory level
    "gdn-prefill": ("labkit.bench.gdn_prefill", ()),  # the chunked Gated DeltaNet prefill kernel beside fla
    "fusion-evidence": ("labkit.bench.fusion_evidence", ()),  # notebook 02's evidence at the real shapes
    "hit-timeline": ("labkit.bench.prefix_hit", ("hit-timeline",)),  # a prefix-cache hit: clock vs GPU time
    "hit-host": ("labkit.bench.prefix_hit", ("hit-host",)),  # a prefix-cache hit's host side, piece by piece
    "miss-timeline": ("labkit.bench.prefix_miss", ()),  # a prefix-cache miss against no cache: clock vs GPU time
    "ncu-metrics": ("labkit.bench.ncu_metrics", ()),  # which Nsight Compute metric names exist on this GPU
    "persistent-timeline": ("labkit.bench.persistent_timeline", ()),  # one persistent step, stamped on the device
    "pitfalls": ("labkit.bench.pitfalls", ()),  # the article's pitfalls: shared memory past 48 KB, host work, TF32
    "counters": ("labkit.bench.counters", ("counters",)),  # one decode step's kernels under Nsight Compute
    "bank-conflicts": ("labkit.bench.counters", ("bank-conflicts",)),  # shared-tile transposes: predicted, counted
    "prefill-profile": ("labkit.bench.prefill_profile", ()),  # a prefill's device time, kernel by kernel
    "tail-ops": ("labkit.bench.tail_ops", ()),  # the MLP gate|up (a hit's tail, a prompt), a tail's attention
    "generate": ("labkit.bench.generate_wall", ()),  # generate's wall clock, set-up included, and its split
}


def main(argv: list[str]) -> int:
    if argv and argv[0] in OWN_PARSERS:
        import importlib

        module, extra = OWN_PARSERS[argv[0]]
        status = importlib.import_module(module).main(argv[1:], *extra)
        return 0 if status is None else status
    parser = _parser()
    args = parser.parse_args(argv)
    unknown = [i for i in getattr(args, "impls", None) or [] if i not in known_impls()]
    if unknown:  # refused before any model is built: a typo would otherwise be a FAILED row
        parser.error(f"argument --impls: unknown implementation {unknown[0]!r}; choose from {', '.join(known_impls())}")
    presets = [m for m in getattr(args, "models", None) or [] if m not in PRESETS]
    if presets and args.what in ("decode", "prefill", "ops"):  # (bench cache also takes shipped checkpoints)
        parser.error(f"argument --models: unknown preset {presets[0]!r}; choose from {', '.join(PRESETS)}")
    paths = [p for p in getattr(args, "paths_off", None) or [] if p not in FAST_PATHS]
    if paths:
        parser.error(f"argument --paths-off: unknown path {paths[0]!r}; choose from {', '.join(FAST_PATHS)}")
    if not torch.cuda.is_available():  # Triton kernels can only run in its interpreter here
        from ..lab.notebooks import cpu_environment

        cpu_environment()
    if args.what == "table":
        try:
            docs = load_results(args.data_dir)
            table = markdown_table(docs)
        except ResultsFileError as exc:
            print(f"labkit bench table: {exc}", file=sys.stderr)
            return 2
        if args.readme:
            update_readme(args.readme, docs)
        print(table)
        return 0
    device = ("cuda" if torch.cuda.is_available() else "cpu") if getattr(args, "device", "auto") == "auto" else args.device
    if getattr(args, "gdn_kernel", None) and not device.startswith("cuda"):
        print("--gdn-kernel times the kernel inside CUDA graphs: it needs a CUDA GPU")
        return 2
    if args.what == "ops" and not device.startswith("cuda"):
        print("bench ops times each op inside a CUDA graph: it needs a CUDA GPU (the CPU tests check the "
              "same ops: python -m pytest tests/test_bench_ops.py)")
        return 2
    facts = device_facts(device)
    print(f"{facts.name}: copy {facts.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {facts.bf16_flops / 1e12:.0f} TFLOP/s")
    if args.what == "hw":
        return 0
    if args.what == "article-cache":
        args.device = device
        rows = run_article_cache(args)
        path = write_results(args.name, "article-cache", rows, facts, command=article_cache_command(argv),
                             data_dir=args.data_dir)
        print(f"wrote {path}")
        return _status(rows)
    rows: list = []
    if args.what == "cache":
        from .cache import run_cache_bench
        from .prefill_profile import paths_switched_off

        with paths_switched_off(tuple(args.paths_off)):
            rows = run_cache_bench(args, device)
        command = shlex.join(["python", "-m", "labkit", "bench", *argv])
        path = write_results(args.name, "prefix-cache", rows, facts, command=command, data_dir=args.data_dir)
        print(f"wrote {path}")
        return _status(rows)
    command = shlex.join(["python", "-m", "labkit", "bench", *argv])
    if getattr(args, "gdn_kernel", None):
        from .gdn_prefill import bench_gdn_prefill, print_rows

        kernel_rows = bench_gdn_prefill(variants=tuple(args.gdn_variants), reps=10)
        print_rows(kernel_rows)
        print(f"wrote {write_results(args.gdn_kernel, 'gdn-prefill', kernel_rows, facts, command=command, data_dir=args.data_dir)}")
    for model in _models(args.models, device, torch.bfloat16):
        for b in args.batch:
            if args.what == "ops":
                rows += bench_ops(model, b, max_len=args.max_len, peers=not args.no_peers,
                                  copy_bytes_per_s=facts.copy_bytes_per_s)
                continue
            for impl in args.impls:
                if args.what == "decode":
                    rows.append(time_decode(model, impl, b, args.prompt, args.new_tokens, args.repeats, facts=facts,
                                            wall_calls=tuple(args.wall_calls)))
                    _print_rows(rows[-1:])
                else:
                    repeats = args.peer_repeats if impl in PEERS and args.peer_repeats else args.repeats
                    rows += [time_prefill(model, impl, n, b, repeats) for n in args.lengths]
                    _print_rows(rows[-len(args.lengths):])
                # the rows so far, rewritten as they grow: a run stopped by a time limit keeps them
                write_results(args.name, args.what, rows, facts, command=command, data_dir=args.data_dir)
    path = write_results(args.name, args.what, rows, facts, command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    if getattr(args, "plot", None) is not None:
        print(f"wrote {plot_prefill_file(path, *args.plot)}")
    return _status(rows)


def _status(rows: list) -> int:
    """The exit status of a run: 1 when a row failed (it is written, with its error), else 0."""
    failed = [r for r in rows if getattr(r, "error", None)]
    if failed:
        print(f"{len(failed)} of {len(rows)} rows FAILED (first: {failed[0].error})", file=sys.stderr)
    return 1 if failed else 0
