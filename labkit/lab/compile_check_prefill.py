"""Compile the chunked delta-rule prefill kernels (labkit.ops.chunk_delta_rule) for a GPU, on a
machine without one, and report registers, spills and shared memory per kernel variant.

    python -m labkit.lab.compile_check_prefill                 # sm_90 (H100/H200), Qwen3.5 shapes
    python -m labkit.lab.compile_check_prefill --block-v 32 64 --num-warps 4 8 --num-stages 1 2 3
    python -m labkit.lab.compile_check_prefill --sequences 8 --walk-programs-per-sm 1 2 4 --wide-warps 4 8

The stand-in driver of ``python -m labkit compile-check`` (:mod:`labkit.lab.compile_check`: nothing
runs; Triton compiles each launch down to a cubin with its bundled ptxas), driven through the
prefill launcher at H = 16, K = V = 128, bf16, packed sequences with checkpoints (the four kernels
of the chunk path; 2 and 8 sequences, so that the walk runs both narrow and widened blocks, in
either grid order), and the single-chunk kernel (sequences of <= 64 tokens), at the launch
settings given (each a list: every combination is compiled; default: the launcher's). Like compile-check,
it replaces Triton's driver: run it as its own process.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch

SHOWN = ("BLOCK_V", "HAS_INIT", "CHECKPOINTS", "BLOCKS_FIRST")
# chunk_delta_rule's launch settings of the chunk path, each an option of this command
CHUNK_SETTINGS = ("block_v", "num_warps", "num_stages", "prepare_warps", "products_warps", "output_block_v",
                  "output_warps", "walk_programs_per_sm", "wide_warps", "wide_stages")
# packed sequences of each call: 2 (a walk of 2 x 16 heads x 8 blocks of 16 columns = 256 programs
# keeps its narrow blocks) and 8 (1,024 narrow programs: the walk widens, labkit.ops.chunk_delta_rule.walk_block_v)
SEQUENCES = (2, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.lab.compile_check_prefill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    for name in CHUNK_SETTINGS:
        parser.add_argument("--" + name.replace("_", "-"), nargs="*", type=int, default=[None],
                            help="default: the launcher's")
    parser.add_argument("--walk-blocks-first", nargs="*", type=int, choices=(0, 1), default=[0, 1],
                        help="the walk's grid order (0: sequences first, 1: value blocks first)")
    parser.add_argument("--sequences", nargs="*", type=int, default=list(SEQUENCES),
                        help="packed sequences of each call (the walk widens its blocks for many)")
    parser.add_argument("--single-block-v", nargs="*", type=int, default=[None],
                        help="the single-chunk kernel's value columns (default: the launcher's choice)")
    parser.add_argument("--single-warps", nargs="*", type=int, default=[None], help="the single-chunk kernel's warps")
    args = parser.parse_args(argv)

    from . import compile_check as cc
    from ..ops import chunk_delta_rule as cdr

    if not cc.compile_only(args.arch):
        return 2
    cdr.check_devices = lambda **tensors: torch.device("cpu")  # CPU tensors stand in; nothing runs
    lengths = [100, 156]
    H, K, V, bf = 16, 128, 128, torch.bfloat16
    failures, t0 = 0, time.time()
    for sequences, first, *values in itertools.product(args.sequences, args.walk_blocks_first,
                                                       *(getattr(args, name) for name in CHUNK_SETTINGS)):
        lengths = [100, 156] * (sequences // 2) + [100] * (sequences % 2)
        cdr._host_lengths = lambda cu_seqlens, tokens, lengths=lengths: lengths  # no read-back of a stand-in
        T = sum(lengths)
        q, k, v = (torch.empty(1, T, H, d, dtype=bf) for d in (K, K, V))
        g, beta = torch.empty(1, T, H), torch.empty(1, T, H, dtype=bf)
        state = torch.empty(len(lengths), H, K, V)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        ckpt = torch.empty(cdr.num_checkpoints(lengths, 64), H, K, V)
        settings = {name: value for name, value in zip(CHUNK_SETTINGS, values) if value is not None}
        settings["walk_blocks_first"] = bool(first)
        what = f"sequences={sequences} " + " ".join(f"{name}={value}" for name, value in settings.items())
        try:
            cdr.chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt, checkpoint_every=64,
                                 **settings)
            print(f"ok   {what}: {len(cc.COMPILED)} variants so far ({time.time() - t0:.0f} s)")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL {what}: {e!r}")
    # the single-chunk kernel (every sequence <= 64 tokens: a prefix-cache hit's tail), with and
    # without a start state, with checkpoints
    short = [64, 17]
    cdr._host_lengths = lambda cu_seqlens, tokens: short
    Ts = sum(short)
    qs, ks, vs = (torch.empty(1, Ts, H, d, dtype=bf) for d in (K, K, V))
    gs, betas = torch.empty(1, Ts, H), torch.empty(1, Ts, H, dtype=bf)
    cus = torch.tensor([0, short[0], Ts], dtype=torch.int32)
    ckpts = torch.empty(cdr.num_checkpoints(short, 64), H, K, V)
    for block_v, warps, init in itertools.product(args.single_block_v, args.single_warps, (True, False)):
        what = f"single_chunk block_v={block_v} warps={warps} initial_state={init}"
        settings = {name: value for name, value in (("single_block_v", block_v), ("single_warps", warps))
                    if value is not None}
        try:
            cdr.chunk_delta_rule(qs, ks, vs, gs, betas, state[:2] if init else None, cu_seqlens=cus,
                                 checkpoints=ckpts, checkpoint_every=64, single_chunk=True, **settings)
            print(f"ok   {what}: {len(cc.COMPILED)} variants so far ({time.time() - t0:.0f} s)")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL {what}: {e!r}")
    print(f"\n{'kernel':20s} {'warps':>5s} {'stages':>6s} {'regs':>5s} {'stack':>6s} {'smem':>7s}  constexprs")
    for name, kernel in sorted(cc.COMPILED.values(), key=lambda nk: nk[0]):
        usage = cc.resource_usage(kernel.asm["cubin"])
        names = kernel.src.fn.arg_names
        shown = ", ".join(f"{names[i[0]]}={val}" for i, val in kernel.src.constants.items() if names[i[0]] in SHOWN)
        meta = kernel.metadata
        print(f"{name:20s} {meta.num_warps:5d} {meta.num_stages:6d} {usage['regs']:5d} {usage['stack']:6d} "
              f"{meta.shared:7d}  {shown}")
        if usage["stack"] > 0:
            print(f"  ^ {usage['stack']} bytes of stack: spills (or a local array)")
    print(f"\n{len(cc.COMPILED)} variants for sm_{args.arch} in {time.time() - t0:.0f} s; {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
