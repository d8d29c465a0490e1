"""``python -m labkit bench cache``: the exact prefix cache measured, into data/bench/<gpu>/<name>.json.

Three experiments, each row checked against the run without a prefix cache:

- ``ttft``: one shared prefix + a fresh suffix per request, batch 1. Time to first token as
  ``labkit.generate`` reports it (host clock, device synchronised, prefill + first token) without a
  prefix cache, on the first request (a miss that stores the snapshots), on the first hit (with
  ``fused+graph``: the tail eagerly; the second hit captures its prefill), on the hits after the
  second (median) and on later misses (median,
  prompts of the same length that share nothing); the greedy tokens of every hit are compared with
  the run without a cache. A prefix shorter than one block is one of the cases. ``--warm-up``: the
  first call's compiles and captures are paid at ``PrefixCache(..., warm_up=decoder)``, timed apart.
- ``workload``: the request streams of :mod:`labkit.lab.workloads` (shared system prompt, multi-turn
  chats, unrelated prompts) run in order through one PrefixCache per (policy, budget): token hit
  rate, the ceiling an unbounded cache would reach, TTFT, evictions, token mismatches.
- ``precision``: a bf16 snapshot of the GDN states against float32 (:mod:`labkit.lab.snapshot_precision`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from ..lab import workloads as wl
from ..decode.registry import pooled_decoder
from ..generate import _sync, generate
from ..model import HybridLM
from ..ops.spans import Spans
from ..prefix_cache import PrefixCache
from ..lab.snapshot_precision import snapshot_precision


@dataclass
class TtftRow:
    experiment: str
    model: str
    backend: str
    block_size: int
    prefix: int
    suffix: int
    restored: int  # tokens a hit restored
    ttft_nocache_ms: float
    ttft_miss_ms: float  # the first request: nothing to restore, snapshots stored
    ttft_first_hit_ms: float
    ttft_hit_ms: float  # median of the later hits
    hit_prefill_ms: float  # PrefixCache.prefill alone on a hit (restore + the tail), median, synchronised
    # last-token logits against the one-shot prefill of the whole prompt (relative): with a hit, and
    # without a cache but prefilled in the same two pieces (prefix, then the rest): the rounding of
    # the split alone, what a hit cannot do better than
    logit_err_hit: float
    logit_err_split: float
    speedup: float  # no cache / hit
    mismatches: int  # hits whose greedy tokens differ from the run without a cache
    hits: int
    snapshots: int
    snapshot_bytes: int  # bytes the cache holds after the run
    error: str | None = None
    dtype: str = ""  # the model's: bf16 rounding can flip near-tied greedy tokens that float32 keeps
    # --warm-up: PrefixCache(..., warm_up=decoder) before the first request (its compiles and captures,
    # paid once), NaN without; the miss's steady state: the median of ``repeats`` later misses (prompts
    # of the same length sharing nothing) through a PrefixCache of their own, beside ttft_nocache_ms
    warm_up_ms: float = float("nan")
    ttft_miss_steady_ms: float = float("nan")
    miss_over_nocache: float = float("nan")  # ttft_miss_steady_ms / ttft_nocache_ms (the target: <= 1.1)
    # generate's set-up before its TTFT timing starts (the arguments' checks, one read of the ids to the
    # host; the pooled decoder fetched, its weights key taken): medians, without the cache and on hits.
    # A user's call is set-up + TTFT (+ the decode steps)
    setup_nocache_ms: float = float("nan")
    setup_hit_ms: float = float("nan")
    # the user's ratio: (set-up + TTFT) without the cache over (set-up + TTFT) on a hit
    speedup_with_setup: float = float("nan")


@dataclass
class WorkloadRow:
    experiment: str
    model: str
    backend: str
    workload: str
    policy: str  # eviction policy, "+ends" for Marconi-style admission (labkit.PrefixCache's admission)
    budget_bytes: int
    budget_snapshots: float  # the budget in snapshots of one block
    block_size: int
    requests: int
    prompt_tokens: int
    restored_tokens: int
    hit_rate: float  # restored / prompt tokens
    ceiling_hit_rate: float  # what an unbounded cache restores on this stream
    requests_hit: int
    ttft_ms_median: float
    ttft_ms_p95: float
    ttft_nocache_ms_median: float  # the same requests without the cache, each timed right before it
    evictions: int
    mismatches: int  # requests whose greedy tokens differ from the run without a cache
    error: str | None = None
    # the median over requests of each one's TTFT with the cache over its TTFT without, timed back to back:
    # what a request pays (or saves) for the cache, free of the drift between the stream's requests that
    # the ratio of the two medians keeps (each median may come from another request)
    ttft_ratio_median: float = float("nan")


@dataclass
class PrecisionRow:
    experiment: str
    model: str
    backend: str
    prompt: int
    steps: int
    dtype: str
    state_bytes_float32: int
    state_bytes_rounded: int
    rel_err: list[float] = field(default_factory=list)  # per decode step
    max_rel_err: float = 0.0
    argmax_agree: float = 0.0
    first_divergence: int | None = None
    error: str | None = None


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _ms(s: float) -> float:
    return s * 1e3


def _p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def _ids(tokens, device) -> torch.Tensor:
    return torch.tensor([list(tokens)], dtype=torch.long, device=device)


def time_ttft(model: HybridLM, backend: str, prefix: int, suffix: int, block_size: int, repeats: int = 5,
              new_tokens: int = 8, budget_bytes: int | None = None, warm_up: bool = False) -> TtftRow:
    """TTFT without a cache, with a miss (the first request and, steady, later misses) and with hits
    on a shared ``prefix`` (module docstring); ``warm_up``: the PrefixCache warms its decoder up at
    construction, timed apart."""
    vocab, device = model.cfg.vocab_size, model.device
    reqs = wl.shared_prefix(repeats + 3, prefix, suffix, vocab, seed=prefix + suffix)
    row = TtftRow("ttft", model.cfg.name, backend, block_size, prefix, suffix, 0, *[float("nan")] * 8, 0, 0, 0, 0,
                  dtype=str(model.dtype).removeprefix("torch."))
    try:
        generate(model, _ids(reqs[0].tokens, device), new_tokens, backend=backend)  # warm-up: compile, capture
        plain, want, setups = [], [], []
        for r in reqs:
            out = generate(model, _ids(r.tokens, device), new_tokens, backend=backend)
            plain.append(out.ttft_s)
            setups.append(out.setup_s)
            want.append(out.tokens)
        need = (prefix + suffix) // block_size + 1
        probe = PrefixCache(model, block_size, budget_bytes=2**62)
        budget = budget_bytes or need * probe.snapshot_bytes
        pooled, _ = pooled_decoder(backend, model, 1, prefix + suffix + new_tokens)  # the one generate leases
        pc = PrefixCache(model, block_size, budget, warm_up=pooled if warm_up else None)
        if warm_up:
            row.warm_up_ms = _ms(pc.warm_up_s)
        times, restored, mismatches, hits, hit_setups = [], 0, 0, 0, []
        for i, r in enumerate(reqs):
            out = generate(model, _ids(r.tokens, device), new_tokens, backend=backend, prefix_cache=pc)
            times.append(out.ttft_s)
            hit_setups.append(out.setup_s)
            restored = max(restored, out.prefix_hit)
            if i:
                hits += out.prefix_hit > 0
                mismatches += not torch.equal(out.tokens, want[i])
        row.restored, row.hits, row.mismatches = restored, hits, mismatches
        decoder, _ = pooled_decoder(backend, model, 1, prefix + suffix + new_tokens)
        alone = []
        for r in reqs[1:]:
            _sync(device)
            t0 = time.perf_counter()
            pc.prefill(decoder, _ids(r.tokens, device))
            _sync(device)
            alone.append(time.perf_counter() - t0)
        row.hit_prefill_ms = _ms(statistics.median(alone))
        ids = _ids(reqs[-1].tokens, device)
        decoder.cache.reset()
        whole = decoder.prefill(ids).float().clone()
        decoder.cache.reset()
        if restored:
            decoder.prefill(ids[:, :restored])
        split = decoder.prefill(ids[:, restored:]).float().clone()
        hit = pc.prefill(decoder, ids).logits.float()
        row.logit_err_hit, row.logit_err_split = _rel(hit, whole), _rel(split, whole)
        row.ttft_nocache_ms = _ms(statistics.median(plain[1:]))
        row.ttft_miss_ms, row.ttft_first_hit_ms = _ms(times[0]), _ms(times[1])
        # steady hits: the hits after the second (fused+graph captures the tail's graph at the second)
        row.ttft_hit_ms = _ms(statistics.median(times[3:]))
        row.setup_nocache_ms = _ms(statistics.median(setups[1:]))
        row.setup_hit_ms = _ms(statistics.median(hit_setups[3:]))
        row.speedup = row.ttft_nocache_ms / row.ttft_hit_ms
        row.speedup_with_setup = (row.setup_nocache_ms + row.ttft_nocache_ms) / (row.setup_hit_ms + row.ttft_hit_ms)
        row.snapshots, row.snapshot_bytes = len(pc), pc.nbytes
        fresh = PrefixCache(model, block_size, budget)
        misses = []
        for r in wl.unrelated(repeats, prefix + suffix, vocab, seed=prefix + suffix + 1):
            out = generate(model, _ids(r.tokens, device), new_tokens, backend=backend, prefix_cache=fresh)
            if out.prefix_hit:
                raise RuntimeError("an unrelated prompt hit: the steady misses are not misses")
            misses.append(out.ttft_s)
        row.ttft_miss_steady_ms = _ms(statistics.median(misses))
        row.miss_over_nocache = row.ttft_miss_steady_ms / row.ttft_nocache_ms
    except Exception as exc:  # noqa: BLE001 - a failed case is a row that says so
        row.error = f"{type(exc).__name__}: {exc}"
    return row


def workload_streams(vocab: int, scale: str) -> dict[str, list[wl.Request]]:
    """The three streams at ``scale`` "gpu" (thousands of tokens) or "cpu" (tens)."""
    if scale == "gpu":
        return {
            "shared-prefix": wl.shared_prefix(12, 2048, 64, vocab, seed=1),
            "multi-turn": wl.multi_turn(4, 4, 768, 128, 128, vocab, seed=2),
            "unrelated": wl.unrelated(8, 1024, vocab, seed=3),
        }
    return {
        "shared-prefix": wl.shared_prefix(5, 40, 5, vocab, seed=1),
        "multi-turn": wl.multi_turn(3, 3, 20, 6, 6, vocab, seed=2),
        "unrelated": wl.unrelated(4, 24, vocab, seed=3),
    }


def run_workload(model: HybridLM, backend: str, name: str, requests: list[wl.Request], block_size: int,
                 policies: list[str], budgets: list[float], new_tokens: int = 4) -> list[WorkloadRow]:
    """Every (policy, budget in snapshots) on one stream, each against the stream without a cache.

    A row's "no cache" TTFT is timed in the row's own pass, each request without the cache right
    before it with the cache: the two medians then share the machine's state (clocks, allocator,
    what else runs), which drifts over a stream by more than the 10% a miss may cost. Both sides
    come to the first row having run the stream once untimed (without the cache: the pass that
    gives the reference tokens; with it: a pass through a cache of the first row's policy and
    budget, then dropped), so that the first row, like the others, meets each prompt shape with its
    compiles and captures behind it (a ``fused+graph`` prefill is captured the second time its
    shape comes). Without the second warm pass, chapter 03's run at 4097232 had the first row of
    multi-turn at 1.87x no cache and every other row without hits at 1.04-1.05x."""
    device = model.device
    want = []
    generate(model, _ids(requests[0].tokens, device), new_tokens, backend=backend)  # warm-up
    for r in requests:
        want.append(generate(model, _ids(r.tokens, device), new_tokens, backend=backend).tokens)
    prompt_tokens = sum(len(r) for r in requests)
    ceiling = wl.reusable_tokens(requests, block_size) / prompt_tokens
    snap = PrefixCache(model, block_size, budget_bytes=2**62).snapshot_bytes
    evict, _, admission = policies[0].partition("+")
    warm = PrefixCache(model, block_size, int(budgets[0] * snap), policy=evict, admission=admission or "every")
    for r in requests:
        generate(model, _ids(r.tokens, device), new_tokens, backend=backend, prefix_cache=warm)
    del warm
    rows = []
    for budget in budgets:
        for policy in policies:
            row = WorkloadRow("workload", model.cfg.name, backend, name, policy, int(budget * snap), budget,
                              block_size, len(requests), prompt_tokens, 0, 0.0, ceiling, 0, *[float("nan")] * 3, 0, 0)
            try:
                evict, _, admission = policy.partition("+")
                pc = PrefixCache(model, block_size, row.budget_bytes, policy=evict, admission=admission or "every")
                times, plain = [], []
                for r, w in zip(requests, want):
                    ids = _ids(r.tokens, device)
                    plain.append(generate(model, ids, new_tokens, backend=backend).ttft_s)
                    out = generate(model, ids, new_tokens, backend=backend, prefix_cache=pc)
                    times.append(out.ttft_s)
                    row.restored_tokens += out.prefix_hit
                    row.requests_hit += out.prefix_hit > 0
                    row.mismatches += not torch.equal(out.tokens, w)
                row.hit_rate = row.restored_tokens / prompt_tokens
                row.ttft_ms_median, row.ttft_ms_p95 = _ms(statistics.median(times)), _ms(_p95(times))
                row.ttft_nocache_ms_median = _ms(statistics.median(plain))
                row.ttft_ratio_median = statistics.median(t / p for t, p in zip(times, plain))
                row.evictions = pc.evictions
            except Exception as exc:  # noqa: BLE001
                row.error = f"{type(exc).__name__}: {exc}"
            rows.append(row)
    return rows


def measure_exchange_rate(model: HybridLM, backend: str = "reference", tokens: int = 256, snapshots: int = 16,
                          repeats: int = 3) -> dict:
    """Admission "paying"'s exchange rate on this machine: the FLOPs per second of ``backend``'s
    prefill of ``tokens`` (counted as PrefixCache counts them, 2 x parameters per token) over the bytes
    per second of storing ``snapshots`` snapshots' states (one span table, as a miss stores them:
    :mod:`labkit.ops.copy_spans`). Medians of ``repeats``; the device is synchronised around each timing."""
    from ..decode.registry import make_decoder

    device = model.device
    decoder = make_decoder(backend, model, model.new_cache(1, tokens))
    ids = torch.randint(0, model.cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0)).to(device)
    states = [*decoder.cache.conv_states.values(), *decoder.cache.recurrent_states.values()]
    dst = [[torch.empty_like(t[0]) for t in states] for _ in range(snapshots)]
    src = [t[0] for t in states] * snapshots

    def timed(fn) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call compiles
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def prefill() -> None:
        decoder.cache.reset()
        decoder.prefill(ids)

    flops = 2 * model.num_parameters() * tokens / timed(prefill)
    nbytes = sum(t.numel() * t.element_size() for t in src)
    spans = Spans.of(list(zip(src, [d for row in dst for d in row])))
    copy_rate = nbytes / timed(spans.run)
    return {"flops_per_s": flops, "bytes_per_s": copy_rate, "exchange_rate": flops / copy_rate,
            "device": device.type, "backend": backend, "tokens": tokens, "model": model.cfg.name}


def measure_precision(model: HybridLM, backend: str, prompt: int, steps: int) -> PrecisionRow:
    row = PrecisionRow("precision", model.cfg.name, backend, prompt, steps, "bfloat16", 0, 0)
    try:
        ids = torch.randint(0, model.cfg.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0))
        r = snapshot_precision(model, ids, steps, torch.bfloat16, backend)
        row.state_bytes_float32, row.state_bytes_rounded = r.state_bytes_float32, r.state_bytes_rounded
        row.rel_err, row.max_rel_err = r.rel_err, max(r.rel_err)
        row.argmax_agree, row.first_divergence = r.argmax_agree, r.first_divergence
    except Exception as exc:  # noqa: BLE001
        row.error = f"{type(exc).__name__}: {exc}"
    return row


def print_row(r) -> None:
    if r.error:
        print(f"{r.experiment:>9} {r.model:>14} {r.backend:>12} FAILED {r.error}")
    elif isinstance(r, TtftRow):
        print(f"{'ttft':>9} {r.model:>14} {r.backend:>12} bs={r.block_size:<4} {r.prefix}+{r.suffix}: restored {r.restored}, "
              f"TTFT no cache {r.ttft_nocache_ms:.2f} ms, miss {r.ttft_miss_ms:.2f}, first hit {r.ttft_first_hit_ms:.2f}, "
              f"hit {r.ttft_hit_ms:.2f} ms -> {r.speedup:.1f}x (PrefixCache.prefill alone {r.hit_prefill_ms:.2f} ms); "
              f"steady miss {r.ttft_miss_steady_ms:.2f} ms ({r.miss_over_nocache:.2f}x no cache); "
              + ("" if math.isnan(r.warm_up_ms) else f"warm-up {r.warm_up_ms:.0f} ms; ")
              + f"generate's set-up before the timing {r.setup_nocache_ms:.2f} ms without the cache, "
              f"{r.setup_hit_ms:.2f} on hits ({r.speedup_with_setup:.1f}x with it); "
              f"mismatches {r.mismatches}/{r.hits} hits; "
              f"logits vs one-shot: hit {r.logit_err_hit:.1e}, split prefill without cache {r.logit_err_split:.1e}")
    elif isinstance(r, WorkloadRow):
        print(f"{'workload':>9} {r.model:>14} {r.backend:>12} {r.workload:>13} {r.policy:>10} budget {r.budget_snapshots:g} "
              f"snapshots: hit rate {r.hit_rate:.1%} (ceiling {r.ceiling_hit_rate:.1%}), TTFT median {r.ttft_ms_median:.2f} "
              f"p95 {r.ttft_ms_p95:.2f} ms (no cache {r.ttft_nocache_ms_median:.2f}; per request {r.ttft_ratio_median:.3f}x), "
              f"evictions {r.evictions}, "
              f"mismatches {r.mismatches}/{r.requests}")
    else:
        print(f"{'precision':>9} {r.model:>14} {r.backend:>12} bf16 snapshot: {r.state_bytes_float32 - r.state_bytes_rounded} "
              f"bytes saved; max rel err {r.max_rel_err:.2e} over {r.steps} steps, argmax agree {r.argmax_agree:.1%}, "
              f"first free-running divergence {r.first_divergence}")


def _load(name: str, device: str, dtype: torch.dtype) -> HybridLM:
    """A preset with random weights or a shipped checkpoint."""
    from ..shipped import CHECKPOINTS, checkpoint_path
    from ..config import PRESETS
    from ..checkpoint import load
    from ..model import build

    if name in CHECKPOINTS:
        return load(checkpoint_path(name), dtype=dtype, device=device)
    if name in PRESETS:
        return build(name, dtype=dtype, device=device, seed=0)
    raise SystemExit(f"unknown model {name!r}: presets {sorted(PRESETS)}, checkpoints {sorted(CHECKPOINTS)}")


def run_cache_bench(args, device: str) -> list:
    gpu = device.startswith("cuda")
    models = args.models or (["qwen3.5-0.8b"] if gpu else ["byte-qwen3.5-6m"])
    backends = args.backends or (["fused", "fused+graph"] if gpu else ["reference"])
    cases = args.ttft_cases or (["4096:64:256", "480:32:544", "480:32:64"] if gpu else ["48:5:16", "12:3:16", "12:3:4"])
    block = args.block_size or (256 if gpu else 8)
    steps = args.steps or (1000 if gpu else 30)
    dtype = {"auto": torch.bfloat16 if gpu else torch.float32, "bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    rows: list = []
    for name in models:
        model = _load(name, device, dtype)
        for backend in backends:
            if "ttft" in args.experiments:
                for case in cases:
                    prefix, suffix, bs = (int(x) for x in case.split(":"))
                    rows.append(time_ttft(model, backend, prefix, suffix, bs, args.repeats,
                                          warm_up=getattr(args, "warm_up", False)))
                    print_row(rows[-1])
            if "workload" in args.experiments and backend == backends[-1]:
                for wname, reqs in workload_streams(model.cfg.vocab_size, "gpu" if gpu else "cpu").items():
                    if args.workloads and wname not in args.workloads:
                        continue
                    rows += run_workload(model, backend, wname, reqs, block, args.policies, args.budgets)
                    for r in rows[-len(args.policies) * len(args.budgets):]:
                        print_row(r)
        if "precision" in args.experiments and "gdn" in model.cfg.layer_types:
            rows.append(measure_precision(model, "fused+graph" if gpu else "reference", 64, steps))
            print_row(rows[-1])
        del model
        if gpu:
            torch.cuda.empty_cache()
    return rows


@torch.no_grad()
def replay_stream(model: HybridLM, requests: list[wl.Request], block_size: int, budget_snapshots: float,
                  policy: str, backend: str = "reference") -> dict:
    """Only the cache's bookkeeping on a stream: every prompt prefilled through one PrefixCache, no
    decoding, no timing (for the notebook's widget). Returns the token hit rate, its ceiling, the
    bytes held at the end, and evictions."""
    from ..decode.registry import make_decoder

    snap = PrefixCache(model, block_size, budget_bytes=2**62).snapshot_bytes
    evict, _, admission = policy.partition("+")
    pc = PrefixCache(model, block_size, int(budget_snapshots * snap), policy=evict, admission=admission or "every")
    longest = max(len(r) for r in requests)
    decoder = make_decoder(backend, model, model.new_cache(1, longest))
    restored = sum(pc.prefill(decoder, _ids(r.tokens, model.device)).restored for r in requests)
    total = sum(len(r) for r in requests)
    return {"hit_rate": restored / total, "ceiling": wl.reusable_tokens(requests, block_size) / total,
            "bytes": pc.nbytes, "snapshot_bytes": snap, "evictions": pc.evictions}
