"""Data-parallel replicas: the rank side of ``python -m labkit serve-batch``.

Every rank holds the whole model with its own static cache and its own captured decode step (any
labkit backend), serves its share of a fixed request set (:mod:`labkit.distributed.requests`) with
:func:`labkit.generate`, and sends its tokens and timings to the others once it is done. Nothing is
communicated inside a decode step, which is the whole point: a replica's step is the single-GPU step.

With ``--compare-single`` the same job first serves the whole request set on rank 0 alone (the
others wait), then on every rank, so that the speed-up is measured against one GPU of the same
machines in the same job, and the tokens of every request are compared between the two.

Aggregate decode throughput = all decode tokens / the slowest replica's decode time; end-to-end
throughput = all generated tokens / the wall time from the common start (a barrier) to the last
replica's end; a request's latency = time from that start until its batch is done (every request
arrives at the start, as in an offline batch job).
"""

from __future__ import annotations

import gc
import hashlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .requests import RequestBatch, make_requests, shard
from .runtime import Rank


@dataclass
class ServeRow:
    """One results row: a model and batch size served by ``world_size`` replicas."""

    model: str
    impl: str  # the labkit backend of every replica
    batch: int
    world_size: int
    nodes: int
    requests: int
    new_tokens: int
    prompt_min: int
    prompt_max: int
    tokens_per_s: float  # aggregate decode tokens/s (median run)
    e2e_tokens_per_s: float  # all generated tokens / wall time, prefill included (same run)
    wall_s: float
    step_ms: float  # median decode step of one replica
    latency_p50_s: float
    latency_p90_s: float
    latency_max_s: float
    service_p50_s: float  # prefill + decode of one batch, queueing excluded
    speedup: float | None  # tokens_per_s / the world_size=1 row of the same job
    e2e_speedup: float | None
    identical_to_single: bool | None  # every request's tokens equal the world_size=1 run's
    repeatable: bool  # every run of this row gave the same tokens
    tokens_sha256: str  # of all requests' tokens, in request order
    runs_tokens_per_s: list[float] = field(default_factory=list)
    error: str | None = None


# -- one replica ----------------------------------------------------------------------------------
def resolve_model(name: str, dtype: torch.dtype, device: torch.device):
    """A shipped checkpoint by name, a preset (seeded random weights, the same on every rank), or a
    checkpoint directory."""
    from ..checkpoint import load
    from ..config import PRESETS
    from ..shipped import CHECKPOINTS, load_model

    if name in CHECKPOINTS or name in PRESETS:
        return load_model(name, dtype, device)
    if Path(name).expanduser().is_dir():
        return load(name, dtype=dtype, device=device)
    raise FileNotFoundError(
        f"model {name!r} is not a preset ({', '.join(PRESETS)}), a shipped checkpoint ({', '.join(CHECKPOINTS)}) "
        f"or a checkpoint directory on {__import__('socket').gethostname()}"
    )


def fingerprint(model) -> list[tuple[float, float]]:
    """(sum, sum of |w|) of each parameter in float64: equal on every replica of the same weights."""
    with torch.no_grad():
        return [(p.sum(dtype=torch.float64).item(), p.abs().sum(dtype=torch.float64).item())
                for p in model.parameters()]


def check_replicas(prints: list[list[tuple[float, float]]], name: str) -> None:
    """Raise unless every rank holds the same weights as rank 0 (to reduction rounding)."""
    ref = prints[0]
    for r, other in enumerate(prints[1:], start=1):
        if len(other) != len(ref) or any(abs(s - s0) > 1e-6 * max(a0, 1e-30) or abs(a - a0) > 1e-6 * max(a0, 1e-30)
                                         for (s, a), (s0, a0) in zip(other, ref)):
            raise RuntimeError(f"rank {r} holds different weights for {name!r} than rank 0: the replicas must be "
                               "copies of one model (same checkpoint files, same seed)")


def serve_share(model, backend: str, share: list[RequestBatch], new_tokens: int, cache, rank: int) -> dict[str, Any]:
    """Generate ``new_tokens`` greedily for each batch of ``share``, in order; timings from the start."""
    from ..generate import generate

    done, outs = [], []
    t0 = time.perf_counter()
    for b in share:
        outs.append(generate(model, b.prompt, new_tokens, backend=backend, cache=cache, progress=False))
        done.append(time.perf_counter() - t0)  # generate has synchronised the device
    elapsed = time.perf_counter() - t0
    records = []
    for b, out, done_s in zip(share, outs, done):
        for row, request in enumerate(b.request_ids):
            records.append(dict(request=request, batch_index=b.index, rank=rank, prompt_len=b.prompt_len,
                                done_s=done_s, prefill_s=out.prefill_s, decode_s=out.decode_s, steps=out.steps,
                                tokens=out.tokens[row].tolist()))
    return dict(rank=rank, elapsed_s=elapsed, decode_s=sum(o.decode_s for o in outs),
                decode_tokens=sum(o.tokens.shape[0] * o.steps for o in outs), records=records)


# -- one phase: the request set served by `world` replicas, timed from a common start -------------
@dataclass
class PhaseRun:
    tokens_per_s: float
    e2e_tokens_per_s: float
    wall_s: float
    records: list[dict[str, Any]]  # every request, in request order

    @property
    def tokens(self) -> list[list[int]]:
        return [r["tokens"] for r in self.records]


def combine(payloads: list[dict[str, Any] | None]) -> PhaseRun:
    parts = [p for p in payloads if p is not None]
    records = sorted((r for p in parts for r in p["records"]), key=lambda r: r["request"])
    if [r["request"] for r in records] != list(range(len(records))):
        raise RuntimeError("the replicas' results do not cover the request set exactly once")
    decode_s = max(p["decode_s"] for p in parts)
    wall_s = max(p["elapsed_s"] for p in parts)
    generated = sum(len(r["tokens"]) for r in records)
    decoded = sum(p["decode_tokens"] for p in parts)  # none with a single new token: all from the prefill
    return PhaseRun(decoded / decode_s if decoded else float("nan"), generated / wall_s, wall_s, records)


def run_phase(rank: Rank, world: int, model, backend: str, batches: list[RequestBatch], new_tokens: int,
              cache, what: str) -> PhaseRun:
    """Ranks below ``world`` serve their shares from a common start; the others wait for them."""
    share = shard(batches, rank.rank, world) if rank.rank < world else []
    rank.barrier()
    _, payloads = rank.on_every_rank(what, lambda: serve_share(model, backend, share, new_tokens, cache, rank.rank)
                                     if share else None, publish=lambda payload: payload)
    return combine(payloads)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _sha(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def summarize(runs: list[PhaseRun], name: str, impl: str, batch: int, world: int, nodes: int, args,
              single: "ServeRow | None" = None, single_run: PhaseRun | None = None) -> ServeRow:
    """The row of the median run (by decode throughput), compared with the world_size=1 row."""
    ordered = sorted(runs, key=lambda r: r.tokens_per_s)
    run = ordered[(len(ordered) - 1) // 2]
    recs = run.records
    per_batch = list({r["batch_index"]: r for r in recs}.values())
    step_ms = [r["decode_s"] / r["steps"] * 1e3 for r in per_batch if r["steps"]]
    row = ServeRow(
        model=name, impl=impl, batch=batch, world_size=world, nodes=nodes, requests=len(recs),
        new_tokens=args.new_tokens, prompt_min=args.prompt_min, prompt_max=args.prompt_max,
        tokens_per_s=run.tokens_per_s, e2e_tokens_per_s=run.e2e_tokens_per_s, wall_s=run.wall_s,
        step_ms=statistics.median(step_ms) if step_ms else float("nan"),
        latency_p50_s=_quantile([r["done_s"] for r in recs], 0.5),
        latency_p90_s=_quantile([r["done_s"] for r in recs], 0.9),
        latency_max_s=max(r["done_s"] for r in recs),
        service_p50_s=_quantile([r["prefill_s"] + r["decode_s"] for r in per_batch], 0.5),
        speedup=run.tokens_per_s / single.tokens_per_s if single else None,
        e2e_speedup=run.e2e_tokens_per_s / single.e2e_tokens_per_s if single else None,
        identical_to_single=all(r.tokens == single_run.tokens for r in runs) if single_run else None,
        repeatable=all(r.tokens == runs[0].tokens for r in runs),
        tokens_sha256=_sha(run.tokens),
        runs_tokens_per_s=[r.tokens_per_s for r in runs],
    )
    return row


# -- the whole job --------------------------------------------------------------------------------
def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":  # CPU bf16 matmuls are slow; the kernels take either
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _backend(name: str, device: torch.device) -> str:
    from ..decode.registry import BACKENDS

    name = ("fused+graph" if device.type == "cuda" else "reference") if name == "auto" else name
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    return name


def serve_job(rank: Rank, args, command: str) -> tuple[dict[str, Any], list[ServeRow]] | None:
    """Serve the request set for each model and batch size; rank 0 returns the results document
    and its rows, the other ranks None."""
    ranks = rank.gather_all(dict(rank=rank.rank, host=rank.host, device=_device_name(rank.device)))
    nodes = len({r["host"] for r in ranks})
    dtype, backend = _dtype(args.dtype, rank.device), _backend(args.backend, rank.device)
    say = print if rank.is_main else (lambda *a, **k: None)
    say(f"serve-batch: {rank.world_size} replica(s) on {nodes} node(s), {rank.backend}, backend {backend}, "
        f"{dtype}, {args.new_tokens} new tokens, prompts of {args.prompt_min}-{args.prompt_max} tokens", flush=True)
    rows: list[ServeRow] = []
    requests: list[dict[str, Any]] = []
    for name in args.models:
        model, prints = rank.on_every_rank(f"loading {name!r}", lambda: resolve_model(name, dtype, rank.device),
                                           publish=fingerprint)
        check_replicas(prints, name)
        for batch in args.batch:
            batches = make_requests(model.cfg.vocab_size, batch, args.num_batches, args.prompt_min,
                                    args.prompt_max, seed=args.seed)
            mine = shard(batches, rank.rank, rank.world_size)  # the same check on every rank: all raise or none
            cache = model.new_cache(batch, args.prompt_max + args.new_tokens)
            # compile, autotune and capture the decode step outside the timed runs
            rank.on_every_rank(f"warming up {name} batch {batch}",
                               lambda: serve_share(model, backend, mine[:1], args.new_tokens, cache, rank.rank))
            worlds = [1, rank.world_size] if args.compare_single and rank.world_size > 1 else [rank.world_size]
            single_row, single_run = None, None
            for world in worlds:
                runs = [run_phase(rank, world, model, backend, batches, args.new_tokens, cache,
                                  f"serving {name} batch {batch} on {world} replica(s)") for _ in range(args.repeats)]
                row = summarize(runs, name, backend, batch, world, nodes if world > 1 else 1, args,
                                single_row, single_run)
                if world == 1 and args.compare_single:
                    row.speedup, row.e2e_speedup = 1.0, 1.0
                    single_row, single_run = row, runs[0]
                rows.append(row)
                requests.append(dict(model=name, batch=batch, world_size=world, records=runs[0].records))
                say(_describe(row), flush=True)
            del cache
        del model
        gc.collect()  # a cache and the decoder attached to it (its CUDA graphs) refer to each other
        if rank.device.type == "cuda":
            torch.cuda.empty_cache()
    if not rank.is_main:
        return None
    from ..bench import provenance
    from ..lab.hw import device_facts

    doc = dict(**provenance(device_facts(str(rank.device), measure=False), command), kind="serve",
               world_size=rank.world_size, nodes=nodes, process_group=rank.backend, ranks=ranks,
               options=dict(vars(args)), results=[asdict(r) for r in rows], requests=requests)
    return doc, rows


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _describe(row: ServeRow) -> str:
    line = (f"{row.model:>14} B={row.batch:<3} {row.world_size} replica(s): {row.tokens_per_s:10,.1f} decode tok/s "
            f"({row.step_ms:7.3f} ms/step), {row.e2e_tokens_per_s:10,.1f} tok/s end to end, "
            f"latency p50 {row.latency_p50_s:.3f} s")
    if row.speedup is not None and row.world_size > 1:
        same = "same tokens as 1 replica" if row.identical_to_single else "TOKENS DIFFER from 1 replica"
        line += f"; {row.speedup:.2f}x decode, {row.e2e_speedup:.2f}x end to end vs 1; {same}"
    return line
