"""The continuing attention form at the real shape (Qwen3.5-0.8B: 8 q heads, 2 kv heads, head_dim 256;
64 new tokens after 4,096 cached, buffer 4,168): checked against attend_ref, then timed per layer call
(CUDA graph replay, triton do_bench_cudagraph) beside the masked variants. Writes attention.json."""
import json, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench_cudagraph
from labkit.ops.mixers import attend_continuing, attend_ref

out = sys.argv[1]
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
if os.environ.get("DRY_RUN") == "1":  # a CPU check of this script: no kernels timed
    dev, do_bench_cudagraph = "cpu", lambda fn, rep: (fn(), 0.0)[1]
    torch.cuda.synchronize = lambda *a: None
rows = {}


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


for B, nh, nkv, hd, T, start, L in [(1, 8, 2, 256, 64, 4096, 4168), (3, 8, 2, 256, 37, 1000, 1100), (1, 8, 2, 256, 1, 4096, 4168)]:
    real = (B, T) == (1, 64)  # every variant timed at the real shape; the others check the new form only
    q = torch.randn(B, nh, T, hd, device=dev, dtype=dt)
    keys, values = torch.randn(2, B, nkv, L, hd, device=dev, dtype=dt)
    pos = (start + torch.arange(T, device=dev)).expand(B, T)
    kpos = torch.arange(L, device=dev).expand(B, L)
    truth = attend_ref(q.float(), keys.float(), values.float(), pos, kpos)  # float32 reference
    ref = attend_ref(q, keys, values, pos, kpos)
    used = start + T
    k_used, v_used = keys[:, :, :used], values[:, :, :used]
    mask = kpos[:, None, None, :used] <= pos[:, None, :, None]
    k_rep, v_rep = k_used.repeat_interleave(nh // nkv, 1), v_used.repeat_interleave(nh // nkv, 1)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    poisoned_k[:, :, used:], poisoned_v[:, :, used:] = float("nan"), float("nan")
    variants = {
        "attend_ref (mask over the whole buffer)": lambda: attend_ref(q, keys, values, pos, kpos),
        "mask over the used keys (default SDPA pick)": lambda: F.scaled_dot_product_attention(
            q, k_used, v_used, attn_mask=mask, scale=hd ** -0.5, enable_gqa=True),
        "attend_continuing (causal_lower_right, GQA)": lambda: attend_continuing(q, keys, values, pos, kpos, start=start),
        "attend_continuing on a NaN-poisoned tail": lambda: attend_continuing(q, poisoned_k, poisoned_v, pos, kpos, start=start),
        "causal_lower_right, KV expanded": lambda: F.scaled_dot_product_attention(
            q, k_rep, v_rep, attn_mask=causal_lower_right(T, used), scale=hd ** -0.5),
    }
    for backend in ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION"):
        def f(backend=backend):
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask, scale=hd ** -0.5)
        variants[f"mask over the used keys, KV expanded, {backend}"] = f
    case = f"B={B} nh={nh} nkv={nkv} hd={hd} T={T} start={start} L={L}"
    rows[case] = {"bf16 attend_ref vs float32 truth": rel(ref, truth)}
    print(case, "| bf16 attend_ref vs fp32:", f"{rows[case]['bf16 attend_ref vs float32 truth']:.2e}")
    if not real:
        variants = {k: v for k, v in variants.items() if "attend_continuing" in k or k.startswith("attend_ref")}
    for name, fn in variants.items():
        try:
            got = fn()
            err = rel(got, truth)
            nan = bool(got.isnan().any())
            us = do_bench_cudagraph(fn, rep=20) * 1e3
            rows[case][name] = {"rel_err_vs_fp32": err, "nan": nan, "us": us, "ok": (not nan) and err < 2 * rows[case]["bf16 attend_ref vs float32 truth"] + 1e-3}
            json.dump(rows, open(f"{out}/attention.json", "w"), indent=1)
            print(f"  {name:60s} {us:8.1f} us  rel err {err:.2e}  nan {nan}  ok {rows[case][name]['ok']}")
        except Exception as e:  # noqa: BLE001 - a variant that fails is a row that says so
            rows[case][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"  {name:60s} ERROR {rows[case][name]['error']}")

# which kernel the continuing form launches at the real shape
from torch.profiler import ProfilerActivity, profile
B, nh, nkv, hd, T, start, L = 1, 8, 2, 256, 64, 4096, 4168
q = torch.randn(B, nh, T, hd, device=dev, dtype=dt)
keys, values = torch.randn(2, B, nkv, L, hd, device=dev, dtype=dt)
pos = (start + torch.arange(T, device=dev)).expand(B, T)
kpos = torch.arange(L, device=dev).expand(B, L)
attend_continuing(q, keys, values, pos, kpos, start=start)
with profile(activities=[ProfilerActivity.CPU if dev == "cpu" else ProfilerActivity.CUDA]) as p:
    attend_continuing(q, keys, values, pos, kpos, start=start)
    torch.cuda.synchronize()
kernels = [e.key for e in p.key_averages()]
rows["kernels of attend_continuing"] = kernels
print("kernels of attend_continuing:", kernels)
json.dump(rows, open(f"{out}/attention.json", "w"), indent=1)
