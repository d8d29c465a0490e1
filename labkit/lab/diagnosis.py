"""Where the wall time of one reference decode step goes, each part measured, the parts summing to the step.

A step of the plain model is a long chain of small kernels issued one by one from Python. On the
step's timeline the GPU is either running a kernel or waiting for the host to issue the next one:

    step = GPU busy + launching + Python and dispatcher

- GPU busy: the union of the step's kernel intervals, from the profiler's device timestamps
  (``labkit.lab.profile.profile_decode``);
- launching: kernels per step × the measured cost of issuing one minimal op from Python (an
  in-place add on one element: Python call, dispatcher, ``cudaLaunchKernel``;
  ``labkit.lab.hw.measure_launch_overhead``);
- Python and dispatcher: the rest, everything the host does per op beyond that minimal launch
  (module calls, argument handling, shape checks, views, allocations, ops that launch nothing).

Two experiments test the split rather than trust it (:func:`diagnose` runs both in the same
process, on the same model and step):

- the trivial-work twin (:func:`trivial_twin`): the same layers and ops at tiny widths, so its
  kernels do almost nothing; if the step is host-bound, the twin's step takes as long as the real one;
- the decisive one, ``"reference+graph"`` (:mod:`labkit.decode.reference_graph`): the same kernels replayed
  from one CUDA graph, with no Python and about a microsecond per launch. The model predicts its
  step at GPU busy + kernels × graph launch cost.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

import torch

from ..decode.registry import make_decoder
from ..config import ModelConfig
from ..model import HybridLM, build
from .profile import StepProfile, profile_decode
from .timing import measure


@dataclass(frozen=True)
class TimeSplit:
    """One step's wall time in three measured parts that sum to it (milliseconds)."""

    step_ms: float
    gpu_busy_ms: float
    launch_ms: float
    python_ms: float

    def parts(self) -> dict[str, float]:
        return {"GPU busy (kernels)": self.gpu_busy_ms, "launching (kernels × launch cost)": self.launch_ms,
                "Python and dispatcher (the rest)": self.python_ms}

    def shares(self) -> dict[str, float]:
        return {k: v / self.step_ms for k, v in self.parts().items()}


def split_step_time(step_ms: float, busy_ms: float, kernels: float, launch_us: float) -> TimeSplit:
    """Split a host-bound step: GPU busy, ``kernels`` × ``launch_us`` of launching, and the rest.

    Raises ValueError for non-finite or negative inputs, a step of no time, a GPU busy longer than
    the step (profile and step from different runs), or kernels plus launches longer than the step:
    then launching overlaps kernel time, the step is not host-bound, and this split does not apply.
    """
    values = {"step_ms": step_ms, "busy_ms": busy_ms, "kernels": kernels, "launch_us": launch_us}
    for name, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if step_ms <= 0:
        raise ValueError("step_ms must be > 0")
    if busy_ms > step_ms:
        raise ValueError(f"the GPU was busy {busy_ms:.3f} ms in a {step_ms:.3f} ms step: the profile and the "
                         "step time come from different runs")
    launch_ms = kernels * launch_us / 1e3
    rest = step_ms - busy_ms - launch_ms
    if rest < 0:
        raise ValueError(
            f"kernels ({busy_ms:.3f} ms) plus launches ({kernels:.0f} x {launch_us:.2f} µs = {launch_ms:.3f} ms) exceed "
            f"the {step_ms:.3f} ms step: launching overlaps kernel time, so the step is not host-bound and "
            "this split does not apply"
        )
    return TimeSplit(step_ms, busy_ms, launch_ms, rest)


def trivial_twin(cfg: ModelConfig) -> ModelConfig:
    """``cfg``'s layers, ops and options at tiny widths: the same Python and the same kernel count
    per step, with kernels that do almost nothing."""
    return dataclasses.replace(
        cfg, name=f"{cfg.name}-trivial", vocab_size=256, hidden_size=64, intermediate_size=64,
        head_dim=16, rotary_dim=16 if cfg.rotary_dim == cfg.head_dim else 8,
        gdn_k_head_dim=16 if cfg.gdn_k_head_dim else 0, gdn_v_head_dim=16 if cfg.gdn_v_head_dim else 0,
    )


@dataclass
class Diagnosis:
    """The measured split of one (model, batch) reference step, and the experiments that test it."""

    model: str
    batch: int
    context: int
    step_ms: float  # reference, no profiler
    profiled_step_ms: float  # the same steps under the profiler, interleaved
    kernels: float | None
    gpu_busy_ms: float | None
    launch_us: float | None  # per minimal launch, eager (hw.measure_launch_overhead)
    graph_launch_us: float | None  # per launch replayed from a CUDA graph
    launch_ms: float | None
    python_ms: float | None
    twin_step_ms: float  # the trivial-work twin, no profiler
    twin_kernels: float | None
    twin_busy_ms: float | None
    graph_step_ms: float | None = None  # "reference+graph", measured
    graph_predicted_ms: float | None = None  # gpu_busy_ms + kernels * graph_launch_us
    graph_rel_err: float | None = None  # logits vs the eager reference, worst step
    graph_tokens_match: bool | None = None
    launch_api_us: float | None = None  # cudaLaunchKernel as the profiler saw it
    bytes_per_step: int = 0
    split_error: str | None = None  # why the step could not be split (split_step_time's message)
    tensor_core_share: float | None = None  # of the device time
    kernel_median_us: float | None = None  # median kernel duration
    bench_runs_ms: list = field(default_factory=list)
    profiled_runs_ms: list = field(default_factory=list)
    family_ms: dict = field(default_factory=dict)  # device ms per op family (CPU ms on a CPU)
    timeline: list = field(default_factory=list)  # one step: [family, start µs, duration µs] per kernel
    fresh_step_ms: float | None = None  # a step at a length the process never ran, no profiler
    fresh_gap_ms: float | None = None  # the longest gap between kernels of a profiled fresh step
    fresh_gap_kernel: str | None = None  # the kernel after that gap

    @property
    def profiler_overhead(self) -> float:
        return self.profiled_step_ms / self.step_ms

    def split(self) -> TimeSplit | None:
        if self.python_ms is None:
            return None
        return TimeSplit(self.step_ms, self.gpu_busy_ms, self.launch_ms, self.python_ms)


@torch.no_grad()
def graph_parity(model: HybridLM, batch: int, context: int, steps: int = 4) -> tuple[float, bool]:
    """(worst relative error of the logits, whether every greedy token agrees) of ``"reference+graph"``
    against the eager reference over ``steps`` decode steps, both fed the reference's tokens."""
    ids = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(1))
    ids = ids.to(model.device)
    eager = make_decoder("reference", model, model.new_cache(batch, context + steps + 1))
    graph = make_decoder("reference+graph", model, model.new_cache(batch, context + steps + 1))
    token = eager.prefill(ids).argmax(-1)
    graph.prefill(ids)
    worst, same = 0.0, True
    for _ in range(steps):
        want = eager.step(token).float()
        got = graph.step(token).float()
        if not torch.isfinite(got).all():
            return math.inf, False
        worst = max(worst, ((got - want).norm() / want.norm()).item())
        same &= bool(torch.equal(got.argmax(-1), want.argmax(-1)))
        token = want.argmax(-1)
    return worst, same


@torch.no_grad()
def time_steps(model: HybridLM, backend: str, batch: int, context: int, steps: int, repeats: int) -> float:
    """Median ms per greedy step of ``backend`` (steps issued back to back, as in profile_decode)."""
    decoder = make_decoder(backend, model, model.new_cache(batch, context + (repeats + 2) * steps + 1))
    ids = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    greedy = decoder.step_greedy
    last = {"token": decoder.prefill(ids.to(model.device)).argmax(-1)}

    def run() -> None:
        for _ in range(steps):
            last["token"] = greedy(last["token"])

    return measure(run, device=model.device, graph=False, warmup=1, repeats=repeats).ms / steps


def diagnose(model: HybridLM, batch: int, launch: dict[str, float], context: int = 128, steps: int = 5,
             rounds: int = 3, graph: bool = True, twin_rounds: int | None = None) -> tuple[Diagnosis, StepProfile]:
    """Profile the reference step (interleaved with its benchmark), split its time, and run the two
    tests of the split: the trivial-work twin and, on a GPU (with ``graph``), the reference replayed
    from a CUDA graph (:func:`graph_experiment`). ``launch``: :func:`labkit.lab.hw.measure_launch_overhead`'s
    result on this device."""
    prof = profile_decode(model, "reference", batch, context, steps, rounds=rounds)
    twin_model = build(trivial_twin(model.cfg), dtype=model.dtype, device=model.device)
    twin = profile_decode(twin_model, "reference", batch, context, steps, rounds=twin_rounds or rounds, fresh_steps=0)
    cuda = model.device.type == "cuda"
    split, split_error = None, None
    if cuda:
        try:
            split = split_step_time(prof.step_ms, prof.busy_ms, prof.kernels_per_step, launch["eager_us"])
        except ValueError as exc:  # recorded, and the notebook asserts there is none
            split_error = str(exc)
    d = Diagnosis(
        model=model.cfg.name, batch=batch, context=context, step_ms=prof.step_ms,
        profiled_step_ms=prof.profiled_step_ms, kernels=prof.kernels_per_step, gpu_busy_ms=prof.busy_ms,
        launch_us=launch.get("eager_us"), graph_launch_us=launch.get("graph_us"),
        launch_ms=split.launch_ms if split else None, python_ms=split.python_ms if split else None,
        twin_step_ms=twin.step_ms, twin_kernels=twin.kernels_per_step, twin_busy_ms=twin.busy_ms,
        launch_api_us=prof.launch_api_us, bytes_per_step=prof.bytes_per_step, split_error=split_error,
        tensor_core_share=prof.tensor_core_share, bench_runs_ms=prof.bench_runs_ms,
        profiled_runs_ms=prof.profiled_runs_ms, family_ms=prof.family_ms,
        timeline=[[s.family, round(s.start_us, 3), round(s.dur_us, 3)] for s in prof.timeline],
        fresh_step_ms=prof.fresh_step_ms, fresh_gap_ms=prof.fresh_gap_ms, fresh_gap_kernel=prof.fresh_gap_kernel,
    )
    if prof.timeline:
        d.kernel_median_us = statistics.median(s.dur_us for s in prof.timeline)
    if cuda and graph:
        graph_experiment(d, model, steps, rounds)
    return d, prof


def graph_experiment(d: Diagnosis, model: HybridLM, steps: int = 5, rounds: int = 3) -> Diagnosis:
    """Fill in ``d``'s decisive experiment: the reference step replayed from a CUDA graph, timed as the
    eager one is, predicted at GPU busy + kernels x graph launch cost, and checked against eager."""
    d.graph_step_ms = time_steps(model, "reference+graph", d.batch, d.context, 4 * steps, rounds)
    d.graph_predicted_ms = d.gpu_busy_ms + d.kernels * d.graph_launch_us / 1e3
    d.graph_rel_err, d.graph_tokens_match = graph_parity(model, d.batch, d.context)
    return d
