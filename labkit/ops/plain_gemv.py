"""A plain batch-1 GEMV, ``y = W x`` for W [N, K], x [1, K]: the yardstick the step's projections are
measured against when chained (:mod:`labkit.bench.chain`), in two loading styles.

- ``"pointer"``: each program owns ``BLOCK_N`` whole rows and walks K in ``BLOCK_K`` steps with
  16-byte pointer loads, products accumulated per lane and reduced across K once at the end;
- ``"descriptor"``: the same loop, each [BLOCK_N, BLOCK_K] weight tile fetched by the tensor memory
  accelerator through a host-built Triton ``TensorDescriptor`` (a TMA tensor map; each box side is
  at most 256 elements), software-pipelined ``num_stages`` deep.

No fusions, no split K: it answers "what does streaming these bytes cost in this position of the
chain", nothing else. With ``pdl`` the first weight tile is loaded before ``gdc_wait`` and the
next kernel is released at once (it waits for this whole grid before reading ``y``).
Reference: ``F.linear`` (:func:`plain_gemv_ref`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .features import features
from .launch import (FLOAT_DTYPES, TORCH_TO_TL, cdiv, check_devices, check_pdl, check_tensor, globaltimer,
                     interpreter_flags)

STYLES = ("pointer", "descriptor")


@triton.jit
def _plain_gemv_kernel(x_ptr, w_ptr, w_desc, y_ptr, stamps_ptr, N, K,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DESCRIPTOR: tl.constexpr,
                       NUM_STAGES: tl.constexpr, OUT_DTYPE: tl.constexpr, USE_PDL: tl.constexpr,
                       STAMPS: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """y[n] = sum_k W[n, k] x[k] for the BLOCK_N rows n of this program (float32 accumulation).
    STAMPS: also write (start, after the wait, end) global-timer nanoseconds per program."""
    if STAMPS:
        t_start = globaltimer()
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    # first weight tile: depends on nothing the previous kernel writes
    if DESCRIPTOR:
        w_first = w_desc.load([n0, 0])
    else:
        w_first = tl.load(rows + offs_k[None, :], mask=n_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()
    if STAMPS:
        t_wait = globaltimer()
    xv = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    lanes = w_first.to(tl.float32) * xv[None, :]
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=NUM_STAGES):
        kk = k0 + offs_k
        if DESCRIPTOR:
            wt = w_desc.load([n0, k0])
        else:
            wt = tl.load(rows + kk[None, :], mask=n_mask[:, None] & (kk[None, :] < K), other=0.0)
        xv = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
        lanes += wt.to(tl.float32) * xv[None, :]
    tl.store(y_ptr + offs_n, tl.sum(lanes, axis=1).to(OUT_DTYPE), mask=n_mask)
    if STAMPS:
        t_end = globaltimer()
        base = stamps_ptr + tl.program_id(0) * 3
        tl.store(base, t_start)
        tl.store(base + 1, t_wait)
        tl.store(base + 2, t_end)


def plain_gemv(x: torch.Tensor, weight: torch.Tensor, *, out: torch.Tensor | None = None, block_n: int = 4,
               block_k: int = 1024, style: str = "pointer", num_warps: int = 4, num_stages: int = 1,
               pdl: bool = False, stamps: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight^T`` for x [1, K], weight [N, K] (see the module docstring). ``stamps``: an int64
    [cdiv(N, block_n), 3] tensor that gets each program's (start, after the wait, end) in global-timer
    nanoseconds, for a measured timeline of overlapping kernels (GPU only)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    check_tensor("weight", weight, dtype=FLOAT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    n, k = weight.shape
    check_tensor("x", x, dtype=weight.dtype, shape=(1, k))
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if out is None:
        out = torch.empty(1, n, dtype=weight.dtype, device=weight.device)
    check_tensor("out", out, dtype=weight.dtype, shape=(1, n))
    device = check_devices(x=x, weight=weight, out=out)
    check_pdl(pdl, device)
    if stamps is not None:
        if weight.device.type != "cuda":
            raise ValueError("stamps read the GPU's global timer: they need a CUDA device")
        check_tensor("stamps", stamps, dtype=torch.int64, shape=(cdiv(n, block_n), 3))
        check_devices(x=x, stamps=stamps)
    desc = None
    if style == "descriptor":
        # before sm_90 Triton turns a descriptor into plain loads: refused, not measured under TMA's name
        features(device).require("tma", 'plain_gemv(style="descriptor")', 'Use style="pointer".')
        if block_n > 256 or block_k > 256:
            raise ValueError(f"a TMA box side holds at most 256 elements, got block_n={block_n}, block_k={block_k}")
        if (k * weight.element_size()) % 16 or weight.data_ptr() % 16:
            raise ValueError("a TMA tensor map needs a 16-byte aligned base and row stride "
                             f"(K={k} x {weight.element_size()} bytes, base {weight.data_ptr():#x})")
        from triton.tools.tensor_descriptor import TensorDescriptor

        desc = TensorDescriptor.from_tensor(weight, [block_n, block_k])
    _plain_gemv_kernel[(cdiv(n, block_n),)](
        x, weight, desc, out, stamps, n, k, BLOCK_N=block_n, BLOCK_K=block_k, DESCRIPTOR=desc is not None,
        NUM_STAGES=num_stages, OUT_DTYPE=TORCH_TO_TL[weight.dtype], USE_PDL=bool(pdl), STAMPS=stamps is not None,
        **interpreter_flags(weight.dtype), num_warps=num_warps, launch_pdl=bool(pdl),
    )
    return out


def plain_gemv_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)
