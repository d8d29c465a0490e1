"""What a roofline rests on, measured as a decode step sees it: notebook 00's measurements.

- ``copy``: one elementwise kernel that reads a buffer and writes another of the same size
  (``torch.neg``), replayed from a CUDA graph over enough copies of the buffers that each call
  streams from HBM (cold L2), for sizes from 1 MB up. A straight line through the points,
  ``t = t0 + bytes / bandwidth``, splits each kernel's time into a fixed cost and streaming.
- ``bf16 matmul``: the compute roof, an n x n x n matmul (:func:`labkit.lab.hw.measure_bf16_matmul`).
- the state traffic of one layer of each mixer kind (one decode step, from
  :mod:`labkit.bench.ops`): the Gated DeltaNet step (float32 state read and written), the attention
  step at a given context (the KV cache read), the short-conv step (its window); each checked
  against its reference before it is timed.

``python -m labkit.bench.hardware --save`` writes them to ``data/bench/<gpu>/hw.json``; notebook 00
runs the same function and, on a machine without a GPU, teaches with that committed file.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

import torch

from ..lab.hw import DeviceFacts, device_facts
from ..lab.timing import cold_l2_copies, measure

COPY_SIZES_MB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # bytes read per call (as many written)
CPU_COPY_SIZES_MB = (1, 4, 16)  # a host clock and a CPU: only to keep the code path alive there
STATE_BATCHES = (1, 16, 64)


@dataclass
class HwRow:
    what: str  # "copy", "bf16 matmul", "gated deltanet step", "attention step", "short conv step"
    bytes: int  # bytes one call must move (read + written)
    flops: int
    us: float  # median microseconds per call
    model: str | None = None
    batch: int | None = None
    context: int | None = None
    rel_err: float | None = None  # of the kernel against its reference, checked before timing

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / (self.us * 1e-6)


def copy_sweep(sizes_mb=COPY_SIZES_MB, device: str = "cuda") -> list[HwRow]:
    """Per-call time of a read-N-write-N elementwise kernel for each size (N = size in MB)."""
    rows = []
    cuda = torch.device(device).type == "cuda"
    for mb in sizes_mb:
        n = (mb << 20) // 2  # bf16 elements
        copies = cold_l2_copies(2 * n * 2, device) if cuda else 1
        pairs = [(torch.randn(n, device=device).to(torch.bfloat16), torch.empty(n, device=device, dtype=torch.bfloat16))
                 for _ in range(copies)]
        calls = [lambda s=s, d=d: torch.neg(s, out=d) for s, d in pairs]
        t = measure(calls, device=device, graph=cuda, repeats=10 if cuda else 3, warmup=2 if cuda else 1)
        rows.append(HwRow("copy", 2 * n * 2, 0, t.us))
        del pairs, calls
    return rows


def fit_fixed_cost(rows: list[HwRow]) -> tuple[float, float]:
    """Least-squares line ``us = t0 + bytes / bandwidth`` through ``rows``: (t0 in µs, bytes/s)."""
    if len(rows) < 2:
        raise ValueError(f"a line needs at least two points, got {len(rows)}")
    xs = torch.tensor([float(r.bytes) for r in rows], dtype=torch.float64)
    ys = torch.tensor([r.us for r in rows], dtype=torch.float64)
    a = torch.stack([torch.ones_like(xs), xs], dim=1)
    t0, slope = torch.linalg.lstsq(a, ys[:, None]).solution.flatten().tolist()
    if slope <= 0:
        raise ValueError("the fitted time does not grow with bytes: the sweep measured noise")
    return float(t0), float(1e6 / slope)


def state_steps(models: dict, batches=STATE_BATCHES, context: int = 2048) -> list[HwRow]:
    """One decode step of one layer of each mixer kind the models have, at each batch, on a GPU:
    rel_err against the reference first, then the CUDA-graph time (cold L2)."""
    from . import ops as opbench

    rows = []
    for name, model in models.items():
        kinds = set(model.cfg.layer_types)
        for b in batches:
            if "gdn" in kinds:
                err = opbench.check_gdn(model, b)
                t = opbench.time_gdn(model, b)
                rows.append(HwRow("gated deltanet step", t.bytes, 0, t.us, name, b, None, err))
            if "attention" in kinds:
                lengths = [context] * b
                err = opbench.check_attention(model, b, context + 1, lengths)
                t = opbench.time_attention(model, b, context + 1, lengths)
                rows.append(HwRow("attention step", t.bytes, 0, t.us, name, b, context, err))
            if "conv" in kinds:
                err = opbench.check_short_conv(model, b)
                t = opbench.time_short_conv(model, b)
                rows.append(HwRow("short conv step", t.bytes, 0, t.us, name, b, None, err))
    return rows


def matmul_row(facts: DeviceFacts, n: int) -> HwRow:
    """The matmul figure ``facts`` measured (an n^3 bf16 matmul) as a row."""
    if not facts.bf16_flops:
        raise ValueError(f"{facts.name}: no measured bf16 matmul rate in these facts")
    flops = 2 * n**3
    return HwRow("bf16 matmul", 3 * n * n * 2, flops, flops / facts.bf16_flops * 1e6)


def measure_all(presets=("lfm2-350m", "qwen3.5-0.8b"), context: int = 2048, batches=STATE_BATCHES,
                device: str = "cuda", models: dict | None = None) -> tuple[DeviceFacts, list[HwRow]]:
    """Every row of ``hw.json`` on a GPU: copy sweep, matmul, and the mixers' state steps of the
    presets (random weights of the real shapes, ``labkit.build``, unless ``models`` are given)."""
    import labkit

    if torch.device(device).type != "cuda":
        raise RuntimeError(f"hw.json holds GPU measurements; got device {device!r}")
    facts = device_facts(device)
    models = models or {p: labkit.build(p, dtype=torch.bfloat16, device=device, seed=0) for p in presets}
    rows = copy_sweep(device=device) + [matmul_row(facts, 8192)] + state_steps(models, batches, context)
    return facts, rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m labkit.bench.hardware", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--save", action="store_true", help="write data/bench/<gpu>/hw.json")
    args = p.parse_args(argv)
    facts, rows = measure_all(context=args.context)
    for r in rows:
        print(f"{r.what:>20} {r.model or '':>13} B={r.batch or '':<3} {r.bytes / 1e6:10.2f} MB {r.us:10.2f} µs "
              f"{r.bytes_per_s / 1e12:6.2f} TB/s" + (f"  rel_err {r.rel_err:.1e}" if r.rel_err is not None else ""))
    if args.save:
        from .results import write_results

        command = shlex.join(["python", "-m", "labkit.bench.hardware", *(argv if argv is not None else sys.argv[1:])])
        print(write_results("hw", "hw", rows, facts, command=command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


COPY_FIT = "one read-and-write kernel per size, L2-cold, in a CUDA graph"
PROJECTION_FIT = "labkit's fused projections at batch 1, each kernel timed alone in a CUDA graph"


def as_dicts(rows: list[HwRow]) -> list[dict]:
    """Rows as the dicts a results file holds, with ``bytes_per_s`` added."""
    return [dict(vars(r), bytes_per_s=r.bytes_per_s) for r in rows]


def committed_hardware(gpu: str = "nvidia-h200") -> dict:
    """What notebook 00 teaches with where there is no GPU, from committed results files:

    - ``hw.json`` (this module's rows) where it is committed: the copy sweep is the fixed-cost fit;
    - otherwise ``bench-ops.json`` (``python -m labkit bench ops``), which holds the same state-step
      rows and, for the fit, labkit's fused projections at batch 1 (one kernel each).

    Returns {"doc": the file's header (device, date, gpu), "file", "fit_rows", "fit_label", "state_rows"}.
    """
    from ..lab.notebooks import committed_results
    from .results import results_dir

    if (results_dir() / gpu / "hw.json").exists():
        doc = committed_results("hw", gpu)
        rows = [dict(r, bytes_per_s=r["bytes"] / (r["us"] * 1e-6)) for r in doc["results"]]
        return {"doc": doc, "file": "hw.json", "fit_label": COPY_FIT,
                "fit_rows": [r for r in rows if r["what"] == "copy"],
                "state_rows": [r for r in rows if r["what"].endswith(" step")]}
    doc = committed_results("bench-ops", gpu)
    mine = [r for r in doc["results"] if r["impl"] == "triton" and r.get("us")]
    state = [dict(what=r["op"], model=r["model"], batch=r["batch"], bytes=r["bytes"], us=r["us"], rel_err=r["rel_err"],
                  context=(r.get("extra") or {}).get("mean_context"), bytes_per_s=r["bytes"] / (r["us"] * 1e-6))
             for r in mine if r["op"].endswith(" step")]
    fit = [dict(what=r["op"], model=r["model"], batch=1, bytes=r["bytes"], us=r["us"], bytes_per_s=r["bytes"] / (r["us"] * 1e-6))
           for r in mine if not r["op"].endswith(" step") and r["batch"] == 1]
    return {"doc": doc, "file": "bench-ops.json", "fit_label": PROJECTION_FIT, "fit_rows": fit, "state_rows": state}
