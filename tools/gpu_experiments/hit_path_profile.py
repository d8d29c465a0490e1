"""Where a prefix-cache hit's time goes after this branch (Qwen3.5-0.8B bf16 random weights, 4,096 shared +
64 tokens, block 256, fused+graph): the hit timed whole (PrefixCache.prefill + argmax + sync, as generate's
TTFT), its pieces alone, the same hit with the continuation's attention put back to attend_ref (A/B), and
the device's kernels per hit (torch.profiler). Writes hit_pieces.json, hit_kernels.txt, hit_cprofile.txt.
DRY_RUN=1: a CPU check of this script (tiny-qwen3.5, 64 + 5 tokens, block 16, graphs stood in by tests' recorder)."""
import cProfile, io, json, os, pstats, statistics, sys, time
from functools import partial
import torch
import labkit.decode.fused as fused
from labkit.lab import workloads as wl
from labkit.decode.registry import pooled_decoder
from labkit.bench.cache import _load, _ids
from labkit.generate import generate
from labkit.ops.mixers import attend_ref
from labkit.prefix_cache import PrefixCache, _block_keys

out = sys.argv[1]
DRY = os.environ.get("DRY_RUN") == "1"
if DRY:
    sys.path.insert(0, "tests")
    from conftest import RecordingGraphs
    fused.GRAPHS = RecordingGraphs()
    torch.cuda.synchronize = lambda *a: None
MODEL, DEV, DT = ("tiny-qwen3.5", "cpu", torch.float32) if DRY else ("qwen3.5-0.8b", "cuda", torch.bfloat16)
PREFIX, SUFFIX, BLOCK = (64, 5, 16) if DRY else (4096, 64, 256)
m = _load(MODEL, DEV, DT)
reqs = wl.shared_prefix(10, PREFIX, SUFFIX, m.cfg.vocab_size, seed=PREFIX + SUFFIX)
generate(m, _ids(reqs[0].tokens, DEV), 8, backend="fused+graph")
pc = PrefixCache(m, BLOCK, budget_bytes=2**40)
dec, _ = pooled_decoder("fused+graph", m, 1, PREFIX + SUFFIX + 8)
for r in reqs[:3]:
    pc.prefill(dec, _ids(r.tokens, DEV))
torch.cuda.synchronize()
ids = [_ids(r.tokens, DEV) for r in reqs[3:]]


REPS = 1 if DRY else 7


def timed(f, n=REPS):
    ts = []
    for i in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(i); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


class Rows(dict):
    """Printed and written as they come: a cut run keeps what it measured."""

    def __setitem__(self, k, v):
        super().__setitem__(k, v)
        print(f"{k:60s} {v:9.3f}" if isinstance(v, float) else f"{k:60s} {v}", flush=True)
        json.dump(self, open(f"{out}/hit_pieces.json", "w"), indent=1)


rows = Rows()
rows["hit: pc.prefill + argmax (TTFT as generate times it)"] = timed(lambda i: pc.prefill(dec, ids[i]).logits.argmax(-1))
nocache = []
for i in range(min(3, REPS)):
    nocache.append(generate(m, ids[i], 1, backend="fused+graph").ttft_s * 1e3)
rows["no cache: generate TTFT (fused+graph)"] = statistics.median(nocache)
rows["pc._check"] = timed(lambda i: pc._check(dec, ids[i]))
from labkit.decode.fused import weights_key
rows["weights_key"] = timed(lambda i: weights_key(m))
node_paths = [pc._path(_block_keys(ids[i].cpu(), BLOCK)[0], PREFIX // BLOCK) for i in range(REPS)]
def restore(i):
    dec.cache.reset(zero=False); pc._restore(dec.cache, [node_paths[i]])
rows["reset + _restore (16 nodes)"] = timed(restore)
def old_restore(i):  # main's restore before this branch: a torch.cat of the path's KV per layer, then copy_
    cache, path = dec.cache, node_paths[i]
    cache.reset(zero=False)
    for j in path[-1].keys:
        cache.keys[j][0, :, :PREFIX].copy_(torch.cat([n.keys[j] for n in path], dim=1))
        cache.values[j][0, :, :PREFIX].copy_(torch.cat([n.values[j] for n in path], dim=1))
    for j, st in path[-1].conv_states.items():
        cache.conv_states[j][0].copy_(st)
    for j, st in path[-1].recurrent_states.items():
        cache.recurrent_states[j][0].copy_(st)
    cache.advance(PREFIX)
rows["A/B: reset + main's cat+copy restore"] = timed(old_restore)
host, whole_t = [], []
for i in range(REPS):
    torch.cuda.synchronize(); t0 = time.perf_counter(); pc.prefill(dec, ids[i % len(ids)])
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    host.append(t1 - t0); whole_t.append(t2 - t0)
rows["hit: host time until pc.prefill returns (GPU still busy)"] = statistics.median(host) * 1e3
rows["hit: pc.prefill + sync"] = statistics.median(whole_t) * 1e3
tail = ids[0][:, PREFIX:]
def cont(i):
    dec.cache.reset(zero=False); dec.cache.advance(PREFIX); dec.prefill_continuation(tail)
rows["reset+advance+prefill_continuation"] = timed(cont)
g = dec._continuations[((PREFIX,), (1, SUFFIX))].graph
def replay(graph):  # each replay advances the device lengths: put them back first (else positions run past the cache)
    dec.cache.lengths.fill_(PREFIX)
    graph.replay()
rows["continuation graph replay alone"] = timed(lambda i: replay(g))
# the restore's pieces: building the copy lists (host) and the multi-tensor copies, and its kernels
layers = list(dec.cache.keys)
def lists(i):
    dst, src = [], []
    for depth, node in enumerate(node_paths[i]):
        dst += pc._kv_destinations(dec.cache, 0, depth); src += node.kv_rows(layers)
    return dst, src
rows["restore: KV copy lists built (host only)"] = timed(lambda i: lists(i))
built = [lists(i) for i in range(REPS)]
rows["restore: one _foreach_copy_ of the KV rows (+sync)"] = timed(lambda i: torch._foreach_copy_(*built[i]))
from torch.profiler import profile as _profile, ProfilerActivity as _PA
with _profile(activities=[_PA.CPU] + ([] if DRY else [_PA.CUDA])) as prof:
    torch._foreach_copy_(*built[0]); torch.cuda.synchronize()
rows["restore: KV foreach, ops and kernels seen"] = str(sorted({(e.key, e.count) for e in prof.key_averages()}, key=lambda x: -x[1])[:8])
# A/B: the same hit with the continuation's attention put back to the explicit mask (recaptured)
real = fused.attend_continuing
fused.attend_continuing = lambda q, k, v, p, kp, start: attend_ref(q, k, v, p, kp)
dec._continuations.clear()
pc.prefill(dec, ids[0]); torch.cuda.synchronize()
rows["A/B: hit with attend_ref in the continuation"] = timed(lambda i: pc.prefill(dec, ids[i]).logits.argmax(-1))
g_ref = dec._continuations[((PREFIX,), (1, SUFFIX))].graph
rows["A/B: continuation graph replay alone, attend_ref"] = timed(lambda i: replay(g_ref))
fused.attend_continuing = real
dec._continuations.clear()
pc.prefill(dec, ids[0]); torch.cuda.synchronize()
# exactness of this hit against no cache (last-token logits), bf16
dec.cache.reset()
whole = dec.prefill(ids[1]).float().clone()  # the fused prefill of the whole prompt, no cache
hit = pc.prefill(dec, ids[1]).logits.float()
rows["hit vs whole-prompt forward: rel err of last logits"] = ((hit - whole).norm() / whole.norm()).item()
rows["hit greedy token == whole greedy token"] = bool(hit.argmax(-1).eq(whole.argmax(-1)).all())

pr = cProfile.Profile(); pr.enable()
for i in range(min(5, REPS)):
    pc.prefill(dec, ids[i])
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
open(f"{out}/hit_cprofile.txt", "w").write(s.getvalue())
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU] + ([] if DRY else [ProfilerActivity.CUDA])) as p:
    for i in range(min(3, REPS)):
        pc.prefill(dec, ids[i])
    torch.cuda.synchronize()
t = p.key_averages().table(sort_by="cpu_time_total" if DRY else "cuda_time_total", row_limit=40)
open(f"{out}/hit_kernels.txt", "w").write("3 hits\n" + t)
print(t[:7000])
