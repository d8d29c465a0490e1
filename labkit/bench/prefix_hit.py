"""A prefix-cache hit, measured two ways (``python -m labkit bench hit-timeline | hit-host``).

The case is the TTFT bench's (``bench cache --ttft-cases 4096:64:256``): one prompt of ``prefix``
cached tokens + a ``tail`` of new ones, batch 1, a :class:`labkit.PrefixCache` of ``block_size``
blocks holding the prefix after one miss; two warm-up hits come first (with ``fused+graph`` the first
runs the tail eagerly and the second captures its prefill: the tail shape's ``capture_at``).
Defaults: Qwen3.5-0.8B bf16 (random weights), ``fused+graph``, 4,096 + 64 tokens, block 256 on a GPU; tiny-qwen3.5 float32, ``reference``, on a CPU (a smoke run).

- ``hit-timeline``: each hit's wall time (``PrefixCache.prefill``, device synchronised before and
  after), the device time of every kernel and copy the hit runs (``torch.profiler``, graph kernels
  included: wall minus busy is time the GPU waited for the host), and the tail alone
  (``prefill_continuation`` between two CUDA events: the input copy and the graph replay).
- ``hit-host``: the host side. The whole hit with its real tail, and with the tail stubbed out (a
  constant: what a hit costs the host when the tail is a queued graph replay); the restore's copies
  alone (the hit's span table, which the stubbed hit runs too); the pieces reachable through the
  public API timed alone (the weights key, the look-up, the tail's prefill); Python
  calls counted (cProfile), and the stubbed hit's time per labkit function (cProfile's cumulative
  time, the profiler's own overhead included: read it as shares, not as figures); and the hit's
  last-token logits against the whole prompt with no cache.

Both write ``data/bench/<gpu>/<name>.json`` (kind ``profile``) with their provenance.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shlex
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from ..decode.protocol import Decoder
from ..decode.registry import make_decoder, pooled_decoder
from ..lab import workloads as wl
from ..model import HybridLM, build
from ..prefix_cache import PrefixCache
from ..weights import weights_key


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed_ms(f, n: int, device: str) -> float:
    """Median milliseconds of ``f(i)`` over ``n`` calls, the device synchronised around each."""
    ts = []
    for i in range(n):
        _sync(device)
        t0 = time.perf_counter()
        f(i)
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def _calls(f) -> int:
    """Python calls (cProfile's count, C functions called from Python included) of one ``f()``."""
    pr = cProfile.Profile()
    pr.enable()
    f()
    pr.disable()
    return pstats.Stats(pr).total_calls


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


class _HostOnly(Decoder):
    """A decoder whose tail is a constant: ``PrefixCache.prefill``'s host side alone, as a replayed
    continuation graph leaves it (its launches are queued, not waited for). Everything else is the
    real decoder's."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__(decoder.model, decoder.cache)
        self._decoder = decoder
        self.checkpoint_multiple = decoder.checkpoint_multiple
        self._logits = torch.zeros(1, decoder.model.cfg.vocab_size, device=decoder.model.device)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._decoder.prefill(input_ids)

    def prefill_checked(self, input_ids: torch.Tensor, **checked) -> torch.Tensor:
        return self._decoder.prefill_checked(input_ids, **checked)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._decoder.step(tokens)

    def prefill_cores(self, checkpoint_every=None, checkpoints=None):
        return self._decoder.prefill_cores(checkpoint_every, checkpoints)

    def prefill_continuation(self, input_ids: torch.Tensor, *, before=None, **_) -> torch.Tensor:
        if before is not None:
            before()  # the restore's launches (queued, as in the real tail's graph)
        self._decoder.cache.advance_host(input_ids.shape[1])
        return self._logits


def hit_timeline(model: HybridLM, backend: str, prefix: int, tail: int, block_size: int, hits: int) -> dict:
    """The ``hit-timeline`` figures (see the module's docstring) of ``hits`` timed hits."""
    device = str(model.device)
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(0, model.cfg.vocab_size, (1, prefix), generator=gen)
    prompts = [torch.cat([shared, torch.randint(0, model.cfg.vocab_size, (1, tail), generator=gen)], 1).to(device)
               for _ in range(hits + 3)]
    dec, cache = pooled_decoder(backend, model, 1, prefix + tail + 8)
    pc = PrefixCache(model, block_size, budget_bytes=2**40)
    pc.prefill(dec, prompts[0])  # the miss: stores the snapshots
    for p in prompts[1:3]:
        pc.prefill(dec, p)  # the first hit compiles, the second captures the tail's graph
    wall = []
    for p in prompts[3:]:
        _sync(device)
        t0 = time.perf_counter()
        hit = pc.prefill(dec, p)
        _sync(device)
        wall.append(time.perf_counter() - t0)
    if hit.restored != prefix // block_size * block_size:
        raise RuntimeError(f"a hit restored {hit.restored} tokens, expected {prefix // block_size * block_size}")

    cuda = device.startswith("cuda")
    profiled = prompts[3:6]
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for p in profiled:
            pc.prefill(dec, p)
        _sync(device)
    by: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name][0] += 1
            by[e.name][1] += e.device_time_total / len(profiled)
    rows = sorted(((k, n // len(profiled), us) for k, (n, us) in by.items()), key=lambda r: -r[2])

    tail_ms = []
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ids = prompts[-1][:, prefix:]
        for _ in range(20):
            cache.reset(zero=False)
            cache.advance(prefix)  # the restore's lengths: the replay reads and advances them
            a.record()
            dec.prefill_continuation(ids, ids_checked=True)
            b.record()
            b.synchronize()
            tail_ms.append(a.elapsed_time(b))
    return {"model": model.cfg.name, "backend": backend, "prefix": prefix, "tail": tail, "block_size": block_size,
            "hit_wall_ms": [w * 1e3 for w in wall], "hit_wall_median_ms": statistics.median(wall) * 1e3,
            "busy_us_per_hit": sum(r[2] for r in rows), "kernels_per_hit": sum(r[1] for r in rows),
            "tail_continuation_median_ms": statistics.median(tail_ms) if tail_ms else None, "rows": rows}


def _labkit_functions(stats: pstats.Stats, per: int, top: int = 25) -> list[dict]:
    """labkit's functions in a cProfile run of ``per`` hits, by cumulative time: ms and calls per hit."""
    out = []
    for (filename, line, name), (_, calls, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        parts = Path(filename).parts
        if "labkit" not in parts:
            continue
        where = "/".join(parts[len(parts) - parts[::-1].index("labkit") - 1:])
        out.append({"function": f"{where}:{line}({name})", "calls_per_hit": calls / per,
                    "cumulative_ms_per_hit": cumulative * 1e3 / per})
    return sorted(out, key=lambda r: -r["cumulative_ms_per_hit"])[:top]


def hit_host(model: HybridLM, backend: str, prefix: int, tail: int, block_size: int, reps: int) -> dict:
    """The ``hit-host`` figures (see the module's docstring), medians of ``reps`` calls."""
    device = str(model.device)
    reqs = wl.shared_prefix(reps + 3, prefix, tail, model.cfg.vocab_size, seed=prefix + tail)
    ids = [torch.tensor(r.tokens, dtype=torch.int64, device=device)[None] for r in reqs]
    pc = PrefixCache(model, block_size, budget_bytes=2**40)
    dec = make_decoder(backend, model, model.new_cache(1, prefix + tail + 8))
    pc.prefill(dec, ids[0])  # the miss that stores the snapshots
    for i in range(1, 3):
        pc.prefill(dec, ids[i])  # hits: compile, capture, make the plans
    _sync(device)
    host_only = _HostOnly(dec)
    doc: dict = {"model": model.cfg.name, "dtype": str(model.dtype), "backend": backend, "prefix": prefix,
                 "suffix": tail, "block": block_size, "reps": reps}
    row = lambda i: ids[i % len(ids)]  # noqa: E731
    doc["hit: pc.prefill, real tail (ms)"] = _timed_ms(lambda i: pc.prefill(dec, row(i)), reps, device)
    doc["hit: pc.prefill, tail stubbed = host side (ms)"] = _timed_ms(lambda i: pc.prefill(host_only, row(i)), reps,
                                                                      device)
    doc["weights_key (ms)"] = _timed_ms(lambda i: weights_key(model), reps, device)
    doc["lookup: pc.lookup(row) (ms)"] = _timed_ms(lambda i: pc.lookup(row(i)[0]), reps, device)
    cache, tail_ids = dec.cache, ids[1][:, prefix:]
    # the restore alone: the span table of the hits' plan (made by the hits above; reached through
    # the cache's private plan table, as no public call runs a restore without its tail), run by
    # itself. The stubbed hit above runs it too (as _HostOnly runs ``before``): the host side is
    # that less this
    from ..prefix_cache import _Restore

    plan = next(reversed(cache.attachments[pc._plans_key].plans.values()))
    restore = _Restore(cache, plan, prefix // block_size * block_size)
    restore.stage()
    doc["restore: the copies (ms)"] = _timed_ms(lambda i: restore(), reps, device)

    def run_tail(i: int) -> None:
        cache.reset(zero=False)
        cache.advance(prefix)
        dec.prefill_continuation(tail_ids, ids_checked=True)  # the reference's default: its prefill

    doc[f"tail prefill ({tail} tokens) (ms)"] = _timed_ms(run_tail, min(reps, 10), device)
    doc["python calls: hit, tail stubbed"] = _calls(lambda: pc.prefill(host_only, ids[3]))
    doc["python calls: weights_key"] = _calls(lambda: weights_key(model))
    doc["python calls: lookup"] = _calls(lambda: pc.lookup(ids[3][0]))
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(reps):
        pc.prefill(host_only, row(i))
    _sync(device)
    profiler.disable()
    doc["host side by function (cProfile, its overhead included)"] = _labkit_functions(pstats.Stats(profiler), reps)
    # exactness of the measured hit: the same last-token logits as the whole prompt with no cache
    cache.reset()
    whole = dec.prefill(ids[4]).float().clone()
    doc["hit vs no cache: rel err of last logits"] = _rel(pc.prefill(dec, ids[4]).logits, whole)
    return doc


# what both prefix-cache benches (hit-timeline / hit-host here, miss-timeline in prefix_miss) take
# and fill alike: the preset, backend and dtype, on a GPU the real case and on a CPU a smoke run
CASE_DEFAULTS = (("model", "qwen3.5-0.8b", "tiny-qwen3.5"), ("backend", "fused+graph", "reference"),
                 ("dtype", "bfloat16", "float32"), ("block_size", 256, 16))


def case_parser(what: str, description: str | None) -> argparse.ArgumentParser:
    """The options every prefix-cache bench takes (its own are added by the caller)."""
    from ..config import PRESETS
    from .cli import positive_int, results_name
    from .results import DATA_DIR

    p = argparse.ArgumentParser(prog=f"labkit bench {what}", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS), help="a preset, random weights (default: see above)")
    p.add_argument("--backend", help="a labkit backend (default fused+graph on a GPU, reference on a CPU)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"])
    p.add_argument("--block-size", type=positive_int, help="the PrefixCache's block (default 256 on a GPU)")
    p.add_argument("--paths-off", nargs="+", default=[], metavar="PATH",
                   help="switch these fast paths of the fused prefill off for the run "
                        "(labkit.decode.fused_prefill.FAST_PATHS)")
    p.add_argument("--device", default="auto")
    p.add_argument("--name", type=results_name, default=what, help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    return p


def case_arguments(p: argparse.ArgumentParser, argv: list[str], defaults: tuple = ()) -> argparse.Namespace:
    """``argv`` parsed, with what was not given filled (:data:`CASE_DEFAULTS`, then ``defaults``:
    (name, on a GPU, on a CPU) each) and, on a CPU, the interpreter's environment set."""
    from ..decode.fused_prefill import FAST_PATHS

    args = p.parse_args(argv)
    unknown = [name for name in args.paths_off if name not in FAST_PATHS]
    if unknown:
        p.error(f"argument --paths-off: unknown path {unknown[0]!r}; choose from {', '.join(FAST_PATHS)}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device.startswith("cuda")
    for name, gpu, cpu in (*CASE_DEFAULTS, *defaults):
        if getattr(args, name) is None:
            setattr(args, name, gpu if cuda else cpu)
    if not cuda:
        from ..lab.notebooks import cpu_environment

        cpu_environment()
    return args


def case_model(args: argparse.Namespace) -> HybridLM:
    return build(args.model, dtype=getattr(torch, args.dtype), device=args.device, seed=0)


def write_case(args: argparse.Namespace, what: str, argv: list[str], doc: dict) -> None:
    """``doc`` to data/bench/<gpu>/<args.name>.json (kind ``profile``) with the command that made it."""
    from ..lab.hw import device_facts
    from .results import write_document

    command = shlex.join(["python", "-m", "labkit", "bench", what, *argv])
    path = write_document(args.name, "profile", doc, device_facts(args.device, measure=False), command=command,
                          data_dir=args.data_dir)
    print(f"wrote {path}")


def main(argv: list[str], what: str) -> int:
    """``python -m labkit bench hit-timeline|hit-host [options]``."""
    from .cli import positive_int
    from .prefill_profile import paths_switched_off

    p = case_parser(what, __doc__)
    p.add_argument("--prefix", type=positive_int, help="cached tokens (default 4096 on a GPU)")
    p.add_argument("--tail", type=positive_int, help="new tokens after them (default 64 on a GPU)")
    count = ("hits", 10, "timed hits") if what == "hit-timeline" else ("reps", 50, "calls timed per piece (median)")
    p.add_argument(f"--{count[0]}", type=positive_int, default=count[1], help=count[2])
    args = case_arguments(p, argv, (("prefix", 4096, 48), ("tail", 64, 5)))
    if args.prefix < args.block_size:
        p.error(f"argument --prefix: {args.prefix} is shorter than one block (--block-size {args.block_size}): "
                "nothing would be cached")
    model = case_model(args)
    measure = hit_timeline if what == "hit-timeline" else hit_host
    with paths_switched_off(tuple(args.paths_off)):
        doc = measure(model, args.backend, args.prefix, args.tail, args.block_size, getattr(args, count[0]))
    for k, v in doc.items():
        if k != "rows" and not isinstance(v, list):
            print(f"{k:55s} {v:.4f}" if isinstance(v, float) else f"{k:55s} {v}")
    for r in doc.get("rows", [])[:25]:
        print(f"{r[2]:9.1f} us  x{r[1]:<4d} {r[0][:110]}")
    for r in doc.get("host side by function (cProfile, its overhead included)", [])[:12]:
        print(f"{r['cumulative_ms_per_hit']:8.3f} ms x{r['calls_per_hit']:<5g} {r['function']}")
    write_case(args, what, argv, doc)
    return 0
