"""CUDA graphs for the graph rungs: the one seam the CPU tests replace, and the one capture sequence.

Every graph rung (``fused+graph``'s decode step and prefills, ``reference+graph``'s step) captures
through :func:`capture`: save the states the step writes, run it once outside any capture (kernels
compile and load) on a side stream, put the states back, then record it. ``GRAPHS`` is how that
runs; the CPU tests swap it for a stand-in that records the step and re-runs it on replay, so
capture, replay and reuse run without a GPU.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

__all__ = ["CudaGraphs", "GRAPHS", "capture"]


class CudaGraphs:
    """How the graph rungs warm up, capture and replay a step on a CUDA device."""

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def warm_up(self, step: Callable[[], None], device: torch.device) -> None:
        """Run ``step`` once outside any capture (kernels compile and load), on a side stream as
        torch.cuda.graph asks."""
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(device).wait_stream(side)

    def capture(self, step: Callable[[], None], device: torch.device) -> Any:
        """A graph of ``step``'s launches (not run now); ``.replay()`` runs them."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize(device)
        return graph


GRAPHS = CudaGraphs()


def capture(warm_up: Callable[[], None], states: Iterable[torch.Tensor], device: torch.device,
            step: Callable[[], None] | None = None) -> Any:
    """A graph of ``step`` (default: ``warm_up``), after one eager run of ``warm_up`` whose writes to
    ``states`` are undone: they are saved before it and copied back after it, so the warm-up leaves
    no trace in them. What it writes elsewhere must be rewritten before it is read (the k/v at
    position ``lengths`` are, by the next real step)."""
    states = list(states)
    saved = [s.clone() for s in states]
    GRAPHS.warm_up(warm_up, device)
    for s, copy in zip(states, saved):
        s.copy_(copy)
    del saved
    return GRAPHS.capture(warm_up if step is None else step, device)
