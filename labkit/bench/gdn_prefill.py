"""Gated DeltaNet prefill, the delta rule of one layer: labkit's chunked kernel beside fla's.

Times :func:`labkit.ops.chunk_delta_rule.chunk_delta_rule` at Qwen3.5-0.8B's linear-attention
shape (16 heads, K = V = 128, bf16 q/k/v, float32 log-decays and states) for one sequence of
T = 1,024 ... 65,536 tokens and for a packed batch of 8 x 2,048 (one call with ``cu_seqlens``);
and fla's ``chunk_gated_delta_rule`` on the same inputs in
the same run when fla is importable. Each call is captured once in a CUDA graph and replayed
(:func:`labkit.lab.timing.measure`: CUDA events, median of repeats), so launch overhead is what a
graph pays. Rows give milliseconds, tokens/s, and the bandwidth implied by the bytes a call must
move (q, k, v and o, g and beta, the state in and out: the intermediate buffers of either
implementation are not counted), and labkit's relative RMS difference from fla's output.

``--profile [N]``: each call's graph is also replayed N times (default 5) under torch.profiler,
and every row gets the device time of each kernel of one call (name, launches, microseconds; its
grid, block, registers and shared memory as the profiler saw them), in the JSON as the row's
``kernels``; a table per case sums them by stage, labkit's four kernels beside fla's counterparts
(:data:`STAGES`), so that a gap between the two can be pinned on a kernel.

    python -m labkit.bench.gdn_prefill                      # prints the rows
    python -m labkit.bench.gdn_prefill --name gdn-prefill   # also writes data/bench/<gpu>/gdn-prefill.json
    python -m labkit.bench.gdn_prefill --variants default default+ob128   # launch settings
    python -m labkit.bench.gdn_prefill --lengths 4096 16384 --variants tuned-narrow tuned   # the walk of 8 sequences
    python -m labkit.bench.gdn_prefill --lengths 1 64 --packed --variants multi-kernel single-chunk
                                                            # a prefix-cache hit's tail: one kernel or several
    python -m labkit.bench.gdn_prefill --lengths 4096 --variants tuned --profile   # per kernel, beside fla's

The kernel's other forms (fused or merged prepare, dots inverse, stored P, the walk that writes the
outputs, the sequence split) were deleted from it; their figures are in the committed results and
labkit.ops.chunk_delta_rule's docstring, and the variants that timed them are in commit e70164b.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

HEADS, HEAD_DIM = 16, 128
LENGTHS = (1024, 4096, 16384, 65536)
PACKED = (8, 2048)  # sequences x tokens, as one varlen call
# chunk_delta_rule's launch settings, by name; "default" is whatever the module's defaults are
VARIANTS = {
    "default": {},
    # what the model runs on this GPU: the settings of its tuning file (labkit.tuning.settings;
    # the module's defaults where it has none). None here: read when the bench runs
    "file": None,
    # one output program per chunk (it forms P once, not per 64 columns): 0.796 -> 0.775 ms at
    # T = 16,384 (data/bench/nvidia-h200/gdn-prefill.json)
    "default+ob128": dict(output_block_v=128),
    "bv32": dict(block_v=32),
    # the H200 file's settings (data/tuning/nvidia-h200.json: 3 stages, one output program per
    # chunk), with the walk never widened ("tuned-narrow": as before walk_programs_per_sm existed),
    # or widened for many sequences (labkit.ops.chunk_delta_rule.walk_block_v; 8 x 2,048 tokens x
    # 16 heads: 1,024 programs of 16 columns) to 64 columns ("tuned": 256 programs, 2 per SM at 4
    # warps, 2 stages, the default), at 1 stage, or to whole heads (128 programs, 8 warps); and the
    # narrow walk with a head's value blocks together in its grid. Single sequences (16 x 8
    # programs) keep the narrow walk in every one of them.
    "tuned-narrow": dict(num_stages=3, output_block_v=128, walk_programs_per_sm=0),
    "tuned-narrow+blocks-first": dict(num_stages=3, output_block_v=128, walk_programs_per_sm=0,
                                      walk_blocks_first=True),
    "tuned": dict(num_stages=3, output_block_v=128),
    "tuned+wide64+s1": dict(num_stages=3, output_block_v=128, wide_stages=1),
    "tuned+wide128+w8": dict(num_stages=3, output_block_v=128, walk_programs_per_sm=1, wide_warps=8),
    # a prefix-cache hit's tail (every sequence <= 64 tokens): the single-chunk kernel against the
    # multi-kernel path; e.g. --lengths 1 64 --packed --variants multi-kernel single-chunk. Not with a
    # packed case: forced on a packed batch under graph capture, the op refuses it (it cannot read the
    # lengths back to check that each fits a chunk); the packed tails take the op's own choice
    # (single_chunk=None) in the prefix cache
    "multi-kernel": dict(single_chunk=False),
    "single-chunk": dict(single_chunk=True),
    "single-chunk+bv64": dict(single_chunk=True, single_block_v=64),
    "single-chunk+w8": dict(single_chunk=True, single_warps=8),
    # narrower value blocks: 16 heads x 128 / block_v programs for one sequence (16 at 128 columns,
    # 64 at 32), each holding a [64, block_v] slice of U and O instead of the whole head
    "single-chunk+bv32": dict(single_chunk=True, single_block_v=32),
    "single-chunk+bv32+w2": dict(single_chunk=True, single_block_v=32, single_warps=2),
    "single-chunk+bv16+w2": dict(single_chunk=True, single_block_v=16, single_warps=2),
    "single-chunk+bv64+w8": dict(single_chunk=True, single_block_v=64, single_warps=8),
    # the single-chunk kernel's inverse in full float32, as before INVERSE_TF32 (against "single-chunk")
    "single-chunk+inverse-ieee": dict(single_chunk=True, inverse_tf32=False),
    # Candidates for the packed gap to fla (8 x 2,048 tokens: 0.523 against 0.466 ms), on the H200
    # file's settings; registers and shared memory from python -m labkit.lab.compile_check_prefill
    # (sm_90). Profiled once on an H100 (2026-12-05, --profile 3, the JSON lost to the call's time
    # limit): tuned 0.629 ms (solve 157, products 152, walk 163, outputs 152 us) against fla's 0.557
    # (110, 111, 151, 168); products together 0.623, the solve at 2 warps 0.626, outputs at 8 warps
    # 0.653, all three 0.640: the gap is in the solve and the products, and none of these closes it (the
    # inverse's block products in TF32 did, 2026-12-06: tuned+inverse-ieee below). W and U0 by one program
    # per chunk, which reads X once: X (float32, 64 MB at 16,384 tokens x 16 heads) is read from memory
    # once instead of twice (142 registers, 3 programs per SM).
    # (products together became the default on 2026-12-06: labkit.ops.chunk_delta_rule.PRODUCTS_TOGETHER;
    # the solve with L in registers, timed by the variants tuned+registers* of commit 61db211, was slower)
    "tuned+products-together": dict(num_stages=3, output_block_v=128, products_together=True),
    # X stored float32 over L by the solve, as before 2026-12-06 (labkit.ops.chunk_delta_rule.X_IN_INPUT_DTYPE:
    # since then X is stored in the inputs' dtype, into its own buffer)
    "tuned+x-float32": dict(num_stages=3, output_block_v=128, x_in_input_dtype=False),
    # the solve at 2 warps: 255 registers (8 bytes of spills), 4 programs per SM instead of 2 at 4
    # warps (219 registers), for a solve whose row-by-row substitution waits on memory, not on
    # arithmetic; the products stay at 4 warps
    "tuned+solve-w2": dict(num_stages=3, output_block_v=128, prepare_warps=2, products_warps=4),
    # the outputs at 8 warps (fla's chunk_fwd_o has 128 x 128 tiles at 8 warps among its autotuned
    # configurations): 126 registers, 2 programs of 8 warps per SM instead of 3 of 4
    "tuned+output-w8": dict(num_stages=3, output_block_v=128, output_warps=8),
    # the inverse's block products in full float32, as before 2026-12-06 (labkit.ops.chunk_delta_rule.
    # INVERSE_TF32: since then TF32 on tensor cores for 16-bit inputs, as fla's solve)
    "tuned+inverse-ieee": dict(num_stages=3, output_block_v=128, inverse_tf32=False),
    "tuned+candidates": dict(num_stages=3, output_block_v=128, products_together=True, prepare_warps=2,
                             products_warps=4, output_warps=8),
}
# The stages of either implementation, by kernel name: labkit's four kernels and fla 0.6's
# counterparts (its cumsum of the log-decays is part of labkit's solve); memsets and copies apart
# (fla zero-fills its inverse and the final states).
STAGES = (
    ("solve", re.compile(r"solve|kkt|cumsum", re.I)),
    ("products", re.compile(r"products|recompute_w_u", re.I)),
    ("walk", re.compile(r"walk|kernel_h", re.I)),
    ("output", re.compile(r"output|kernel_o\b", re.I)),
    ("memory", re.compile(r"^memset|^memcpy", re.I)),
)


@dataclass
class GdnPrefillResult:
    impl: str  # "labkit" or "fla"
    sequences: int
    tokens: int  # all sequences together
    variant: str | None = None  # labkit: the launch settings (VARIANTS)
    ms: float | None = None
    tokens_per_s: float | None = None
    bytes: int | None = None
    bytes_per_s: float | None = None
    rel_diff_vs_fla: float | None = None
    error: str | None = None
    # --profile: one call's kernels, longest first: {"name", "stage", "count" (launches per call),
    # "us" (device time per call), and where the profiler gave them "grid", "block", "regs", "smem"}
    kernels: list[dict] | None = None


def _inputs(sequences: int, length: int, heads: int, dim: int, seed: int = 0, device: str = "cuda") -> dict:
    """Packed inputs of ``sequences`` prompts of ``length`` tokens: q, k L2-normalised, g <= 0."""
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sequences * length

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    q = F.normalize(randn(1, total, heads, dim), dim=-1).bfloat16()
    k = F.normalize(randn(1, total, heads, dim), dim=-1).bfloat16()
    v = randn(1, total, heads, dim).bfloat16()
    g = -F.softplus(randn(1, total, heads) - 3)  # slow forgetting, as trained layers mostly do
    beta = torch.sigmoid(randn(1, total, heads)).bfloat16()
    state = randn(sequences, heads, dim, dim) * 0.1
    cu = torch.arange(0, total + 1, length, dtype=torch.int64, device=device)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=state, cu_seqlens=cu if sequences > 1 else None)


def _call_bytes(x: dict) -> int:
    """What a call must read and write: q, k, v, o, g, beta and the state in and out."""
    q, v, g, beta, state = x["q"], x["v"], x["g"], x["beta"], x["initial_state"]
    io = 3 * q.numel() * q.element_size() + v.numel() * v.element_size()  # q, k, v, o
    return io + g.numel() * g.element_size() + beta.numel() * beta.element_size() + 2 * state.numel() * 4


def stage(name: str) -> str:
    """The stage of a kernel (:data:`STAGES`), by its name; "other" for none of them."""
    return next((st for st, pattern in STAGES if pattern.search(name)), "other")


def kernel_profile(call: Callable[[], object], replays: int = 5) -> list[dict]:
    """The kernels of one ``call`` as its timing runs them: captured in a CUDA graph, replayed
    ``replays`` times under torch.profiler. Per kernel name: its stage, launches and device
    microseconds per call, and its launch shape where the profiler's trace gives it; longest first."""
    from torch.profiler import ProfilerActivity

    from ..decode.graphs import GRAPHS
    from ..lab.profile import _profiling  # torch.profiler without kineto's start/stop lines on stderr
    from .prefill_profile import _device_events

    device = torch.device("cuda", torch.cuda.current_device())
    GRAPHS.warm_up(call, device)
    graph = GRAPHS.capture(call, device)
    graph.replay()  # the first replay uploads the graph: outside the profile, finished before it starts
    torch.cuda.synchronize(device)
    with _profiling([ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize(device)
    per_name: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in _device_events(prof):
        per_name[e.name][0] += 1
        per_name[e.name][1] += e.time_range.end - e.time_range.start
    shapes = _launch_shapes(prof)
    kernels = [dict(name=n, stage=stage(n), count=c / replays, us=us / replays, **shapes.get(n, {}))
               for n, (c, us) in per_name.items()]
    return sorted(kernels, key=lambda k: -k["us"])


def _launch_shapes(prof) -> dict[str, dict]:
    """Grid, block, registers per thread and shared memory of each kernel name, from the profile's
    Chrome trace (kineto records them per launch; torch's events do not carry them)."""
    keys = {"grid": "grid", "block": "block", "regs": "registers per thread", "smem": "shared memory"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    shapes: dict[str, dict] = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel" and e.get("name") not in shapes:
            args = e.get("args", {})
            shapes[e["name"]] = {k: args[a] for k, a in keys.items() if a in args}
    return shapes


def bench_gdn_prefill(
    lengths: tuple[int, ...] = LENGTHS,
    packed: tuple[int, int] | None = PACKED,
    heads: int = HEADS,
    head_dim: int = HEAD_DIM,
    reps: int = 15,
    with_fla: bool = True,
    variants: tuple[str, ...] = ("default",),
    profile: int = 0,
) -> list[GdnPrefillResult]:
    """One row per (case, implementation, variant). ``variants``: names from VARIANTS. ``profile``:
    graph replays under torch.profiler for each row's ``kernels`` (0: none)."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    if not isinstance(profile, int) or isinstance(profile, bool) or profile < 0:
        raise ValueError(f"profile must be a number of replays >= 0, got {profile!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("the GDN prefill benchmark needs a CUDA GPU (CUDA graphs, CUDA events)")
    from .. import tuning
    from ..ops.chunk_delta_rule import chunk_delta_rule
    from ..lab.timing import measure
    from .decode import _error as error_text
    from .ops import rel_err

    fla = None
    if with_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla  # the peer, when installed
        except ImportError:
            pass
    cases = [(1, t) for t in lengths] + ([packed] if packed else [])
    rows: list[GdnPrefillResult] = []
    for sequences, length in cases:
        x = _inputs(sequences, length, heads, head_dim)
        total, nbytes = sequences * length, _call_bytes(x)

        def timed(row: GdnPrefillResult, call) -> GdnPrefillResult:
            row.ms = measure(call, device="cuda", graph=True, repeats=reps).ms
            row.tokens_per_s = total / (row.ms * 1e-3)
            row.bytes, row.bytes_per_s = nbytes, nbytes / (row.ms * 1e-3)
            if profile:
                row.kernels = kernel_profile(call, profile)
            return row

        fla_out = None
        if fla is not None:
            row = GdnPrefillResult("fla", sequences, total)

            def fla_call():
                return fla(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                           output_final_state=True, cu_seqlens=x["cu_seqlens"])

            try:
                fla_out = fla_call()[0]
                timed(row, fla_call)
            except Exception as exc:  # a peer that fails (e.g. to be captured) is a finding, not a crash
                row.error = error_text(exc)
            rows.append(row)
        for name in variants:
            kw = VARIANTS[name]
            if kw is None:  # "file"
                kw = dict(tuning.settings("chunk_delta_rule", x["q"].device))
            row = GdnPrefillResult("labkit", sequences, total, variant=name)
            try:
                o, _ = chunk_delta_rule(**x, **kw)
                if fla_out is not None:
                    row.rel_diff_vs_fla = rel_err(o, fla_out)
                timed(row, lambda: chunk_delta_rule(**x, **kw))
            except Exception as exc:
                row.error = error_text(exc)
            rows.append(row)
        x = fla_out = None  # free this case's inputs before the next is made
        torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[GdnPrefillResult], header: bool = True) -> None:
    if header:
        print(f"{'impl':>7} {'variant':>27} {'seqs':>4} {'tokens':>7} {'ms':>9} {'Mtok/s':>8} {'GB/s':>7} {'vs fla':>8}")
    for r in rows:
        head = f"{r.impl:>7} {r.variant or '':>27} {r.sequences:>4} {r.tokens:>7}"
        if r.error:
            print(f"{head} FAILED {r.error}")
            continue
        diff = "" if r.rel_diff_vs_fla is None else f"{r.rel_diff_vs_fla:.1e}"
        print(f"{head} {r.ms:9.3f} {r.tokens_per_s / 1e6:8.2f} {r.bytes_per_s / 1e9:7.0f} {diff:>8}")


def print_kernels(rows: list[GdnPrefillResult]) -> None:
    """Per case, the profiled rows' device microseconds per stage (and their sum, beside the graph
    replay's time), then each row's kernels: microseconds, launches if not one, grid x block, registers."""
    stages = [st for st, _ in STAGES] + ["other"]
    for case in dict.fromkeys((r.sequences, r.tokens) for r in rows if r.kernels):
        profiled = [r for r in rows if r.kernels and (r.sequences, r.tokens) == case]
        print(f"\nkernels, {case[0]} x {case[1] // case[0]:,} tokens: device us per call by stage")
        print(f"{'':34}" + "".join(f"{st:>9}" for st in stages) + f"{'sum':>9}{'replay':>9}")
        for r in profiled:
            per = defaultdict(float)
            for k in r.kernels:
                per[k["stage"]] += k["us"]
            label = r.impl if r.variant is None else f"{r.impl} {r.variant}"
            print(f"  {label[:32]:32}" + "".join(f"{per[st]:9.1f}" for st in stages)
                  + f"{sum(per.values()):9.1f}{r.ms * 1e3:9.1f}")
        for r in profiled:
            label = r.impl if r.variant is None else f"{r.impl} {r.variant}"
            print(f"  {label}: " + "; ".join(_kernel_text(k) for k in r.kernels))


def _kernel_text(k: dict) -> str:
    """``name us [xN] [grid x block] [rREGS]``, the name cut to 48 characters."""
    text = f"{k['name'][:48]} {k['us']:.1f}"
    if k["count"] != 1:
        text += f" x{k['count']:g}"
    if "grid" in k and "block" in k:
        text += f" {k['grid']}x{k['block'][0]}"
    if "regs" in k:
        text += f" r{k['regs']}"
    return text


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit.bench.gdn_prefill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", nargs="*", type=int, default=list(LENGTHS))
    p.add_argument("--packed", nargs="*", type=int, default=list(PACKED), metavar="N",
                   help="SEQUENCES TOKENS of the packed batch (one varlen call); no values: none")
    p.add_argument("--variants", nargs="*", default=["default"], help=f"launch settings: {', '.join(VARIANTS)}")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--no-fla", action="store_true")
    p.add_argument("--name", help="also write data/bench/<gpu>/<name>.json")
    p.add_argument("--profile", nargs="?", type=int, const=5, default=0, metavar="REPLAYS",
                   help="each call's kernels under torch.profiler, over REPLAYS graph replays (default 5)")
    args = p.parse_args(argv)
    if len(args.packed) not in (0, 2):
        p.error(f"argument --packed: give SEQUENCES TOKENS, or no values for no packed batch; got {args.packed}")
    # one case at a time, each printed when done: a run cut short keeps what it measured
    cases = [((length,), None) for length in args.lengths] + ([((), tuple(args.packed))] if args.packed else [])
    rows: list[GdnPrefillResult] = []
    for lengths, packed in cases:
        case_rows = bench_gdn_prefill(lengths, packed, reps=args.reps, with_fla=not args.no_fla,
                                      variants=tuple(args.variants), profile=args.profile)
        print_rows(case_rows, header=not rows or bool(args.profile))  # again below each kernel table
        print_kernels(case_rows)
        rows += case_rows
    if args.name:
        import shlex

        from ..lab.hw import device_facts
        from .results import write_results

        command = shlex.join(["python", "-m", "labkit", "bench", "gdn-prefill", *(argv if argv is not None else sys.argv[1:])])
        print(write_results(args.name, "gdn-prefill", rows, device_facts("cuda"), command=command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
