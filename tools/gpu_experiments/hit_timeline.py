"""A prefix-cache hit on the clock and on the GPU: Qwen3.5-0.8B bf16 (random weights), 4,096 cached tokens
+ a 64-token tail, batch 1, fused+graph (the TTFT bench's case). For each hit (after two warm-up hits: the
first captures the tail's graph) it records the wall time of PrefixCache.prefill (device synchronised
before and after), and under torch.profiler the device time of every kernel and copy the hit ran, the
graph's kernels included. Wall minus busy is time the GPU waited for the host.
Also times the tail's graph replay alone (CUDA events, median). Writes hit_timeline.json.
DRY_RUN=1: tiny-qwen3.5 on the CPU, eager fused (host clock only; set TRITON_INTERPRET=1)."""
import json, os, statistics, sys, time
from collections import defaultdict
import torch
from torch.profiler import ProfilerActivity, profile
from labkit import PrefixCache
from labkit.decode.registry import pooled_decoder
from labkit.bench import provenance
from labkit.bench.cache import _load
from labkit.lab.hw import device_facts

out = sys.argv[1]
DRY = os.environ.get("DRY_RUN") == "1"
MODEL, DEV, DT = ("tiny-qwen3.5", "cpu", torch.float32) if DRY else ("qwen3.5-0.8b", "cuda", torch.bfloat16)
PREFIX, TAIL, BS, HITS = (48, 5, 16, 3) if DRY else (4096, 64, 256, 10)
sync = (lambda: None) if DRY else torch.cuda.synchronize
m = _load(MODEL, DEV, DT)
gen = torch.Generator().manual_seed(0)
prefix = torch.randint(0, m.cfg.vocab_size, (1, PREFIX), generator=gen)
prompts = [torch.cat([prefix, torch.randint(0, m.cfg.vocab_size, (1, TAIL), generator=gen)], 1).to(DEV)
           for _ in range(HITS + 3)]
dec, _ = pooled_decoder("fused" if DRY else "fused+graph", m, 1, PREFIX + TAIL + 8)
pc = PrefixCache(m, BS, budget_bytes=2**40)
pc.prefill(dec, prompts[0])  # the miss: stores the snapshots
for p in prompts[1:3]:
    pc.prefill(dec, p)  # first hit captures the tail's graph
wall = []
for p in prompts[3:]:
    sync()
    t0 = time.perf_counter()
    hit = pc.prefill(dec, p)
    sync()
    wall.append(time.perf_counter() - t0)
assert hit.restored == PREFIX // BS * BS, hit.restored

acts = [ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])
with profile(activities=acts) as prof:
    for p in prompts[3:6]:
        pc.prefill(dec, p)
    sync()
by = defaultdict(lambda: [0, 0.0])
for e in prof.events():
    if not DRY and e.device_type == torch.autograd.DeviceType.CUDA:
        by[e.name][0] += 1
        by[e.name][1] += e.device_time_total / 3
rows = sorted(((k, n // 3, us) for k, (n, us) in by.items()), key=lambda r: -r[2])

replay = []
if not DRY:
    key = next(reversed(dec._continuations))
    graph = dec._continuations[key].graph
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    lengths = dec.cache.lengths
    before = lengths - TAIL  # the replay reads and advances the device lengths: each one starts from the restore's
    for _ in range(20):
        lengths.copy_(before)
        a.record(); graph.replay(); b.record(); b.synchronize()
        replay.append(a.elapsed_time(b) / 1e3)
doc = {**provenance(device_facts(DEV, measure=False), "python tools/gpu_experiments/hit_timeline.py OUT"),
       "kind": "profile", "model": MODEL, "prefix": PREFIX, "tail": TAIL, "block_size": BS,
       "hit_wall_ms": [w * 1e3 for w in wall], "hit_wall_median_ms": statistics.median(wall) * 1e3,
       "busy_us_per_hit": sum(r[2] for r in rows), "kernels_per_hit": sum(r[1] for r in rows),
       "tail_replay_median_ms": statistics.median(replay) * 1e3 if replay else None, "rows": rows}
json.dump(doc, open(f"{out}/hit_timeline.json", "w"), indent=1)
print(f"hit wall {doc['hit_wall_median_ms']:.3f} ms (median of {len(wall)}); GPU busy {doc['busy_us_per_hit']:.0f} us "
      f"in {doc['kernels_per_hit']} kernels/copies; tail graph replay alone {doc['tail_replay_median_ms']} ms")
for k, n, us in rows[:25]:
    print(f"{us:9.1f} us  x{n:<4d} {k[:110]}")
