"""What tensor parallelism would pay per token: all-reduce latency at the message sizes of a decode step.

Tensor parallelism (Megatron style) splits every projection across ``tp`` GPUs: the column-parallel
input projections need no communication, but the row-parallel output of each token mixer and of
each MLP leaves a partial sum on every GPU, reduced by an all-reduce of the hidden state,
``batch x hidden`` values. So a decode step pays ``2 x layers`` all-reduces of a few kilobytes
(LFM2-350M at batch 1: 1,024 bf16 values = 2 KB), one after the other, each on the critical path:

    step(tp) >= step(1) / tp + 2 * layers * allreduce(batch * hidden)

The first term is the best case (the weight stream split perfectly, which small kernels do not
reach); the second is measured here, through ``torch.distributed`` (NCCL on GPUs, gloo on CPUs),
issued eagerly from Python and replayed from a CUDA graph. The LM head's gather or argmax across
GPUs is not counted: the bound stays optimistic for tensor parallelism.

Replicas pay nothing per step: each GPU runs the single-GPU step for its own requests.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..config import ModelConfig
from ..lab.timing import measure
from .runtime import Rank


@dataclass
class AllReduceRow:
    world_size: int
    nodes: int
    process_group: str  # "nccl" or "gloo"
    dtype: str
    batch: int
    hidden: int
    bytes: int  # message size: batch * hidden * element size
    eager_us: float  # per all-reduce, issued back to back from Python (median of repeats)
    graph_us: float | None  # per all-reduce, replayed from one CUDA graph (None on CPUs)
    runs_eager_us: list[float] = field(default_factory=list)
    runs_graph_us: list[float] = field(default_factory=list)
    graph_note: str | None = None  # why there is no graph figure
    error: str | None = None


def allreduces_per_token(cfg: ModelConfig) -> int:
    """All-reduces on the critical path of one tensor-parallel decode step: one after each token
    mixer's output projection and one after each MLP's down projection."""
    return 2 * cfg.num_layers


def tensor_parallel_step_us(cfg: ModelConfig, single_step_us: float, tp: int, allreduce_us: float) -> float:
    """Lower bound on a ``tp``-way tensor-parallel decode step: the single-GPU step split perfectly,
    plus the all-reduces it cannot avoid."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    return single_step_us / tp + (allreduces_per_token(cfg) * allreduce_us if tp > 1 else 0.0)


def message_bytes(batch: int, hidden: int, dtype: torch.dtype) -> int:
    return batch * hidden * torch.empty((), dtype=dtype).element_size()


def _check_sum(rank: Rank, numel: int, dtype: torch.dtype, reduce) -> None:
    """Fill with rank + 1, reduce, expect 1 + 2 + ... + world everywhere (exact in any float type)."""
    x = torch.full((numel,), float(rank.rank + 1), dtype=dtype, device=rank.device)
    reduce(x)
    want = rank.world_size * (rank.world_size + 1) / 2
    if not bool((x == want).all()):
        raise RuntimeError(f"all-reduce of {numel} {dtype} values gave {x.float().unique()[:4].tolist()}, expected {want}")


def time_eager(rank: Rank, numel: int, dtype: torch.dtype, iters: int, repeats: int) -> list[float]:
    """Microseconds per all-reduce, ``iters`` issued back to back after a common start, per repeat."""
    x = torch.zeros(numel, dtype=dtype, device=rank.device)  # zeros stay zeros: the values never overflow
    _check_sum(rank, numel, dtype, dist.all_reduce)
    for _ in range(3):
        dist.all_reduce(x)
    def issue() -> None:
        for _ in range(iters):
            dist.all_reduce(x)

    timing = measure(issue, device=rank.device, graph=False, warmup=0, repeats=repeats, setup=rank.barrier)
    return [ms * 1e3 / iters for ms in timing.runs_ms]


def time_graph(rank: Rank, numel: int, dtype: torch.dtype, iters: int, repeats: int, group) -> list[float]:
    """Microseconds per all-reduce, ``iters`` of them captured in one CUDA graph and replayed.

    ``group`` is a process group used only by the captured collectives, so the eager collectives of
    the job (barriers, gathers) never interleave with replays on one communicator.
    """
    def reduce(t: torch.Tensor) -> None:
        dist.all_reduce(t, group=group)

    x = torch.zeros(numel, dtype=dtype, device=rank.device)
    check = torch.empty(numel, dtype=dtype, device=rank.device)
    reduce(x)  # the communicator exists before capture
    torch.cuda.synchronize(rank.device)
    graph, check_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            reduce(x)
    with torch.cuda.graph(check_graph):
        reduce(check)

    def replayed(t: torch.Tensor) -> None:  # the captured all-reduce sums what `check` holds now
        check.copy_(t)
        check_graph.replay()
        t.copy_(check)

    _check_sum(rank, numel, dtype, replayed)
    for _ in range(3):
        graph.replay()
    timing = measure(graph.replay, device=rank.device, graph=False, warmup=0, repeats=repeats, setup=rank.barrier)
    return [ms * 1e3 / iters for ms in timing.runs_ms]


def allreduce_job(rank: Rank, args, command: str) -> tuple[dict[str, Any], list[AllReduceRow]] | None:
    """Time the all-reduce at every batch x hidden size; rank 0 returns the document and rows."""
    from ..config import PRESETS

    hiddens = args.hidden or sorted({PRESETS[m].hidden_size for m in args.models})
    dtype = torch.bfloat16 if rank.device.type == "cuda" else torch.float32
    nodes = len(set(rank.gather_all(rank.host)))
    group = dist.new_group(backend="nccl") if rank.backend == "nccl" else None
    say = print if rank.is_main else (lambda *a, **k: None)
    say(f"allreduce: {rank.world_size} ranks on {nodes} node(s), {rank.backend}, {dtype}", flush=True)
    rows = []
    for hidden in hiddens:
        for batch in args.batch:
            numel = batch * hidden
            row = AllReduceRow(rank.world_size, nodes, rank.backend, str(dtype).removeprefix("torch."), batch, hidden,
                               message_bytes(batch, hidden, dtype), eager_us=float("nan"), graph_us=None)

            def time_both() -> dict[str, list[float]]:
                out = {"eager": time_eager(rank, numel, dtype, args.iters, args.repeats)}
                if group is not None:
                    out["graph"] = time_graph(rank, numel, dtype, args.graph_iters, args.repeats, group)
                return out

            _, timings = rank.on_every_rank(f"all-reduce of {row.bytes} bytes", time_both, publish=lambda t: t)
            # the collective couples the ranks; the slowest rank's median is the cost a step would see
            row.runs_eager_us = [max(t["eager"][i] for t in timings) for i in range(args.repeats)]
            row.eager_us = statistics.median(row.runs_eager_us)
            if group is not None:
                row.runs_graph_us = [max(t["graph"][i] for t in timings) for i in range(args.repeats)]
                row.graph_us = statistics.median(row.runs_graph_us)
            else:
                row.graph_note = "CUDA graphs need CUDA tensors (NCCL); this job ran gloo on CPUs"
            rows.append(row)
            graph = f"{row.graph_us:8.2f} µs in a CUDA graph" if row.graph_us is not None else "(no CUDA graph on a CPU)"
            say(f"hidden {hidden} x batch {batch:<3} = {row.bytes:>8,} bytes: {row.eager_us:8.2f} µs eager, {graph}",
                flush=True)
    if not rank.is_main:
        return None
    from ..bench import provenance
    from ..lab.hw import device_facts

    doc = dict(**provenance(device_facts(str(rank.device), measure=False), command), kind="allreduce",
               world_size=rank.world_size, nodes=nodes, process_group=rank.backend,
               options=dict(vars(args)),
               results=[asdict(r) for r in rows])
    return doc, rows
