"""Where the GPU time of a prefix-cache hit's tail goes: Qwen3.5-0.8B bf16 (random weights), 4,096 restored
tokens + a 64-token tail, batch 1. The tail is prefilled by the `fused` backend eagerly (the same kernels the
fused+graph continuation replays) under torch.profiler; kernels are grouped by name with their device time.
Writes tail_kernels.json and prints the table. DRY_RUN=1: tiny-qwen3.5 on the CPU (ops, not kernels)."""
import json, os, sys
from collections import defaultdict
import torch
from torch.profiler import ProfilerActivity, profile
from labkit.bench.cache import _ids, _load
from labkit.backends import make_decoder
from labkit.bench import provenance
from labkit.hw import device_facts

out = sys.argv[1]
DRY = os.environ.get("DRY_RUN") == "1"
MODEL, DEV, DT = ("tiny-qwen3.5", "cpu", torch.float32) if DRY else ("qwen3.5-0.8b", "cuda", torch.bfloat16)
PREFIX, TAIL = (48, 5) if DRY else (4096, 64)
m = _load(MODEL, DEV, DT)
ids = torch.randint(0, m.cfg.vocab_size, (1, PREFIX + TAIL), generator=torch.Generator().manual_seed(0)).to(DEV)
dec = make_decoder("fused", m, m.new_cache(1, PREFIX + TAIL))
sync = (lambda: None) if DRY else torch.cuda.synchronize


def tail():
    dec.cache.reset(zero=False)
    dec.cache.advance(PREFIX)
    dec.prefill(ids[:, PREFIX:])


dec.prefill(ids[:, :PREFIX])
for _ in range(3):
    tail()
sync()
acts = [ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])
with profile(activities=acts) as prof:
    for _ in range(3):
        tail()
    sync()
by = defaultdict(lambda: [0, 0.0])
for e in prof.events():
    if DRY or e.device_type == torch.autograd.DeviceType.CUDA:
        by[e.name][0] += 1
        by[e.name][1] += (e.cpu_time_total if DRY else e.device_time_total) / 3
rows = sorted(((k, n // 3, us) for k, (n, us) in by.items()), key=lambda r: -r[2])
total = sum(r[2] for r in rows)
json.dump({**provenance(device_facts(DEV, measure=False), "python tools/gpu_experiments/tail_kernels.py OUT"),
           "kind": "profile", "model": MODEL, "prefix": PREFIX, "tail": TAIL, "busy_us_per_tail": total,
           "kernels_per_tail": sum(r[1] for r in rows), "rows": rows}, open(f"{out}/tail_kernels.json", "w"), indent=1)
print(f"tail of {TAIL} after {PREFIX}: {sum(r[1] for r in rows)} kernels, busy {total:.0f} us")
for k, n, us in rows[:30]:
    print(f"{us:9.1f} us  x{n:<4d} {k[:110]}")
