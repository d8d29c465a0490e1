"""Every projection weight of a decode step, chained in one CUDA graph (weights only: each GEMV reads
a fixed x), as in issue 14's chain figure: cuda-tma (default config, and the sweep's fastest per
shape when a sweep results file is given; PDL off and on), Triton (tuned configs; PDL off and on),
cuBLAS. Prints ms per chain and weight bytes / time. Usage: cuda_tma_chain.py [tma-sweep.json]"""

import json
import sys

import torch

from labkit import tuning
from labkit.config import PRESETS
from labkit.cuda import config_from_repr, tma_linear
from labkit.model import empty_model
from labkit.ops.linear import LinearWorkspace, linear
from labkit.lab.timing import measure


def chain_shapes(preset):
    m = empty_model(PRESETS[preset], torch.bfloat16, "meta")
    shapes = []
    for block in m.layers:
        mixer = block.mixer
        ws = [mixer.wqkv, mixer.wo] if block.kind == "attention" else [mixer.in_proj, mixer.out_proj]
        if getattr(block, "mlp", None) is not None:
            ws += [block.mlp.gate_up, block.mlp.down]
        shapes += [tuple(w.shape) for w in ws]
    return shapes + [tuple(m.lm_head_weight.shape)]


best = {}
if len(sys.argv) > 1:
    for r in json.load(open(sys.argv[1]))["results"]:
        if r["impl"] == "cuda-tma" and not r["error"]:
            key = (r["n"], r["k"], r["batch"])
            if key not in best or r["us"] < best[key][0]:
                best[key] = (r["us"], config_from_repr(r["config"]))

dev = "cuda"
for preset in ("lfm2-350m", "qwen3.5-0.8b"):
    shapes = chain_shapes(preset)
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device=dev) / k**0.5 for n, k in shapes]
    nbytes = sum(w.numel() * 2 for w in weights)
    for batch in (1, 16):
        xs = {k: torch.randn(batch, k, dtype=torch.bfloat16, device=dev) for _, k in shapes}
        outs = [torch.empty(batch, n, dtype=torch.bfloat16, device=dev) for n, _ in shapes]
        tri = [tuning.linear_config(batch, n, k, device=dev) for n, k in shapes]
        wss = [LinearWorkspace.allocate(*LinearWorkspace.needed(batch, n, c), dev) for (n, _), c in zip(shapes, tri)]
        tma_best = [best.get((n, k, batch), (None, None))[1] for n, k in shapes]
        impls = {
            "cuda-tma default": lambda pdl=False: [tma_linear(xs[w.shape[1]], w, out=o, pdl=pdl) for w, o in zip(weights, outs)],
            "cuda-tma default +pdl": lambda: impls["cuda-tma default"](True),
            "triton tuned": lambda pdl=False: [linear(xs[w.shape[1]], w, out=o, config=c, workspace=s, pdl=pdl)
                                               for w, o, c, s in zip(weights, outs, tri, wss)],
            "triton tuned +pdl": lambda: impls["triton tuned"](True),
            "cublas": lambda: [torch.mm(xs[w.shape[1]], w.t(), out=o) for w, o in zip(weights, outs)],
        }
        if best:
            impls["cuda-tma sweep-best"] = lambda pdl=False: [tma_linear(xs[w.shape[1]], w, out=o, config=c, pdl=pdl)
                                                             for w, o, c in zip(weights, outs, tma_best)]
            impls["cuda-tma sweep-best +pdl"] = lambda: impls["cuda-tma sweep-best"](True)
        for name, fn in list(impls.items()):
            try:
                ms = measure(fn, device=dev, graph=True, warmup=2, repeats=10).ms
                print(f"{preset:>13} B={batch:<2} {len(shapes)} GEMVs {nbytes / 1e6:7.1f} MB  {name:<26} "
                      f"{ms:7.3f} ms  {nbytes / ms / 1e9:6.2f} TB/s")
            except Exception as exc:
                print(f"{preset:>13} B={batch:<2} {name:<26} FAILED {type(exc).__name__}: {str(exc)[:300]}")
    weights = xs = outs = None  # freed before the next preset
    torch.cuda.empty_cache()
