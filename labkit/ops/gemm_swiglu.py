"""The MLP's gate|up projection at prompt sizes with SwiGLU in the GEMM's epilogue, in Triton.

For x [M, K] and the stacked weight [2W, K] = W_gate over W_up,

    y[m, n] = silu(g) * u,   g = round(x W_gate^T)[m, n],   u = round(x W_up^T)[m, n]

(round: to the activation dtype, as the two-step reference ``swiglu_ref(F.linear(x, w))`` rounds
the projection before the activation; silu's result is rounded too). One program per [BLOCK_M,
BLOCK_N] tile of y holds two float32 accumulators, the gate's columns n and the up's columns W + n,
and runs the K loop over both weight tiles with ``tl.dot`` (tensor cores, software-pipelined over
``num_stages``); the epilogue writes y alone. Against cuBLAS's GEMM and a SwiGLU kernel, the
[M, 2W] projection is never written nor read back: 2 x 4,096 x 9,216 x 2 bytes for LFM2-350M's
4,096-token prompt, about 0.6 ms of its 16 layers' SwiGLU kernels on an H100. That only pays if this
GEMM keeps near cuBLAS's pace. Tiles are taken in groups of ``GROUP_M`` row tiles per column
sweep, so that a wave of programs shares weight tiles in L2 (the Triton tutorial's ordering).

Measured, and so not in the fused prefill: on an H100 at 4,096 rows, a chain over every layer's
weights (python -m labkit bench tail-ops --rows --prompt 4096,
data/bench/nvidia-h100-80gb-hbm3/prompt-gate-up.json), the fastest of nine blockings took 110.7 us
for Qwen3.5-0.8B's gate|up against 114.8 for cuBLAS's GEMM and the SwiGLU kernel, 147.1 against
149.0 for LFM2-350M's (128 x 128 tiles, K tiles of 32, 8 warps, 4 to 6 stages): about 540 TFLOP/s
of the GEMM's work against cuBLAS's 720 alone, which spends what the fusion saves. Its outputs were
the same bits as cuBLAS + SwiGLU's there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .launch import FLOAT_DTYPES, TORCH_TO_TL, cast, cdiv, check_devices, check_no_overlap, check_tensor, dot, interpreter_flags


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "group_m", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two, got {v!r}")
        if min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("GemmConfig tiles need block_m, block_n, block_k >= 16 (tl.dot)")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be >= 1, got {self.num_stages!r}")


@triton.jit
def _gemm_swiglu_kernel(x_ptr, w_ptr, y_ptr, M, W, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(M, BLOCK_M) * cdiv(W, BLOCK_N)): tile (pid_m, pid_n) of y, grouped GROUP_M row
    tiles at a time."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(W, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < W
    x_at = x_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]
    g_at = w_ptr + rn.to(tl.int64)[:, None] * K + rk[None, :]
    u_at = g_at + W.to(tl.int64) * K
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        xt = tl.load(x_at + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        gt = tl.load(g_at + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        ut = tl.load(u_at + k0, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = dot(xt, tl.trans(gt), acc_g, DOT_F32)
        acc_u = dot(xt, tl.trans(ut), acc_u, DOT_F32)
    g = cast(acc_g, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    u = cast(acc_u, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    s = cast(g / (1.0 + tl.exp(-g)), OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * W + rn[None, :], cast(s * u, OUT_DTYPE, EMULATE_RTNE),
             mask=m_ok[:, None] & n_ok[None, :])


def gemm_swiglu(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``swiglu_ref(F.linear(x, weight))`` for x [..., K] contiguous and ``weight`` [2W, K] (W_gate
    over W_up), one dtype: [..., W], in one kernel (the module's docstring)."""
    cfg = config or GemmConfig()
    if not isinstance(cfg, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(cfg).__name__}")
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(None, None))
    rows_w, K = weight.shape
    if rows_w % 2:
        raise ValueError(f"weight stacks W_gate over W_up: its rows must be even, got {rows_w}")
    W = rows_w // 2
    check_tensor("x", x, dtype=weight.dtype)
    if x.shape[-1] != K:
        raise ValueError(f"x must end in K = {K} columns (weight's), got {list(x.shape)}")
    M = x.numel() // K
    if out is None:
        out = torch.empty(*x.shape[:-1], W, dtype=x.dtype, device=x.device)
    check_tensor("out", out, dtype=x.dtype, shape=(*x.shape[:-1], W))
    check_devices(x=x, weight=weight, out=out)
    check_no_overlap([("x", x, "out", out), ("weight", weight, "out", out)])
    if M == 0:
        return out
    grid = (cdiv(M, cfg.block_m) * cdiv(W, cfg.block_n),)
    _gemm_swiglu_kernel[grid](
        x, weight, out, M, W, K, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, OUT_DTYPE=TORCH_TO_TL[x.dtype], **interpreter_flags(x.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
