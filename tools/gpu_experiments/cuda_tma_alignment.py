"""The article's "10x slower unless 64-byte aligned" claim, measured with the TMA GEMV: the same
weight matrix streamed from bases 0, 16, 32, 64 and 128 bytes past a 256-byte boundary (TMA needs 16;
8 is an error), and with a row stride padded by 8 elements (rows 16- but not 128-byte aligned).
Timed in a CUDA graph over copies that exceed the L2; prints us and GB/s per case."""

import torch

from labkit import cuda
from labkit.lab.timing import cold_l2_copies, measure

N, K = 4096, 4096  # 32 MB
for batch in (1, 16):
    x = torch.randn(batch, K, dtype=torch.bfloat16, device="cuda")
    for pad in (0, 8):
        stride = K + pad
        copies = cold_l2_copies(2 * N * stride)
        bases = [torch.randn(N * stride + 256, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        for offset_bytes in (0, 16, 32, 64, 128, 8):
            e = offset_bytes // 2
            ws = [b[e:e + N * stride].view(N, stride)[:, :K] for b in bases]
            outs = [torch.empty(batch, N, dtype=torch.bfloat16, device="cuda") for _ in ws]
            try:
                ref = x @ ws[0].t()
                got = cuda.tma_linear(x, ws[0])
                err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
                us = measure([lambda w=w, o=o: cuda.tma_linear(x, w, out=o) for w, o in zip(ws, outs)],
                             graph=True, repeats=10).us
                print(f"B={batch:<2} row stride {stride} ({2 * stride % 128} B past 128) base +{offset_bytes:>3} B: "
                      f"{us:7.2f} us {2 * N * K / us / 1e3:7.0f} GB/s  rel err {err:.1e}")
            except (ValueError, RuntimeError) as exc:
                print(f"B={batch:<2} row stride {stride} base +{offset_bytes:>3} B: error: {exc}")
        del bases
