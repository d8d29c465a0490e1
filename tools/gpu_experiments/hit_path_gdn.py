"""The GDN chunk kernel on a hit's tail: one 64-token chunk after a restored state (B=1, Hk=Hv=16,
K=V=128, bf16, Qwen3.5-0.8B's shape), per form (prepare fused/split x outputs deferred or not),
each checked against the float32 reference (delta_rule_ref) and timed in a CUDA graph (per layer call).
The defaults (PREPARE, DEFER_OUTPUTS) were chosen for long prompts. Writes gdn_tail.json."""
import json, os, sys
import torch
import torch.nn.functional as F
from labkit.ops.chunk_delta_rule import chunk_delta_rule
from labkit.ops.delta_rule import delta_rule_ref

out = sys.argv[1]
dev = "cuda"
DRY = os.environ.get("DRY_RUN") == "1"
if DRY:
    dev = "cpu"
else:
    from triton.testing import do_bench_cudagraph
gen = torch.Generator().manual_seed(0)
rows = {}
for B, T, H, D in [(1, 5, 2, 32)] if DRY else [(1, 64, 16, 128)]:
    q = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    v = torch.randn(B, T, H, D, generator=gen)
    g = -F.softplus(2 * torch.randn(B, T, H, generator=gen) - 2)
    beta = torch.rand(B, T, H, generator=gen)
    state = torch.randn(B, H, D, D, generator=gen)
    want_o, want_s = delta_rule_ref(q, k, v, g, beta, state)
    dt = torch.float32 if DRY else torch.bfloat16
    qd, kd, vd = (x.to(dev, dt) for x in (q, k, v))
    gd, bd, sd = g.to(dev), beta.to(dev), state.to(dev)
    case = f"B={B} T={T} H={H} K=V={D}"
    rows[case] = {}
    for prepare in ("split", "fused"):
        for defer in (True, False):
            name = f"prepare={prepare} defer_outputs={defer}"
            try:
                o = torch.full((B, T, H, D), float("nan"), dtype=dt, device=dev)
                s = torch.full((B, H, D, D), float("nan"), device=dev)
                fn = lambda: chunk_delta_rule(qd, kd, vd, gd, bd, sd, out=o, final_state=s, prepare=prepare, defer_outputs=defer)
                fn()
                eo = ((o.float().cpu() - want_o).norm() / want_o.norm()).item()
                es = ((s.cpu() - want_s).norm() / want_s.norm()).item()
                us = 0.0 if DRY else do_bench_cudagraph(fn, rep=20) * 1e3
                rows[case][name] = {"us": us, "rel_err_out": eo, "rel_err_state": es}
                print(f"{case} {name:36s} {us:7.1f} us  rel err out {eo:.2e} state {es:.2e}", flush=True)
            except Exception as e:  # noqa: BLE001 - a form that fails is a row that says so
                rows[case][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{case} {name:36s} ERROR {rows[case][name]['error']}", flush=True)
            json.dump(rows, open(f"{out}/gdn_tail.json", "w"), indent=1)
