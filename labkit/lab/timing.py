"""The one timer every measurement in labkit uses: warm up, then time whole runs, report the median.

On a CUDA device a run is timed with CUDA events around it. With ``graph=True`` (the default there)
the run is first captured in a CUDA graph and the events bracket one replay, so host overhead is
gone and each kernel pays what it pays inside a decode step's graph; ``graph=False`` times the
calls as they are launched (host overhead included), for work that cannot be captured (a Python
decode loop, a peer library). On a CPU the host clock times eager runs.

Cold L2: give ``work`` as a list of callables, each touching its own copy of the operands
(:func:`cold_l2_copies` says how many copies push the working set well past the L2 cache). A run
calls them all in order and the result is per call, so each call streams its operands from HBM as
in a decode step where the other layers' weights have evicted them.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


@dataclass
class Timing:
    """Milliseconds per call: the median over runs, and every run's figure."""

    ms: float
    runs_ms: list[float] = field(default_factory=list)

    @property
    def us(self) -> float:
        return self.ms * 1e3


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def measure(
    work: Callable[[], object] | Sequence[Callable[[], object]],
    *,
    device: torch.device | str | None = None,
    graph: bool | None = None,
    warmup: int = 2,
    repeats: int = 15,
    setup: Callable[[], object] | None = None,
) -> Timing:
    """Median milliseconds per call of ``work`` (one callable, or a list run back to back).

    ``setup`` runs before every run, warm-up included, and is not timed (e.g. reset a cache and
    prefill before timing decode steps). ``graph`` defaults to True on CUDA; it needs work whose
    launches can be captured (no host reads, no allocation that changes between calls).
    """
    calls = list(work) if isinstance(work, Sequence) else [work]
    if not calls:
        raise ValueError("nothing to time: work is an empty list")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = _as_device(device)
    cuda = device.type == "cuda"
    graph = cuda if graph is None else graph
    if graph and not cuda:
        raise RuntimeError(f"timing inside a CUDA graph needs a CUDA device, got {device}")

    def run() -> None:
        for call in calls:
            call()

    def before() -> None:
        if setup is not None:
            setup()
            if cuda:
                torch.cuda.synchronize(device)

    timed = run
    if graph:
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # compile, autotune, first allocations: outside the capture
                before()
                run()
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
            captured = torch.cuda.CUDAGraph()
            before()
            with torch.cuda.graph(captured):
                run()
        timed = captured.replay

    times = []
    for i in range(warmup + repeats):
        before()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(device))
            timed()
            end.record(torch.cuda.current_stream(device))
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            timed()
            ms = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(ms / len(calls))
    return Timing(statistics.median(times), times)


def cold_l2_copies(nbytes: int, device: torch.device | str | None = None, cap: int = 64) -> int:
    """Copies of an ``nbytes`` operand to rotate over so that the working set is ~3x the device's
    L2 cache (at most ``cap``): each call then streams its operand from HBM."""
    device = _as_device(device)
    if device.type != "cuda":
        raise RuntimeError(f"cold-L2 rotation sizes itself on a CUDA device's L2 cache, got {device}")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(cap, math.ceil(3 * l2 / max(nbytes, 1))))
