"""Where the time of one decode step goes, measured with torch.profiler.

``profile_decode`` runs a few decode steps under the profiler and reports what the diagnosis
needs: how many kernels a token launches, how long the GPU is busy versus waiting for the next
launch, which op families (norms, projections, the token mixers, MLPs, lm_head, sampling) take
the device time, the achieved bandwidth against the measured peak, and the share of device time
spent in tensor-core kernels. On a CPU there are no kernels; the report then covers the op
families by CPU time, which is still enough to run the notebooks end to end.

How kernels are attributed: while profiling, every norm, mixer and MLP module is wrapped in a
``record_function`` scope; each GPU kernel is linked (by its correlation id) to the aten op that
launched it, and that op's chain of parents names the scope. Inside a mixer, kernels under an
``aten::linear`` are counted as projections, the rest as the mixer itself. Kernels launched by
code that is not a module (fused Triton backends) are attributed by their names.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from ..decode.registry import make_decoder
from ..model import Block, HybridLM, RMSNorm, SwiGLU
from .roofline import step_cost
from .timing import measure

FAMILIES = ("norm", "projections", "attention", "conv", "gdn", "mlp", "lm_head", "embedding", "sampling", "other")
_MATMUL_OPS = ("aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm")
# cuBLAS/CUTLASS matrix kernels (tensor cores) by name; "gemv" kernels run on the CUDA cores.
_TENSOR_CORE = re.compile(r"gemm|xmma|hmma|wgmma|gmma|cutlass|sm90_|sm80_|mma_", re.I)
_NAME_RULES = [
    (re.compile(r"argmax|sample|topk|multinomial", re.I), "sampling"),
    (re.compile(r"norm", re.I), "norm"),
    (re.compile(r"conv", re.I), "conv"),
    (re.compile(r"delta|gdn", re.I), "gdn"),
    (re.compile(r"attn|attention|flash|fmha", re.I), "attention"),
    (re.compile(r"lm_head|logits", re.I), "lm_head"),
    (re.compile(r"swiglu|mlp", re.I), "mlp"),
    (re.compile(r"gemv|gemm|linear|matmul", re.I), "projections"),
]


@dataclass
class KernelSpan:
    name: str
    family: str
    start_us: float
    dur_us: float


@dataclass
class StepProfile:
    model: str
    backend: str
    batch: int
    context: int
    device: str
    step_ms: float  # measured outside the profiler, median over rounds
    kernels_per_step: float | None
    busy_ms: float | None  # device busy (union of kernel intervals) per step
    family_ms: dict[str, float] = field(default_factory=dict)  # per step: device time (GPU) or CPU self time
    tensor_core_share: float | None = None
    bytes_per_step: int = 0
    timeline: list[KernelSpan] = field(default_factory=list)  # one step
    # the same steps timed under the profiler, in rounds interleaved with the unprofiled ones
    profiled_step_ms: float | None = None
    bench_runs_ms: list[float] = field(default_factory=list)  # per step, one per round, no profiler
    profiled_runs_ms: list[float] = field(default_factory=list)  # per step, one per round, profiled
    launch_api_us: float | None = None  # mean cudaLaunchKernel call as the profiler saw it (inflated by it)
    fresh_step_ms: float | None = None  # a step at a length never run before in this process, no profiler
    fresh_gap_ms: float | None = None  # the longest gap between kernels in the profiled fresh steps
    fresh_gap_kernel: str | None = None  # the kernel that waited for it

    @property
    def profiler_overhead(self) -> float | None:
        """Profiled step time over the unprofiled one (1.0: the profiler costs nothing)."""
        return None if self.profiled_step_ms is None else self.profiled_step_ms / self.step_ms

    @property
    def idle_ms(self) -> float | None:
        return None if self.busy_ms is None else max(self.step_ms - self.busy_ms, 0.0)

    @property
    def achieved_bytes_per_s(self) -> float:
        return self.bytes_per_step / (self.step_ms * 1e-3)

    def table(self) -> list[tuple[str, float, float]]:
        """(family, ms per step, share of the total) sorted by time."""
        total = sum(self.family_ms.values()) or 1.0
        rows = [(f, ms, ms / total) for f, ms in self.family_ms.items() if ms > 0]
        return sorted(rows, key=lambda r: -r[1])


@contextmanager
def _module_scopes(model: HybridLM):
    """Wrap norms, mixers and MLPs in record_function scopes for the duration of the block."""
    handles, stack = [], []

    def scoped(module, name):
        def pre(_m, _args):
            rf = record_function(f"labkit::{name}")
            rf.__enter__()
            stack.append(rf)

        def post(_m, _args, _out):
            stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    scoped(model.embed, "embedding")
    for module in model.modules():
        if isinstance(module, RMSNorm):
            scoped(module, "norm")
        elif isinstance(module, SwiGLU):
            scoped(module, "mlp")
        elif isinstance(module, Block):
            scoped(module.mixer, module.kind)
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _family_of(op, kernel_name: str | None = None) -> str:
    """The family of an aten op, from its chain of parent scopes (or the kernel's name)."""
    under_matmul = False
    node = op
    while node is not None:
        name = node.name
        if name.startswith("labkit::"):
            scope = name.removeprefix("labkit::")
            if scope in ("attention", "conv", "gdn") and under_matmul:
                return "projections"
            if scope == "step":
                break
            return scope
        if name in _MATMUL_OPS:
            under_matmul = True
        node = node.cpu_parent
    if under_matmul:
        return "lm_head"  # the only matmul of a reference step outside every module
    for pattern, family in _NAME_RULES:
        if kernel_name and pattern.search(kernel_name):
            return family
    return "other"


def _attribute_kernels(events, steps: int, family_ms: dict[str, float], result: StepProfile) -> None:
    """Device time per family, kernel count, busy time, tensor-core share and the last step's timeline.

    The device's kernel events are the ground truth (count, start, duration). Each one launched by
    an aten op is found among that op's kernels (``FunctionEvent.kernels``: name and duration;
    matched by both, which needs no version-specific correlation field of the profiler), and the
    op's chain of parent scopes gives its family; a kernel launched outside aten (Triton's, in the
    fused backends) gets its family from its name.
    """
    cpu = torch.autograd.DeviceType.CPU
    linked: dict[tuple[str, float], list[str]] = {}
    for op in events:
        if op.device_type != cpu:
            continue
        for k in getattr(op, "kernels", []):
            if not k.name.startswith(("Memcpy", "Memset")):
                linked.setdefault((k.name, round(k.duration, 3)), []).append(_family_of(op, k.name))
    device = sorted((e for e in events if _is_kernel(e)), key=lambda e: e.time_range.start)
    tc_us = total_us = 0.0
    spans = []
    for e in device:
        dur = e.time_range.end - e.time_range.start
        fams = linked.get((e.name, round(dur, 3)))
        fam = fams.pop(0) if fams else _family_of(None, e.name)
        family_ms[fam] += dur / 1e3 / steps
        total_us += dur
        if _TENSOR_CORE.search(e.name) and "gemv" not in e.name.lower():
            tc_us += dur
        spans.append(KernelSpan(e.name, fam, e.time_range.start, dur))
    result.kernels_per_step = len(device) / steps
    calls = [e for e in events if e.device_type == cpu and e.name.startswith("cudaLaunchKernel")]
    if calls:
        result.launch_api_us = sum(e.time_range.end - e.time_range.start for e in calls) / len(calls)
    result.tensor_core_share = tc_us / total_us if total_us else None
    if not device:
        return
    result.busy_ms = union_ms([(e.time_range.start, e.time_range.end) for e in device]) / steps
    # the GPU-side copy of the step annotation, where the profiler records one: kernels of the last
    # step start after it (the CPU-side range opens earlier, while the GPU still runs the step before)
    marks = [e for e in events if e.name == "labkit::step"]
    marks = [e for e in marks if e.device_type != cpu] or marks
    starts = sorted(e.time_range.start for e in marks)
    tail = [sp for sp in spans if starts and sp.start_us >= starts[-1]] or spans
    t0 = tail[0].start_us
    result.timeline = [KernelSpan(sp.name, sp.family, sp.start_us - t0, sp.dur_us) for sp in tail]


def _is_kernel(e) -> bool:
    """A device event that is a kernel: not a copy or memset, and not the GPU-timeline copy of a
    ``record_function`` range (kineto mirrors user annotations onto the device, where they span
    whole steps and would count as busy time)."""
    if e.device_type != torch.autograd.DeviceType.CUDA or e.name.startswith(("Memcpy", "Memset", "labkit::")):
        return False
    return not getattr(e, "is_user_annotation", False)


def merged_spans(spans: list[tuple[float, float]]) -> list[list[float]]:
    """The union of the intervals ``spans`` as disjoint [start, end] intervals, in order."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def union_ms(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``spans`` (microseconds, as the profiler's) in milliseconds."""
    return sum(e - s for s, e in merged_spans(spans)) / 1e3


# Kineto (torch.profiler's engine) writes one of these to the process's stderr, from C++, each time a
# profile starts and stops: markers for USDT tracing probes, not messages for a reader.
_KINETO_MARKER = re.compile(r"^USDT:.*\] profiler_(start|stop)\s*$")


@contextmanager
def _profiling(activities):
    """``torch.profiler.profile`` over the block, without kineto's start/stop markers on stderr.

    No KINETO_LOG_LEVEL hides the markers and still shows kineto's errors (their level ranks above
    ERROR), so the process's stderr is caught while the profiler starts and while it stops, and
    every other line caught there is written back. ``acc_events=True``: one profiling cycle here,
    and torch 2.10-2.11 warn on every profile that does not set it.
    """
    prof = profile(activities=activities, acc_events=True)
    with _without_kineto_markers():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _without_kineto_markers():
            prof.__exit__(None, None, None)


@contextmanager
def _without_kineto_markers():
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not _KINETO_MARKER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


@torch.no_grad()
def profile_decode(
    model: HybridLM,
    backend: str = "reference",
    batch: int = 1,
    context: int = 128,
    steps: int = 5,
    warmup: int = 3,
    rounds: int = 3,
    fresh_steps: int = 2,
) -> StepProfile:
    """Profile greedy decode steps after a ``context``-token prefill, interleaved with the same steps
    unprofiled, in one run.

    Every round starts again from the same prompt (prefill and ``warmup`` steps, not timed), so all
    rounds run the same ``steps`` positions, as a benchmark's repeated runs do; one unmeasured round
    first. Each of ``rounds`` rounds then times the steps back to back without the profiler (as a
    decode loop issues them: the host queues step n+1 while the GPU runs step n), and once more
    under the profiler, with the module scopes it needs. ``step_ms`` is the median unprofiled step,
    ``profiled_step_ms`` the median profiled one: their ratio is the profiler's own overhead. The
    kernels of the last round are attributed.

    Then ``fresh_steps`` steps at positions the process has never run (``fresh_step_ms``) and as
    many profiled further on: a step at a new length can cost more on the host (a library building
    and caching a plan for a new shape); the longest gap between two kernels of those profiled steps
    and the kernel after it are kept (``fresh_gap_ms``, ``fresh_gap_kernel``).
    """
    if steps < 1 or rounds < 1 or warmup < 0 or fresh_steps < 0:
        raise ValueError(f"need steps >= 1, rounds >= 1, warmup >= 0, fresh_steps >= 0; "
                         f"got {steps}, {rounds}, {warmup}, {fresh_steps}")
    cuda = model.device.type == "cuda"
    cache = model.new_cache(batch, context + warmup + steps + 2 * fresh_steps + 1)
    decoder = make_decoder(backend, model, cache)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    last: dict = {}

    def start() -> None:
        cache.reset()
        last["token"] = decoder.prefill(ids).argmax(-1)
        for _ in range(warmup):
            last["token"] = decoder.step(last["token"]).argmax(-1)

    def run(n: int = steps) -> None:
        for _ in range(n):
            last["token"] = decoder.step(last["token"]).argmax(-1)

    def profiled_run(n: int) -> tuple[Any, float]:
        with _module_scopes(model), _profiling(activities) as prof:
            _sync(model.device)
            t0 = time.perf_counter()
            for _ in range(n):
                with record_function("labkit::step"):
                    logits = decoder.step(last["token"])
                    with record_function("labkit::sampling"):
                        last["token"] = logits.argmax(-1)
            _sync(model.device)
        return prof, (time.perf_counter() - t0) * 1e3 / n

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start()
    run()  # every position of the rounds runs once before anything is timed
    bench, profiled, prof = [], [], None
    for _ in range(rounds):
        bench.append(measure(run, device=model.device, graph=False, warmup=0, repeats=1, setup=start).ms / steps)
        start()
        prof, ms = profiled_run(steps)
        profiled.append(ms)
    events = prof.events()

    result = StepProfile(
        model=model.cfg.name, backend=backend, batch=batch, context=context,
        device=model.device.type, step_ms=statistics.median(bench), kernels_per_step=None, busy_ms=None,
        bytes_per_step=step_cost(model.cfg, batch, context, model.dtype.itemsize).bytes,
        profiled_step_ms=statistics.median(profiled), bench_runs_ms=bench, profiled_runs_ms=profiled,
    )
    if fresh_steps:  # continue past every position run so far
        result.fresh_step_ms = measure(lambda: run(fresh_steps), device=model.device, graph=False, warmup=0,
                                       repeats=1).ms / fresh_steps
        if cuda:
            fresh_prof, _ = profiled_run(fresh_steps)
            kernels = sorted((e for e in fresh_prof.events() if _is_kernel(e)), key=lambda e: e.time_range.start)
            gaps = [(b.time_range.start - a.time_range.end, b.name) for a, b in zip(kernels, kernels[1:])]
            if gaps:
                widest = max(gaps)
                result.fresh_gap_ms, result.fresh_gap_kernel = widest[0] / 1e3, widest[1][:120]
    family_ms = dict.fromkeys(FAMILIES, 0.0)
    if cuda:
        _attribute_kernels(events, steps, family_ms, result)
    else:
        for e in events:
            if e.device_type != torch.autograd.DeviceType.CPU or e.name.startswith("labkit::"):
                continue
            family_ms[_family_of(e, e.name)] += e.self_cpu_time_total / 1e3 / steps
    result.family_ms = {k: v for k, v in family_ms.items() if v > 0}
    return result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class PrefillProfile:
    model: str
    tokens: int
    batch: int
    wall_ms: float  # one prefill under the profiler, host clock (includes the profiler's overhead)
    kernels: int | None
    busy_ms: float | None  # union of the prefill's kernel intervals


@torch.no_grad()
def profile_prefill(model: HybridLM, tokens: int, batch: int = 1) -> PrefillProfile:
    """Kernels and GPU-busy time of one reference prefill of ``tokens`` tokens (after one warm-up)."""
    cache = model.new_cache(batch, tokens)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    decoder = make_decoder("reference", model, cache)
    decoder.prefill(ids)
    cuda = model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    cache.reset()
    with _profiling(activities) as prof:
        _sync(model.device)
        t0 = time.perf_counter()
        decoder.prefill(ids)
        _sync(model.device)
        wall = (time.perf_counter() - t0) * 1e3
    if not cuda:
        return PrefillProfile(model.cfg.name, tokens, batch, wall, None, None)
    kernels = [e for e in prof.events() if _is_kernel(e)]
    busy = union_ms([(e.time_range.start, e.time_range.end) for e in kernels])
    return PrefillProfile(model.cfg.name, tokens, batch, wall, len(kernels), busy)
