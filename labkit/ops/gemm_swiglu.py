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

Two forms (``GemmConfig.persistent``):

- pointer loads, one program per tile (the grid is every tile): each program pays its pipeline's
  fill and its epilogue with nothing to overlap them, and at K = 1,024 the K loop is only 16 tiles
  of 64 long;
- persistent, through the tensor memory accelerator: one program per SM (``programs``) takes
  tiles p, p + programs, ... in the same grouped order, every x, gate and up tile a TMA copy from
  a host-built tensor map (zero-filled past M, W and K, so no masks), y a TMA store (clipped at
  the edges). ``flatten`` asks the compiler to pipeline the tile and K loops as one.

Measured on an H100 (2026-12-06, a chain over every layer's weights, cuBLAS's GEMM alone beside;
python -m labkit bench tail-ops --rows --prompt 4096 1024 --name prompt-gate-up-tma,
data/bench/nvidia-h100-80gb-hbm3/prompt-gate-up-tma.json), at 4,096 rows:

=============  ==============  ===============  =================  ============
model          cuBLAS + SwiGLU  cuBLAS GEMM only  pointer form best  persistent
=============  ==============  ===============  =================  ============
Qwen3.5-0.8B   116.7 us         89.4 us          111.6 us           98.4 us
LFM2-350M      150.0 us         115.8 us         154.9 us           127.9 us
=============  ==============  ===============  =================  ============

The persistent form at 128 x 128 tiles (two accumulators: 128 x 256 of weights a tile), K tiles
of 64, 8 warps, 3 stages, not flattened was the fastest of 28 persistent blockings for both models
(flattened: 113.4 us; ~610 TFLOP/s of the GEMM's work against cuBLAS's ~720 alone), the same bits
as cuBLAS + SwiGLU. At 1,024 rows it was level or ahead (29.4 against 32.3 us, 43.1 against
43.8). In the whole 4,096-token prefill the MLP's gate|up takes it from 1,024 rows on (the
``prompt_gate_up`` tuning section; :func:`labkit.ops.prefill_fusions.gate_up_swiglu`): in one
call on that H100 the prefill went from 13.08 to 12.59 ms for Qwen3.5-0.8B and from 5.57 to 5.13 ms
for LFM2-350M (wall, median of 10; device busy 12.65 -> 12.22 and 5.27 -> 4.80 ms), within the
float32 check's bound (python -m labkit bench prefill-profile, prefill-profile-base10.json against
prefill-profile-prompt-gemm.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .features import features
from .launch import (FLOAT_DTYPES, TORCH_TO_TL, cast, cdiv, check_devices, check_no_overlap, check_tensor,
                     device_function, dot, interpreter_flags, num_sms)


@dataclass(frozen=True)
class GemmConfig:
    """A blocking of :func:`gemm_swiglu`. ``persistent``: the TMA form (one program per SM taking
    tiles in turn, ``programs`` of them, 0 = the SM count; ``flatten`` and ``split_store`` as in
    ``_gemm_swiglu_persistent_kernel``), else one program per tile with pointer loads."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    persistent: bool = False
    flatten: bool = True
    split_store: bool = False
    programs: int = 0

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "group_m", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name} must be a power of two, got {v!r}")
        if min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("GemmConfig tiles need block_m, block_n, block_k >= 16 (tl.dot)")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages must be >= 1, got {self.num_stages!r}")
        if not isinstance(self.programs, int) or self.programs < 0:
            raise ValueError(f"GemmConfig.programs must be >= 0 (0: one per SM), got {self.programs!r}")
        if self.persistent and max(self.block_m, self.block_n, self.block_k) > 256:
            raise ValueError("a TMA box side holds at most 256 elements: the persistent form needs tiles <= 256")


@device_function
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of the tile-th tile, ``GROUP_M`` row tiles at a time per column sweep."""
    in_group = GROUP_M * tiles_n
    first_m = (tile // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % in_group) % group_rows, (tile % in_group) // group_rows


@device_function
def _swiglu_tile(acc_g, acc_u, OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """silu(g) * u of the two float32 accumulators, rounded as the two-step reference rounds."""
    g = cast(acc_g, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    u = cast(acc_u, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    s = cast(g / (1.0 + tl.exp(-g)), OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    return cast(s * u, OUT_DTYPE, EMULATE_RTNE)


@triton.jit
def _gemm_swiglu_kernel(x_ptr, w_ptr, y_ptr, M, W, K,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(M, BLOCK_M) * cdiv(W, BLOCK_N)): tile (pid_m, pid_n) of y, pointer loads."""
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(W, BLOCK_N), GROUP_M)
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
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * W + rn[None, :], _swiglu_tile(acc_g, acc_u, OUT_DTYPE, EMULATE_RTNE),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _gemm_swiglu_persistent_kernel(x_desc, g_desc, u_desc, y_desc, M, W, K, PROGRAMS: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                   GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, SPLIT_STORE: tl.constexpr,
                                   OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (PROGRAMS): program p takes tiles p, p + PROGRAMS, ... in the grouped order; every tile
    moves through TMA (loads zero-filled past M, W and K, stores clipped there). With FLATTEN the
    compiler pipelines the tile and K loops as one, so that the next tile's first loads are in
    flight during this tile's epilogue. SPLIT_STORE: y leaves in two [BLOCK_M, BLOCK_N / 2] halves
    (half the shared-memory staging of the store)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(W, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=FLATTEN):
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        om = pid_m * BLOCK_M
        on = pid_n * BLOCK_N
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            ok = ki * BLOCK_K
            xt = x_desc.load([om, ok])
            acc_g = dot(xt, tl.trans(g_desc.load([on, ok])), acc_g, DOT_F32)
            acc_u = dot(xt, tl.trans(u_desc.load([on, ok])), acc_u, DOT_F32)
        y = _swiglu_tile(acc_g, acc_u, OUT_DTYPE, EMULATE_RTNE)
        if SPLIT_STORE:
            y0, y1 = tl.split(tl.permute(tl.reshape(y, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            y_desc.store([om, on], y0)
            y_desc.store([om, on + BLOCK_N // 2], y1)
        else:
            y_desc.store([om, on], y)


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
    device = check_devices(x=x, weight=weight, out=out)
    check_no_overlap([("x", x, "out", out), ("weight", weight, "out", out)])
    if cfg.persistent:
        features(device).require("tma", "gemm_swiglu's persistent form", "Use GemmConfig(persistent=False).")
        size = x.element_size()
        if (K * size) % 16 or (W * size) % 16:
            raise ValueError(f"the persistent form's TMA tensor maps need rows of a multiple of 16 bytes: K = {K} "
                             f"and W = {W} at {size} bytes an element (use GemmConfig(persistent=False))")
    if M == 0:
        return out
    flags = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                 OUT_DTYPE=TORCH_TO_TL[x.dtype], **interpreter_flags(x.dtype), num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages)
    if not cfg.persistent:
        grid = (cdiv(M, cfg.block_m) * cdiv(W, cfg.block_n),)
        _gemm_swiglu_kernel[grid](x, weight, out, M, W, K, **flags)
        return out
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    x_desc = TensorDescriptor.from_tensor(x.view(M, K), [bm, bk])
    g_desc = TensorDescriptor.from_tensor(weight[:W], [bn, bk])
    u_desc = TensorDescriptor.from_tensor(weight[W:], [bn, bk])
    y_desc = TensorDescriptor.from_tensor(out.view(M, W), [bm, bn // 2 if cfg.split_store else bn])
    programs = min(cfg.programs or num_sms(device.index), cdiv(M, bm) * cdiv(W, bn))
    _gemm_swiglu_persistent_kernel[(programs,)](x_desc, g_desc, u_desc, y_desc, M, W, K, PROGRAMS=programs,
                                                FLATTEN=cfg.flatten, SPLIT_STORE=cfg.split_store, **flags)
    return out
