"""Smoke check of labkit.cuda.tma_linear on the GPU (used by cuda-tma.sh before the long steps): a
few shapes and configs against linear_ref, outputs poisoned with NaN; exits 1 on any error."""

import sys
import time

import torch

from labkit import cuda
from labkit.bench.ops import rel_err
from labkit.ops.linear import linear_ref

bad = 0
for n, k, b in [(64, 256, 1), (1001, 1032, 3), (1024, 4608, 16), (65536, 1024, 1)]:
    x = torch.randn(b, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
    r = torch.randn(b, n, dtype=torch.bfloat16, device="cuda")
    ref = linear_ref(x, w, residual=r)
    for cfg in [None, cuda.TmaConfig(16, 128, 2), cuda.TmaConfig(64, 256, 4), cuda.TmaConfig(32, 64, 3, split_k=2)]:
        out = torch.full_like(r, float("nan"))
        t0 = time.perf_counter()
        try:
            cuda.tma_linear(x, w, r, out=out, config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"N={n} K={k} B={b} {cfg}: ERROR {type(exc).__name__}: {exc}")
            bad += 1
            continue
        err = rel_err(out, ref)
        ok = err < 1e-2
        bad += not ok
        print(f"N={n} K={k} B={b} {cfg}: rel err {err:.2e} {'ok' if ok else 'WRONG'} ({(time.perf_counter() - t0) * 1e3:.1f} ms)")
for n, k, b in [(1001, 1032, 3), (4608, 1024, 16)]:  # SwiGLU: W [2n, k]
    x = torch.randn(b, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(2 * n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
    ref = linear_ref(x, w, swiglu=True)
    for cfg in [None, cuda.TmaConfig(16, 128, 2), cuda.TmaConfig(32, 64, 3, split_k=2)]:
        out = torch.full_like(ref, float("nan"))
        try:
            cuda.tma_linear(x, w, out=out, swiglu=True, config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:
            print(f"swiglu N={n} K={k} B={b} {cfg}: ERROR {type(exc).__name__}: {exc}")
            bad += 1
            continue
        err = rel_err(out, ref)
        bad += not err < 1e-2
        print(f"swiglu N={n} K={k} B={b} {cfg}: rel err {err:.2e} {'ok' if err < 1e-2 else 'WRONG'}")
x = 3 * torch.randn(5, 2048, dtype=torch.bfloat16, device="cuda") + 1  # RMSNorm prologue + residual
w = torch.randn(1024, 2048, dtype=torch.bfloat16, device="cuda") / 2048**0.5
r = torch.randn(5, 1024, dtype=torch.bfloat16, device="cuda")
nw = torch.rand(2048, dtype=torch.bfloat16, device="cuda")
for cfg in [None, cuda.TmaConfig(32, 64, 3, split_k=2)]:
    try:
        out = cuda.tma_linear(x, w, r, norm_weight=nw, norm_eps=1e-5, config=cfg)
        err = rel_err(out, linear_ref(x, w, residual=r, norm_weight=nw, norm_eps=1e-5))
    except Exception as exc:
        err = float("inf")
        print(f"norm: ERROR {type(exc).__name__}: {exc}")
    bad += not err < 1e-2
    print(f"norm+residual N=1024 K=2048 B=5 {cfg}: rel err {err:.2e} {'ok' if err < 1e-2 else 'WRONG'}")
sys.exit(1 if bad else 0)
