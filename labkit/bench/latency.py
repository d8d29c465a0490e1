"""Load latency of the GPU's memory levels, by pointer chasing: the ``L`` of Little's law.

    python -m labkit bench latency --name load-latency     # -> data/bench/<gpu>/load-latency.json

One program of one warp follows a chain through a table of 128-byte rows: the first int32 of row
``r`` is the index of the next row. Each load's address is the value of the previous load, so no
two loads overlap, and (time of ``steps`` loads) / ``steps`` is the latency of one load. The time is
read from the GPU's global timer inside the kernel, so no launch overhead is in it.

- ``pattern="random"``: the rows form one random cycle over the table. Tables smaller than the L1
  or the L2 cache stay resident (they were just written), so the latency steps up with the table's
  size: L1, L2, then HBM, then HBM with TLB misses once the table outgrows what the TLBs map.
- ``pattern="stride"``: row ``r`` links to ``r + 33`` (4,224 bytes on): every load a new line, in
  address order as a streaming kernel touches memory (the TLBs keep hitting); the HBM latency a
  weight stream sees.
- ``style="pointer"``: a plain ``tl.load`` of the row's first element; ``style="descriptor"``: the
  whole 128-byte row through a TMA tensor descriptor (``cp.async.bulk.tensor`` into shared memory,
  completion signalled on an mbarrier), to compare what one TMA copy's round trip costs.

Successive runs continue along the chain (a run starts where the previous one stopped), so a table
larger than the L2 is cold for every run. Reference: :func:`chase_ref` (the same walk in Python).
"""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from ..ops.features import features
from ..ops.launch import globaltimer

ROW = 32  # int32 per row: 128 bytes, one cache line
STRIDE_ROWS = 33  # the stride pattern's step: odd, so it cycles through a power-of-two table
PATTERNS = ("random", "stride")
STYLES = ("pointer", "descriptor")


@triton.jit(do_not_specialize=["start", "steps"])  # a start row of 1 must not become a constant
def _chase_kernel(table_ptr, desc, out_ptr, stamps_ptr, start, steps, ROW: tl.constexpr,
                  DESCRIPTOR: tl.constexpr, STAMPS: tl.constexpr):
    """row <- table[row, 0], ``steps`` times from ``start``; out = the last row; stamps = global-timer
    ns before the first and after the last load (each load waits for the one before it)."""
    row = start
    if STAMPS:
        t0 = globaltimer()
    for _ in range(steps):
        if DESCRIPTOR:
            tile = desc.load([row, 0])  # [1, ROW]: the row's 128 bytes, one TMA copy
            row = tl.sum(tl.where(tl.arange(0, ROW)[None, :] == 0, tile, 0))
        else:
            row = tl.load(table_ptr + row.to(tl.int64) * ROW)
    tl.store(out_ptr, row)
    if STAMPS:
        t1 = globaltimer()
        tl.store(stamps_ptr, t0)
        tl.store(stamps_ptr + 1, t1)


def chain_table(nbytes: int, pattern: str, device, seed: int = 0) -> torch.Tensor:
    """An int32 [rows, ROW] table of ``nbytes`` (a whole number of 128-byte rows, at least 2) whose
    column 0 links every row to the next of one cycle through all rows."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    rows = nbytes // (ROW * 4)
    if rows < 2 or rows * ROW * 4 != nbytes:
        raise ValueError(f"the table holds whole 128-byte rows, at least 2: got {nbytes} bytes")
    table = torch.zeros(rows, ROW, dtype=torch.int32, device=device)
    if pattern == "random":
        gen = torch.Generator(device="cpu").manual_seed(seed)
        order = torch.randperm(rows, generator=gen).to(device)
        table[order, 0] = torch.roll(order, -1).to(torch.int32)
    else:
        if math.gcd(rows, STRIDE_ROWS) != 1:  # else the links form several shorter cycles
            raise ValueError(f"a stride table's row count must share no factor with {STRIDE_ROWS}, got {rows}")
        r = torch.arange(rows, device=device)
        table[:, 0] = ((r + STRIDE_ROWS) % rows).to(torch.int32)
    return table


def chase_ref(table: torch.Tensor, start: int, steps: int) -> int:
    """The row reached after ``steps`` links from ``start`` (plain Python)."""
    links = table[:, 0].tolist()
    row = start
    for _ in range(steps):
        row = links[row]
    return row


def chase(table: torch.Tensor, start: int, steps: int, style: str = "pointer",
          stamps: torch.Tensor | None = None) -> torch.Tensor:
    """Launch one chase; returns a 1-element int32 tensor with the row reached. ``stamps``: an int64
    [2] tensor for the global-timer ns before and after the loads (GPU only)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if table.dtype != torch.int32 or table.dim() != 2 or table.shape[1] != ROW or not table.is_contiguous():
        raise ValueError(f"table must be a contiguous int32 [rows, {ROW}] tensor (chain_table)")
    if not 0 <= start < table.shape[0] or steps < 1:
        raise ValueError(f"need 0 <= start < {table.shape[0]} and steps >= 1, got {start} and {steps}")
    if stamps is not None and (table.device.type != "cuda" or stamps.dtype != torch.int64 or stamps.numel() != 2):
        raise ValueError("stamps read the GPU's global timer: an int64 [2] tensor on a CUDA device")
    desc = None
    if style == "descriptor":
        # before sm_90 Triton turns a descriptor into plain loads: refused, not measured under TMA's name
        features(table.device).require("tma", 'chase(style="descriptor")', 'Use style="pointer".')
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(table, [1, ROW])
    out = torch.empty(1, dtype=torch.int32, device=table.device)
    _chase_kernel[(1,)](table, desc, out, stamps, start, steps, ROW=ROW, DESCRIPTOR=desc is not None,
                        STAMPS=stamps is not None, num_warps=1)
    return out


@dataclass
class LatencyRow:
    pattern: str
    style: str
    nbytes: int
    steps: int
    ns_per_load: float | None
    runs_ns: list
    error: str | None = None


def measure_latency(nbytes: int, pattern: str = "random", style: str = "pointer", steps: int = 4096,
                    repeats: int = 3, device: str = "cuda") -> LatencyRow:
    """Median ns per dependent load over ``repeats`` runs (after one warm-up run), each run
    continuing the chain where the last stopped; checked against :func:`chase_ref` first."""
    row = LatencyRow(pattern, style, nbytes, steps, None, [])
    try:
        table = chain_table(nbytes, pattern, device)
        got = int(chase(table, 0, 64, style).item())
        want = chase_ref(table, 0, 64) if table.shape[0] <= 1 << 22 else None  # the larger tables: their walk is long
        if want is not None and got != want:
            raise RuntimeError(f"the chase reached row {got}, the reference {want}")
        stamps = torch.zeros(2, dtype=torch.int64, device=device)
        start = got
        for i in range(repeats + 1):
            start = int(chase(table, start, steps, style, stamps).item())
            if i:  # the first run compiles and warms the TLBs of small tables
                t0, t1 = stamps.tolist()
                row.runs_ns.append((t1 - t0) / steps)
        row.ns_per_load = sorted(row.runs_ns)[len(row.runs_ns) // 2]
        del table
    except Exception as exc:  # a failing size is recorded, the others still run
        row.error = f"{type(exc).__name__}: {exc}"[:400]
    return row


SIZES = (16 << 10, 256 << 10, 4 << 20, 24 << 20, 256 << 20, 2 << 30)  # L1, L1/L2, L2, far L2, HBM, HBM + TLB


def bench_latency(sizes=SIZES, styles=STYLES, steps: int = 4096, repeats: int = 3, device: str = "cuda",
                  log=print) -> list[LatencyRow]:
    """The random chase at every size and style; the stride chase at the HBM sizes (> 4x the L2)."""
    rows = []
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.startswith("cuda") else 0
    runs = [("random", s) for s in sizes] + [("stride", s) for s in sizes if s > 4 * l2]
    for pattern, size in runs:
        for style in styles:
            r = measure_latency(size, pattern, style, steps, repeats, device)
            rows.append(r)
            log(f"{pattern:>6} {style:>10} {size / 2**20:9.3f} MiB: "
                + (f"FAILED {r.error}" if r.error else f"{r.ns_per_load:7.1f} ns per load"))
    return rows


def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=list(SIZES), help="table sizes in bytes")
    p.add_argument("--styles", nargs="+", default=list(STYLES), choices=STYLES)
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="load-latency", help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench latency reads the GPU's global timer: it needs a CUDA GPU (the CPU tests check the chase)")
        return 2
    facts = device_facts("cuda")
    rows = bench_latency(args.sizes, args.styles, args.steps, args.repeats)
    command = shlex.join(["python", "-m", "labkit", "bench", "latency", *argv])
    path = write_results(args.name, "load-latency", rows, facts, command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0 if not any(r.error for r in rows) else 1
