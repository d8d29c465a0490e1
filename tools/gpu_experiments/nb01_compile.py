"""Probe: torch.compile(mode="reduce-overhead") of the reference decode step (LFM2-350M, batch 1),
through the whole-cache view so the host length does not change between steps. Prints whether
CUDA graphs were used or skipped (and why), and ms per step."""

import logging
import time

import torch

import labkit
from labkit.reference_graph import WholeCacheView

torch._logging.set_logs(perf_hints=True)
logging.basicConfig(level=logging.WARNING)
model = labkit.build("lfm2-350m", dtype=torch.bfloat16, device="cuda")
cache = model.new_cache(1, 256)
view = WholeCacheView(cache)
ids = torch.randint(0, model.cfg.vocab_size, (1, 128), device="cuda")
with torch.no_grad():
    token = model(ids, cache=cache, last_only=True)[:, -1].argmax(-1)


@torch.compile(mode="reduce-overhead")
def step(tokens):
    return model(tokens[:, None], cache=view)[:, -1].argmax(-1)


t0 = time.time()
with torch.no_grad():
    for i in range(4):
        token = step(token).clone()
        cache.advance_host(1)
    torch.cuda.synchronize()
    print(f"compile + 4 steps: {time.time() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    for i in range(40):
        token = step(token).clone()
        cache.advance_host(1)
    torch.cuda.synchronize()
    print(f"compiled reduce-overhead: {(time.perf_counter() - t0) / 40 * 1e3:.3f} ms per step", flush=True)
