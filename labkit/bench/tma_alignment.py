"""``python -m labkit bench tma-alignment``: does the TMA GEMV slow down on a weight that is not 64-byte
aligned (the article's "10x slower unless 64-byte aligned")?

The same [n, k] bf16 weight (default 4096 x 4096, 32 MB) is streamed by :func:`labkit.cuda.tma_linear`
from bases 0, 16, 32, 64 and 128 bytes past a 256-byte boundary, with the row stride k and k + 8
elements (rows 16- but not 128-byte aligned), at batch 1 and 16; each case is checked against
``x @ w.T`` and timed in one CUDA graph over copies that exceed the L2 (:func:`labkit.lab.timing.measure`).
A base 8 bytes past a boundary is a case too: TMA needs 16, and the launcher's refusal is its row.
Needs a CUDA GPU of compute capability 9.0 or later.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

BASE_OFFSETS_BYTES = (0, 16, 32, 64, 128, 8)
STRIDE_PADS = (0, 8)  # elements added to each row


@dataclass
class AlignmentRow:
    batch: int
    row_stride: int
    base_offset_bytes: int
    us: float | None = None
    gb_per_s: float | None = None
    rel_err: float | None = None
    error: str | None = None


def offset_weight(buffer: torch.Tensor, offset_bytes: int, n: int, k: int, stride: int) -> torch.Tensor:
    """An [n, k] view of ``buffer`` (a flat tensor allocated at an aligned address) starting
    ``offset_bytes`` past its start, rows ``stride`` elements apart."""
    step = buffer.element_size()
    if offset_bytes % step:
        raise ValueError(f"offset_bytes={offset_bytes} is not a multiple of the element size {step}")
    start = offset_bytes // step
    if buffer.numel() < start + n * stride:
        raise ValueError(f"a buffer of {buffer.numel()} elements cannot hold {n} rows of stride {stride} "
                         f"starting {offset_bytes} bytes in")
    return buffer[start:start + n * stride].view(n, stride)[:, :k]


def measure_alignment(n: int = 4096, k: int = 4096, batches=(1, 16), repeats: int = 10) -> list[AlignmentRow]:
    from .. import cuda
    from ..lab.timing import cold_l2_copies, measure

    rows = []
    for batch in batches:
        x = torch.randn(batch, k, dtype=torch.bfloat16, device="cuda")
        for pad in STRIDE_PADS:
            stride = k + pad
            buffers = [torch.randn(n * stride + 256, dtype=torch.bfloat16, device="cuda")
                       for _ in range(cold_l2_copies(2 * n * stride))]
            for offset in BASE_OFFSETS_BYTES:
                ws = [offset_weight(b, offset, n, k, stride) for b in buffers]
                outs = [torch.empty(batch, n, dtype=torch.bfloat16, device="cuda") for _ in ws]
                row = AlignmentRow(batch, stride, offset)
                try:
                    ref = (x @ ws[0].t()).double()
                    row.rel_err = ((cuda.tma_linear(x, ws[0]).double() - ref).norm() / ref.norm()).item()
                    row.us = measure([lambda w=w, o=o: cuda.tma_linear(x, w, out=o) for w, o in zip(ws, outs)],
                                     graph=True, repeats=repeats).us
                    row.gb_per_s = 2 * n * k / row.us / 1e3
                except (ValueError, RuntimeError) as exc:  # the 8-byte base is refused: that is its row
                    row.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                rows.append(row)
                shown = f"{row.us:7.2f} us {row.gb_per_s:7.0f} GB/s rel err {row.rel_err:.1e}" if row.us else f"error: {row.error}"
                print(f"B={batch:<2} row stride {stride} base +{offset:>3} B: {shown}")
            del buffers
    return rows


def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench tma-alignment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=positive_int, default=4096, help="weight rows")
    p.add_argument("--k", type=positive_int, default=4096, help="weight columns (elements)")
    p.add_argument("--batch", nargs="+", type=positive_int, default=[1, 16])
    p.add_argument("--repeats", type=positive_int, default=10)
    p.add_argument("--name", type=results_name, default="tma-alignment", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench tma-alignment runs the CUDA TMA GEMV: it needs a CUDA GPU (sm_90 or later)")
        return 2
    rows = measure_alignment(args.n, args.k, tuple(args.batch), args.repeats)
    command = shlex.join(["python", "-m", "labkit", "bench", "tma-alignment", *argv])
    path = write_results(args.name, "tma-alignment", rows, device_facts("cuda"), command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    # the 8-byte base is expected to be refused; any other error is a failed run
    return 1 if any(r.error for r in rows if r.base_offset_bytes % 16 == 0) else 0
