"""Weight streaming rate of the decode projections: the CUDA TMA GEMV against Triton and cuBLAS.

    python -m labkit bench tma --name tma-gemv                 # every shape, batch 1 and 16 -> data/bench/<gpu>/
    python -m labkit bench tma --sweep --name tma-sweep        # + every TmaConfig of the grid below
    python -m labkit bench tma --tuning-from data/bench/<gpu>/tma-sweep.json   # -> data/tuning/<gpu>.json's tma section

For every distinct weight shape [N, K] of the LFM2-350M and Qwen3.5-0.8B decode projections (the
matmul alone, no norm or epilogue, so the three compute one function), three implementations:

- ``"cuda-tma"``: :func:`labkit.cuda.tma_linear` (kernels/tma_gemv.cu) with its default config,
  or each config of the sweep;
- ``"triton"``: :func:`labkit.ops.linear.linear` with the configuration the fused backend uses on
  this GPU (:mod:`labkit.tuning`);
- ``"cublas"``: ``torch.mm(x, W^T)``;

and for the stacked gate/up shapes also ``"cuda-tma+swiglu"`` and ``"triton+swiglu"``: the same
stream with the SwiGLU epilogue fused (N / 2 outputs), as the decode step runs that projection.

Each is first checked against :func:`labkit.ops.linear.linear_ref` on its output poisoned with NaN
(a relative error above ``MAX_REL_ERR`` is recorded as a failure and not timed), then timed by
:func:`labkit.lab.timing.measure` inside a CUDA graph over enough copies of W that each call streams it
from HBM (:func:`labkit.lab.timing.cold_l2_copies`). The rate is weight bytes / time: what a decode
step's projection achieves against the copy bandwidth.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from ..lab.timing import cold_l2_copies, measure
from .ops import rel_err

MAX_REL_ERR = 2e-2  # bf16 outputs of a float32 sum: ~4e-3 expected
PRESETS = ("lfm2-350m", "qwen3.5-0.8b")
SWEEP = {"block_n": (16, 32, 64), "block_k": (64, 128, 256), "stages": (2, 4, 8), "fill": (1, 2)}


@dataclass(frozen=True)
class Shape:
    """One distinct weight shape, with the projections that have it."""

    n: int
    k: int
    where: str  # "lfm2-350m mlp.down+residual, ..."

    @property
    def nbytes(self) -> int:
        return 2 * self.n * self.k


@dataclass
class StreamRow:
    n: int
    k: int
    where: str
    batch: int
    impl: str
    config: str | None
    us: float | None
    weight_bytes: int
    gb_per_s: float | None
    rel_err: float | None
    error: str | None = None


def projection_shapes(presets=PRESETS) -> list[Shape]:
    """Every distinct [N, K] among the presets' decode projections (weights on the meta device:
    nothing is allocated), largest first."""
    from ..config import PRESETS as ALL
    from ..model import empty_model
    from .ops import linear_cases

    seen: dict[tuple[int, int], list[str]] = {}
    for name in presets:
        model = empty_model(ALL[name], torch.bfloat16, "meta")
        for case in linear_cases(model):
            seen.setdefault(tuple(case.weight.shape), []).append(f"{name} {case.name}")
    shapes = [Shape(n, k, ", ".join(w)) for (n, k), w in seen.items()]
    return sorted(shapes, key=lambda s: -s.nbytes)


def sweep_configs(batch: int = 16):
    """Every valid config of the ``SWEEP`` grid whose block fits in shared memory at ``batch``."""
    from ..cuda import TmaConfig, fits

    for bn, bk, st, fill in itertools.product(*(SWEEP[k] for k in ("block_n", "block_k", "stages", "fill"))):
        if bk * bn // 64 >= 32 and fits(cfg := TmaConfig(block_n=bn, block_k=bk, stages=st, fill=fill), batch):
            yield cfg


def _runner(impl: str, x: torch.Tensor, n: int, config=None):
    """``run(w, y)``: y = x w^T by ``impl``, into y; ``<impl>+swiglu``: y = silu(x W_g^T) * x W_u^T
    for w = [W_g; W_u] (N / 2 outputs)."""
    from .. import tuning
    from ..cuda import tma_linear
    from ..ops.linear import LinearWorkspace, linear

    batch, k = x.shape
    impl, swiglu = impl.removesuffix("+swiglu"), impl.endswith("+swiglu")
    if impl == "cuda-tma":
        config = config or tuning.tma_config(batch, n, k, x.device)  # the tuned table's, else the default
        return lambda w, y: tma_linear(x, w, out=y, swiglu=swiglu, config=config), repr(config)
    if impl == "triton":
        blocks = 2 if swiglu else 1
        cfg = tuning.linear_config(batch, n // blocks, k, row_blocks=blocks, device=x.device)
        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, n // blocks, cfg, blocks), x.device)
        return lambda w, y: linear(x, w, out=y, swiglu=swiglu, config=cfg, workspace=ws), repr(cfg)
    if impl == "cublas":
        return lambda w, y: torch.mm(x, w.t(), out=y), None
    raise ValueError(f"unknown impl {impl!r}: one of cuda-tma, triton, cublas")


def stream_rate(shape: Shape, batch: int, impl: str, weights: list[torch.Tensor], config=None,
                repeats: int = 15) -> StreamRow:
    """Check one implementation at one shape, then time it over the rotating weight copies."""
    from ..ops.linear import linear_ref

    dev = weights[0].device
    gen = torch.Generator(device=dev).manual_seed(batch)
    x = torch.randn(batch, shape.k, dtype=torch.bfloat16, device=dev, generator=gen)
    row = StreamRow(shape.n, shape.k, shape.where, batch, impl, None, None, shape.nbytes, None, None)
    swiglu = impl.endswith("+swiglu")
    outputs = shape.n // 2 if swiglu else shape.n
    try:
        run, row.config = _runner(impl, x, shape.n, config)
        y = torch.full((batch, outputs), float("nan"), dtype=torch.bfloat16, device=dev)
        run(weights[0], y)
        row.rel_err = rel_err(y, linear_ref(x, weights[0], swiglu=swiglu))
        if not row.rel_err <= MAX_REL_ERR:
            row.error = f"wrong result: relative error {row.rel_err:.3g} > {MAX_REL_ERR}"
            return row
        outs = [torch.empty(batch, outputs, dtype=torch.bfloat16, device=dev) for _ in weights]
        calls = [lambda w=w, o=o: run(w, o) for w, o in zip(weights, outs)]
        row.us = measure(calls, device=dev, graph=True, warmup=2, repeats=repeats).us
        row.gb_per_s = shape.nbytes / (row.us * 1e-6) / 1e9
    except Exception as exc:  # recorded in the results, so one bad config does not end the sweep
        row.error = f"{type(exc).__name__}: {exc}"[:400]
    return row


def bench_tma(batches=(1, 16), impls=("cuda-tma", "triton", "cublas"), configs=None, presets=PRESETS,
              repeats: int = 15, log=print) -> list[StreamRow]:
    """Every shape x batch x impl; with ``configs``, cuda-tma once per config as well."""
    dev = torch.device("cuda", torch.cuda.current_device())
    rows: list[StreamRow] = []
    for shape in projection_shapes(presets):
        gen = torch.Generator(device=dev).manual_seed(shape.n * 7 + shape.k)
        first = torch.randn(shape.n, shape.k, dtype=torch.bfloat16, device=dev, generator=gen)
        weights = [first] + [first.clone() for _ in range(cold_l2_copies(shape.nbytes, dev) - 1)]
        for batch in batches:
            runs = [(impl, None) for impl in impls] + [("cuda-tma", c) for c in (configs or [])]
            if "swiglu" in shape.where and not configs:  # the fused MLP projection as the step runs it
                runs += [(impl + "+swiglu", None) for impl in impls if impl != "cublas"]
            for impl, cfg in runs:
                row = stream_rate(shape, batch, impl, weights, cfg, repeats)
                rows.append(row)
                log(_format(row))
        del weights, first
        torch.cuda.empty_cache()
    return rows


def _format(r: StreamRow) -> str:
    head = f"N={r.n:<6} K={r.k:<5} B={r.batch:<2} {r.impl:<15} {r.config or '':<70}"
    if r.error:
        return f"{head} FAILED {r.error}"
    return f"{head} {r.us:8.2f} us {r.gb_per_s:7.0f} GB/s  err {r.rel_err:.1e}"


def best_per_shape(rows: list[StreamRow]) -> dict[tuple[int, int, int], StreamRow]:
    """The fastest correct cuda-tma row per (n, k, batch)."""
    best: dict[tuple[int, int, int], StreamRow] = {}
    for r in rows:
        if r.impl == "cuda-tma" and r.error is None:
            key = (r.n, r.k, r.batch)
            if key not in best or r.us < best[key].us:
                best[key] = r
    return best


def summary_table(rows: list[StreamRow]) -> str:
    """Markdown: GB/s of weight bytes per shape and batch, one column per implementation (with a
    sweep, its fastest correct config)."""
    impls = list(dict.fromkeys(r.impl for r in rows))
    best: dict[tuple[int, int, int], dict[str, float | None]] = {}
    for r in rows:
        cell = best.setdefault((r.n, r.k, r.batch), {})
        rate = None if r.error else r.gb_per_s
        if cell.get(r.impl) is None or (rate is not None and rate > cell[r.impl]):
            cell[r.impl] = rate
    lines = ["| N | K | batch | " + " | ".join(impls) + " |", "| ---: | ---: | ---: |" + " ---: |" * len(impls)]
    for (n, k, b), cell in sorted(best.items(), key=lambda kv: (-kv[0][0] * kv[0][1], kv[0][2])):
        text = ["" if i not in cell else "failed" if cell[i] is None else f"{cell[i]:,.0f}" for i in impls]
        lines.append(f"| {n} | {k} | {b} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def tuning_section(sweep: dict, source: str | None = None) -> dict:
    """The ``tma`` section of a tuning file (:mod:`labkit.tuning.tma`) from a sweep's results
    document: the fastest correct config per shape, for batch buckets 1 and 16, with the sweep's
    provenance."""
    from dataclasses import asdict

    from ..cuda import config_from_repr
    from ..tuning.tma import bucket

    rows = [StreamRow(**r) for r in sweep["results"]]
    entries = [
        {"m_bucket": bucket(b), "n": n, "k": k, "config": asdict(config_from_repr(r.config)),
         "us": round(r.us, 3), "gb_per_s": round(r.gb_per_s, 1), "where": r.where}
        for (n, k, b), r in sorted(best_per_shape(rows).items()) if b == bucket(b)
    ]
    keep = ("versions", "date", "command", "device")
    return {**{k: sweep.get(k) for k in keep}, **({"source": source} if source else {}), "entries": entries}


def write_tuning(sweep_path: Path, directory: Path | None = None) -> Path:
    """Merge the sweep's winners into the ``tma`` section of ``<directory>/<gpu-slug>.json``
    (default data/tuning), keeping the file's other sections and their provenance."""
    from .. import tuning

    sweep = json.loads(Path(sweep_path).read_text())
    if not sweep.get("gpu"):
        raise SystemExit(f"{sweep_path} was not measured on a GPU")
    path = tuning.tuning_path(sweep["gpu"], directory or tuning.TUNING_DIR)
    return tuning.update_tuning_file(path, sweep["gpu"], tma=tuning_section(sweep, str(sweep_path)))


def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench tma", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 16])
    p.add_argument("--impls", nargs="+", default=["cuda-tma", "triton", "cublas"])
    p.add_argument("--models", nargs="+", default=list(PRESETS))
    p.add_argument("--sweep", action="store_true", help="also time cuda-tma at every config of the sweep grid")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--name", default="tma-gemv", help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    p.add_argument("--tuning-from", type=Path, metavar="SWEEP_JSON",
                   help="no timing: write the tma section of data/tuning/<gpu>.json from a --sweep results file")
    args = p.parse_args(argv)
    if args.tuning_from:
        print(f"wrote {write_tuning(args.tuning_from)}")
        return 0
    if not torch.cuda.is_available():
        print("bench tma times CUDA kernels inside CUDA graphs: it needs a CUDA GPU")
        return 2
    facts = device_facts("cuda")
    print(f"{facts.name}: copy {facts.copy_bytes_per_s / 1e12:.2f} TB/s")
    rows = bench_tma(args.batch, args.impls, list(sweep_configs()) if args.sweep else None, args.models,
                     args.repeats)
    if args.sweep:
        print("fastest cuda-tma config per shape:")
        for (n, k, b), r in sorted(best_per_shape(rows).items()):
            print(f"  N={n:<6} K={k:<5} B={b:<2} {r.us:8.2f} us {r.gb_per_s:7.0f} GB/s {r.config}")
    command = shlex.join(["python", "-m", "labkit", "bench", "tma", *argv])
    path = write_results(args.name, "tma-gemv", rows, facts, command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    print("GB/s of weight bytes (fastest correct config per implementation):")
    print(summary_table(rows))
    return 0 if not any(r.error and "wrong result" in r.error for r in rows) else 1
