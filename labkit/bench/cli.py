"""``python -m labkit bench {decode,prefill,ops,chain,hw,table}``: measure, print, write a results file."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import torch

from ..config import PRESETS
from ..hw import device_facts
from ..model import HybridLM, build
from .decode import PEERS, DecodeResult, time_decode, time_prefill
from .ops import bench_ops
from .results import DATA_DIR, load_results, markdown_table, update_readme, write_results


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
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} T={r.tokens:<5} {r.ms:10.2f} ms")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit bench")
    sub = p.add_subparsers(dest="what", required=True)
    for what in ("decode", "prefill", "ops"):
        s = sub.add_parser(what)
        s.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"])
        s.add_argument("--batch", nargs="+", type=int, default=[1] if what == "prefill" else [1, 16])
        s.add_argument("--device", default="auto")
        s.add_argument("--name", required=True, help="results go to data/bench/<gpu>/<name>.json")
        s.add_argument("--data-dir", type=Path, default=DATA_DIR)
        if what == "ops":
            s.add_argument("--max-len", type=int, default=4096, help="KV cache slots of the attention step")
            s.add_argument("--no-peers", action="store_true", help="leave out fla's Gated DeltaNet step")
            continue
        s.add_argument("--impls", nargs="+", default=["reference", "transformers"],
                       help=f"labkit backends and/or peers {PEERS}")
        s.add_argument("--repeats", type=int, default=5)
        if what == "decode":
            s.add_argument("--prompt", type=int, default=128)
            s.add_argument("--new-tokens", type=int, default=128)
            s.add_argument("--wall-calls", nargs="*", type=int, default=[1, 10],
                           help="also time labkit.generate called N times in a row, set-up included (labkit backends)")
        else:
            s.add_argument("--lengths", nargs="+", type=int, default=[512, 4096])
    sub.add_parser("hw")
    t = sub.add_parser("table")
    t.add_argument("--readme", type=Path, help="rewrite the results section of this README")
    t.add_argument("--data-dir", type=Path, default=DATA_DIR)
    return p


def main(argv: list[str]) -> int:
    if argv[:1] == ["chain"]:  # the step's projections chained in one graph: its own options
        from .chain import main as chain_main

        return chain_main(argv[1:])
    args = _parser().parse_args(argv)
    if not torch.cuda.is_available():  # Triton kernels can only run in its interpreter here
        from ..notebooks import cpu_environment

        cpu_environment()
    if args.what == "table":
        docs = load_results(args.data_dir)
        if args.readme:
            update_readme(args.readme, docs)
        print(markdown_table(docs))
        return 0
    device = ("cuda" if torch.cuda.is_available() else "cpu") if getattr(args, "device", "auto") == "auto" else args.device
    if args.what == "ops" and not device.startswith("cuda"):
        print("bench ops times each op inside a CUDA graph: it needs a CUDA GPU (the CPU tests check the "
              "same ops: python -m pytest tests/test_bench_ops.py)")
        return 2
    facts = device_facts(device)
    print(f"{facts.name}: copy {facts.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {facts.bf16_flops / 1e12:.0f} TFLOP/s")
    if args.what == "hw":
        return 0
    rows: list = []
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
                    rows += [time_prefill(model, impl, n, b, args.repeats) for n in args.lengths]
                    _print_rows(rows[-len(args.lengths):])
    command = shlex.join(["python", "-m", "labkit", "bench", *argv])
    path = write_results(args.name, args.what, rows, facts, command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0
