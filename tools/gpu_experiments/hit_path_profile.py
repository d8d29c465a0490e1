"""Where a prefix-cache hit's time goes after this branch (Qwen3.5-0.8B bf16 random weights, 4,096 shared +
64 tokens, block 256, fused+graph): the hit timed whole (PrefixCache.prefill + argmax + sync, as generate's
TTFT), its pieces alone, the same hit with the continuation's attention put back to attend_ref (A/B), and
the device's kernels per hit (torch.profiler). Writes hit_pieces.json, hit_kernels.txt, hit_cprofile.txt."""
import cProfile, io, json, pstats, statistics, sys, time
from functools import partial
import torch
import labkit.fused as fused
from labkit import workloads as wl
from labkit.backends import pooled_decoder
from labkit.bench.cache import _load, _ids
from labkit.generate import generate
from labkit.ops.mixers import attend_ref
from labkit.prefix_cache import PrefixCache

out = sys.argv[1]
m = _load("qwen3.5-0.8b", "cuda", torch.bfloat16)
reqs = wl.shared_prefix(10, 4096, 64, m.cfg.vocab_size, seed=4160)
generate(m, _ids(reqs[0].tokens, "cuda"), 8, backend="fused+graph")
pc = PrefixCache(m, 256, budget_bytes=2**40)
dec, _ = pooled_decoder("fused+graph", m, 1, 4096 + 64 + 8)
for r in reqs[:3]:
    pc.prefill(dec, _ids(r.tokens, "cuda"))
torch.cuda.synchronize()
ids = [_ids(r.tokens, "cuda") for r in reqs[3:]]


def timed(f, n=7):
    ts = []
    for i in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(i); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


rows = {}
rows["hit: pc.prefill + argmax (TTFT as generate times it)"] = timed(lambda i: pc.prefill(dec, ids[i]).logits.argmax(-1))
nocache = []
for i in range(3):
    nocache.append(generate(m, ids[i], 1, backend="fused+graph").ttft_s * 1e3)
rows["no cache: generate TTFT (fused+graph)"] = statistics.median(nocache)
rows["pc._check"] = timed(lambda i: pc._check(dec, ids[i]))
from labkit.fused import weights_key
rows["weights_key"] = timed(lambda i: weights_key(m))
node_paths = [pc._path(ids[i][0].tolist(), 16) for i in range(len(ids))]
def restore(i):
    dec.cache.reset(zero=False); pc._restore(dec.cache, [node_paths[i]])
rows["reset + _restore (16 nodes)"] = timed(restore)
tail = ids[0][:, 4096:]
def cont(i):
    dec.cache.reset(zero=False); dec.cache.advance(4096); dec.prefill_continuation(tail)
rows["reset+advance+prefill_continuation"] = timed(cont)
g = dec._continuations[((4096,), (1, 64))].graph
rows["continuation graph replay alone"] = timed(lambda i: g.replay())
# A/B: the same hit with the continuation's attention put back to the explicit mask (recaptured)
real = fused.attend_continuing
fused.attend_continuing = lambda q, k, v, p, kp, start: attend_ref(q, k, v, p, kp)
dec._continuations.clear()
pc.prefill(dec, ids[0]); torch.cuda.synchronize()
rows["A/B: hit with attend_ref in the continuation"] = timed(lambda i: pc.prefill(dec, ids[i]).logits.argmax(-1))
g_ref = dec._continuations[((4096,), (1, 64))].graph
rows["A/B: continuation graph replay alone, attend_ref"] = timed(lambda i: g_ref.replay())
fused.attend_continuing = real
dec._continuations.clear()
pc.prefill(dec, ids[0]); torch.cuda.synchronize()
# exactness of this hit against no cache (last-token logits), bf16
dec.cache.reset()
whole = dec.prefill(ids[1]).float().clone()  # the fused prefill of the whole prompt, no cache
hit = pc.prefill(dec, ids[1]).logits.float()
rows["hit vs whole-prompt forward: rel err of last logits"] = ((hit - whole).norm() / whole.norm()).item()
rows["hit greedy token == whole greedy token"] = bool(hit.argmax(-1).eq(whole.argmax(-1)).all())
for k, v in rows.items():
    print(f"{k:60s} {v:9.3f}" if isinstance(v, float) else f"{k:60s} {v}")
json.dump(rows, open(f"{out}/hit_pieces.json", "w"), indent=1)

pr = cProfile.Profile(); pr.enable()
for i in range(5):
    pc.prefill(dec, ids[i])
torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
open(f"{out}/hit_cprofile.txt", "w").write(s.getvalue())
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for i in range(3):
        pc.prefill(dec, ids[i])
    torch.cuda.synchronize()
t = p.key_averages().table(sort_by="cuda_time_total", row_limit=40)
open(f"{out}/hit_kernels.txt", "w").write("3 hits\n" + t)
print(t[:7000])
