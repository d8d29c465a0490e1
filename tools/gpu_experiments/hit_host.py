"""The host side of a prefix-cache hit, broken down: where the Python time of PrefixCache.prefill goes.

A hit on Qwen3.5-0.8B (4,096 cached + 64 new tokens, fused+graph, H200) takes ~3.3 ms, of which
~0.9 ms is the host side (data/bench/nvidia-h200/hit-host.json): the look-up, the checks, the
restore plan, the weights key, the copies. This script times those pieces alone with time.perf_counter (medians of REPS calls,
device synchronised around each), the multi-tensor copies, the tail's prefill, and the whole hit two
ways: with the decoder's real tail, and with the tail stubbed out (the host side alone, as a graph
replay leaves it). cProfile counts the Python calls of the stubbed hit and of each piece.

Runs on cuda if available (MODEL, default qwen3.5-0.8b, bf16, backend fused+graph), else on the CPU
(tiny-qwen3.5, float32, backend reference). Usage: python tools/gpu_experiments/hit_host.py OUT_DIR (writes hit_host.json).
"""

import cProfile
import json
import os
import pstats
import statistics
import sys
import time

import torch

from labkit.lab import workloads as wl
from labkit.decode.registry import make_decoder
from labkit.bench.cache import _ids, _load
from labkit.prefix_cache import PrefixCache

from labkit.bench import provenance
from labkit.lab.hw import device_facts
from labkit.weights import _describe, weights_key

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out_dir, exist_ok=True)
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
MODEL = os.environ.get("MODEL", "qwen3.5-0.8b" if CUDA else "tiny-qwen3.5")
DTYPE = torch.bfloat16 if CUDA else torch.float32
BACKEND = os.environ.get("BACKEND", "fused+graph" if CUDA else "reference")
PREFIX, SUFFIX, BLOCK = 4096, 64, 256
REPS = int(os.environ.get("REPS", "50"))


def sync():
    if CUDA:
        torch.cuda.synchronize()


def timed(f, n=REPS):
    """Median milliseconds of ``f(i)`` over ``n`` calls, synchronised around each."""
    ts = []
    for i in range(n):
        sync()
        t0 = time.perf_counter()
        f(i)
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def calls(f):
    """Python calls (cProfile's count, C functions called from Python included) of one ``f()``."""
    pr = cProfile.Profile()
    pr.enable()
    f()
    pr.disable()
    return pstats.Stats(pr).total_calls


model = _load(MODEL, DEV, DTYPE)
reqs = wl.shared_prefix(REPS + 3, PREFIX, SUFFIX, model.cfg.vocab_size, seed=PREFIX + SUFFIX)
ids = [_ids(r.tokens, DEV) for r in reqs]
pc = PrefixCache(model, BLOCK, budget_bytes=2**40)
dec = make_decoder(BACKEND, model, model.new_cache(1, PREFIX + SUFFIX + 8))
pc.prefill(dec, ids[0])  # the miss that stores the 16 snapshots
for i in range(1, 3):
    pc.prefill(dec, ids[i])  # hits: compile, capture, make the plans (after the branch)
sync()
rows = {**provenance(device_facts(DEV, measure=False), "python tools/gpu_experiments/hit_host.py OUT"),
        "kind": "profile", "model": MODEL, "dtype": str(DTYPE), "backend": BACKEND, "prefix": PREFIX, "suffix": SUFFIX,
        "block": BLOCK, "reps": REPS, "torch": torch.__version__}


class _TailStub:
    """The decoder with its tail replaced by a constant: PrefixCache.prefill's host side alone, as a
    replayed continuation graph leaves it (its launches are queued, not waited for)."""

    def __init__(self, decoder):
        self.model, self.cache = decoder.model, decoder.cache
        self.prefill_cores = decoder.prefill_cores
        self._logits = torch.zeros(1, model.cfg.vocab_size, device=DEV)

    def prefill_continuation(self, input_ids, ids_checked=False, weights=None):
        self.cache.advance_host(input_ids.shape[1])
        return self._logits


stub = _TailStub(dec)
hit = lambda i: pc.prefill(dec, ids[i % len(ids)])  # noqa: E731
rows["hit: pc.prefill, real tail (ms)"] = timed(hit)
rows["hit: pc.prefill, tail stubbed = host side (ms)"] = timed(lambda i: pc.prefill(stub, ids[i % len(ids)]))
rows["weights_key (ms)"] = timed(lambda i: weights_key(model))
rows["weights_key: full walk, no memo (ms)"] = timed(lambda i: _describe(model, []))  # as before the memo
rows["lookup: pc.lookup(row) (ms)"] = timed(lambda i: pc.lookup(ids[i % len(ids)][0]))
rows["check: pc._check (ms)"] = timed(lambda i: pc._check(dec, ids[i % len(ids)]))

cache = dec.cache
keys = pc._check(dec, ids[1])[2]
path = pc._path(keys[0], pc._usable_blocks(PREFIX + SUFFIX))
build = lambda: pc._plan(cache, [path])  # noqa: E731  (made once, then reused: what a repeated hit pays)
copy = lambda p: p.copy()  # noqa: E731

rows["restore: lists / plan (host) (ms)"] = timed(lambda i: build())
built = build()
rows["restore: the copies (ms)"] = timed(lambda i: copy(built))
rows["reset + _restore whole (ms)"] = timed(lambda i: (cache.reset(zero=False), pc._restore(cache, [path])))
tail = ids[1][:, PREFIX:]


def run_tail(i):
    cache.reset(zero=False)
    cache.advance(PREFIX)
    if hasattr(dec, "prefill_continuation"):  # fused backends; the reference has only prefill
        dec.prefill_continuation(tail, ids_checked=True)
    else:
        dec.prefill(tail)


rows["tail prefill (64 tokens) (ms)"] = timed(run_tail, n=min(REPS, 10))
rows["python calls: hit, tail stubbed"] = calls(lambda: pc.prefill(stub, ids[3]))
rows["python calls: weights_key"] = calls(lambda: weights_key(model))
rows["python calls: lookup"] = calls(lambda: pc.lookup(ids[3][0]))
rows["python calls: check"] = calls(lambda: pc._check(dec, ids[3]))
rows["python calls: restore lists / plan"] = calls(build)
# exactness of the measured hit: the same last-token logits as the whole prompt with no cache
cache.reset()
whole = dec.prefill(ids[4]).float().clone()
got = pc.prefill(dec, ids[4]).logits.float()
rows["hit vs no cache: rel err of last logits"] = ((got - whole).norm() / whole.norm()).item()
for k, v in rows.items():
    print(f"{k:55s} {v:.4f}" if isinstance(v, float) else f"{k:55s} {v}")
json.dump(rows, open(os.path.join(out_dir, "hit_host.json"), "w"), indent=1)
