"""A prefix-cache miss against no cache, on the clock and on the device
(``python -m labkit bench miss-timeline``).

The case is the TTFT bench's steady miss (``bench cache --experiments ttft``): prompts of
``tokens`` tokens that share nothing, each through ``generate(..., max_new_tokens=1)`` with a
:class:`labkit.PrefixCache` whose budget holds one prompt's snapshots (so that every miss stores
its own and evicts the last one's), against the same prompts with no cache. Both pay their
compiles and captures first (warm-up calls). Then, for each:

- the time to first token as ``generate`` reports it (``ttft_s``), the median of ``repeats`` calls,
  the two taken in turns (a call with no cache, then a miss, ...), all before any profile, so that
  neither drift nor whatever a profiler session leaves behind in the process falls on one side only
  (until 2026-12-06 each side was timed in a block, the misses after the no-cache profile: 1.32x /
  1.53x for the reference backend's misses of tiny-qwen3.5 / tiny-lfm2 at 1,024 tokens on one H100
  machine; in turns, 1.23x / 1.22x on another; the order and the machine were not separated);
- one more call under ``torch.profiler`` (host calls and device kernels): how long the device was
  busy and with how many kernels, when its first kernel started after the call began (host work
  the device waited for), and its idle stretches with the host calls that overlap them (what it
  waited for: a synchronisation, a copy from the host, launches), longest first.

A miss costs more than no cache by its extra kernels (the snapshots' copies, the boundary states)
and by the host work the device waits for; this separates the two. Writes
``data/bench/<gpu>/<name>.json`` (kind ``profile``) with its provenance. Defaults: Qwen3.5-0.8B bf16
(random weights), ``fused+graph``, 4,160 tokens, block 256 on a GPU; tiny-qwen3.5 float32,
``reference``, on a CPU (a smoke run: no device kernels).
"""

from __future__ import annotations

import statistics

import torch

from ..generate import _sync, generate
from ..lab import workloads as wl
from ..model import HybridLM
from ..prefix_cache import PrefixCache

IDLE_US = 5.0  # shorter idle stretches between kernels are launch gaps inside a graph, not waits
HOST_CALLS_PER_GAP = 6


def timeline(events: list[tuple[str, bool, float, float]], gaps: int = 12) -> dict:
    """The figures of one profiled call from its events ``(name, on_device, start_us, end_us)``: the
    call's span (first host event to last event); the device's busy time (the union of its work)
    and how many device operations ran (kernels, copies, memsets, as hit-timeline counts them);
    when the first one started; and the ``gaps`` longest idle stretches of the device (at least
    ``IDLE_US``, from the call's start to its last operation) with the host calls overlapping each,
    by overlap."""
    from ..lab.profile import merged_spans

    host = [e for e in events if not e[1]]
    device = [e for e in events if e[1]]
    if not host:
        raise ValueError("no host events: nothing was profiled")
    start, end = min(e[2] for e in host), max(e[3] for e in events)
    busy = merged_spans([(e[2], e[3]) for e in device])
    idle, prev = [], start
    for a, b in busy:
        if a - prev >= IDLE_US:
            idle.append((prev, a))
        prev = max(prev, b)
    rows = []
    for a, b in sorted(idle, key=lambda g: g[0] - g[1])[:gaps]:
        overlap: dict[str, float] = {}
        for name, _, s, e in host:
            if s < b and e > a:
                overlap[name] = overlap.get(name, 0.0) + min(b, e) - max(a, s)
        calls = sorted(overlap.items(), key=lambda kv: -kv[1])[:HOST_CALLS_PER_GAP]
        rows.append({"at_ms": (a - start) / 1e3, "us": b - a, "host": [[n, round(us, 1)] for n, us in calls]})
    return {"span_ms": (end - start) / 1e3, "busy_ms": sum(b - a for a, b in busy) / 1e3, "kernels": len(device),
            "first_kernel_ms": (busy[0][0] - start) / 1e3 if busy else None,
            "idle_ms": sum(b - a for a, b in idle) / 1e3, "idle_stretches": len(idle), "longest_idle": rows}


CALL = "miss-timeline: the call"  # the profiled range of the call itself


def _profiled(fn, device: torch.device) -> list[tuple[str, bool, float, float]]:
    """``fn``'s host calls and device work under the profiler, from the call's start. The
    profiler's first device activity allocates its buffers ("Activity Buffer Request", 2-3 ms on
    the H100 machine, inside whichever op launched it): a small op runs before the call, so that
    this lands outside it. Kineto mirrors ``record_function`` ranges onto the device timeline,
    where they would count as busy: those are left out."""
    from ..lab.profile import _profiling  # torch.profiler without kineto's start/stop lines on stderr

    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    _sync(device)
    with _profiling(activities) as prof:
        torch.ones(1, device=device).add_(1)
        _sync(device)
        with torch.profiler.record_function(CALL):
            fn()
            _sync(device)
    on_device = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.events() if not (e.device_type == on_device and getattr(e, "is_user_annotation", False))]
    start = min(e.time_range.start for e in events if e.name == CALL)
    return [(e.name, e.device_type == on_device, e.time_range.start, e.time_range.end) for e in events
            if e.name != CALL and e.time_range.start >= start]


def miss_timeline(model: HybridLM, backend: str, tokens: int, block_size: int, repeats: int) -> dict:
    """The ``miss-timeline`` figures (module docstring) of prompts of ``tokens`` tokens."""
    device = model.device
    prompts = [torch.tensor([list(r.tokens)], dtype=torch.int64, device=device)
               for r in wl.unrelated(2 * repeats + 6, tokens, model.cfg.vocab_size, seed=tokens)]
    need = tokens // block_size + 1
    cache = PrefixCache(model, block_size, need * PrefixCache(model, block_size, 2**62).snapshot_bytes)
    runs = {"no cache": lambda ids: generate(model, ids, 1, backend=backend),
            "steady miss": lambda ids: generate(model, ids, 1, backend=backend, prefix_cache=cache)}
    doc: dict = {"model": model.cfg.name, "dtype": str(model.dtype).removeprefix("torch."), "backend": backend,
                 "tokens": tokens, "block_size": block_size, "repeats": repeats}
    for i in range(3):  # compiles and captures: the prefill's graph, the miss's reading graph
        for run in runs.values():
            run(prompts[i])
    ttft: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeats):  # in turns, and before any profile (module docstring)
        for k, (name, run) in enumerate(runs.items()):
            out = run(prompts[3 + 2 * i + k])
            if out.prefix_hit:
                raise RuntimeError("an unrelated prompt hit the cache: the misses are not misses")
            ttft[name].append(out.ttft_s * 1e3)
    for k, (name, run) in enumerate(runs.items()):
        doc[name] = {"ttft_ms": ttft[name], "ttft_median_ms": statistics.median(ttft[name]),
                     **timeline(_profiled(lambda: run(prompts[3 + 2 * repeats + k]), device))}
    doc["miss / no cache (ttft medians)"] = doc["steady miss"]["ttft_median_ms"] / doc["no cache"]["ttft_median_ms"]
    return doc


def main(argv: list[str]) -> int:
    """``python -m labkit bench miss-timeline [options]``."""
    from .cli import positive_int
    from .prefix_hit import case_arguments, case_model, case_parser, write_case

    p = case_parser("miss-timeline", __doc__)
    p.add_argument("--tokens", type=positive_int, help="tokens per prompt (default 4160 on a GPU)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed calls of each (median)")
    args = case_arguments(p, argv, (("tokens", 4160, 37),))
    if args.tokens < args.block_size:
        p.error(f"argument --tokens: {args.tokens} is shorter than one block (--block-size {args.block_size}): "
                "a miss would store nothing")
    from .prefill_profile import paths_switched_off

    with paths_switched_off(tuple(args.paths_off)):
        doc = miss_timeline(case_model(args), args.backend, args.tokens, args.block_size, args.repeats)
    for name in ("no cache", "steady miss"):
        d = doc[name]
        first = "-" if d["first_kernel_ms"] is None else f"{d['first_kernel_ms']:.3f}"
        print(f"{name:12s} TTFT {d['ttft_median_ms']:8.3f} ms | profiled {d['span_ms']:.3f} ms: busy {d['busy_ms']:.3f}, "
              f"{d['kernels']} kernels, first kernel at {first}, idle {d['idle_ms']:.3f} ms in {d['idle_stretches']}")
        for g in d["longest_idle"][:6]:
            print(f"    idle {g['us']:7.1f} us at {g['at_ms']:7.3f} ms: " + ", ".join(f"{n[:40]} {us:.0f}" for n, us in g["host"]))
    print(f"miss / no cache: {doc['miss / no cache (ttft medians)']:.3f}x")
    write_case(args, "miss-timeline", argv, doc)
    return 0
