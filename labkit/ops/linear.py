"""Skinny GEMM for decode: ``x [M, K] @ W[N, K]^T`` for M = 1..64 rows (more in tiles of 64), weights streamed once.

At decode time M is the batch (1..64) and every weight byte is read once per token, so the kernel
is a weight stream: its speed is bytes / bandwidth, provided enough programs are in flight to
keep HBM busy. Fused around the stream, so that the activations never make an extra round trip:

- prologue, optional: RMSNorm of the input rows (statistics of the whole K-row, taken in float32;
  weight ``w`` or ``1 + w``), exactly the block's pre-norm;
- epilogue, one of: plain store; residual add ``out = residual + x W^T`` (may write in place into
  the residual); SwiGLU ``out = silu(x W_g^T) * (x W_u^T)`` for stacked ``W = [W_g; W_u]``, both
  halves read by the same program; LFM2's gated short conv for ``W = [W_B; W_C; W_x]`` (the
  program owns channels n of all three, and so their conv state: the whole conv mixer before
  out_proj is one launch); and for the LM head a per-tile (max, argmax) for greedy decode
  (reduced by :mod:`labkit.ops.greedy_head`).

Two inner loops:

- ``block_m == 1`` (batch 1): a GEMV. Each program multiplies a [BLOCK_N, BLOCK_K] weight tile
  elementwise with the input and accumulates in registers, reducing across K once at the end; no
  tensor cores, 16-byte loads along K.
- ``block_m >= 16`` (batch >= 2): ``tl.dot`` with the batch padded to the block (tensor cores).

Filling the GPU: N = 1024 outputs in blocks of 16 is 64 programs for an H200's 132 SMs. Programs
can then split K (``split_k``): each writes a float32 partial to a workspace and the last of a tile
to arrive (an atomic counter) sums the partials in a fixed order and runs the epilogue, so the
result is deterministic and still one launch. The GEMV loop is not software-pipelined, so its memory
parallelism comes from programs: ~8 KB of weights per program and iteration, ~4 programs per SM,
split K where the rows alone do not give that (LFM2's down projection: 128 row tiles x 9 splits).
It requests weights first, as the plain GEMV (:mod:`labkit.ops.plain_gemv`) does: the first K tile
of every row block is loaded before the input row, before the norm's reduction and (with preload)
before the PDL wait, so that the HBM latency of the stream overlaps them instead of following them;
that first tile is peeled off the loop, and when it spans the whole row the norm's statistics are
taken from the same registers. (Loading the input and reducing it first, as this kernel did until
2026-12-01, put one L2 round trip and a block-wide reduction ahead of every projection's stream.)
With programmatic dependent launch (``pdl=True``, Hopper+) the kernel may start while the
previous one still runs: its weights depend on nothing that kernel writes, so the first K tile of
each program can be loaded before ``gdc_wait``, and the next kernel can be released
(``gdc_launch_dependents``) at once, after the wait, or after the K loop (:class:`PdlPlacement`).
Any release point is safe: the next kernel's own wait orders it after this whole grid. The default
(preload, release early) is the heuristic; the placement measured fastest on a GPU in the chained
step (``python -m labkit bench chain --placements ...``) is in its tuning file.
Block sizes are arguments (:class:`LinearConfig`), chosen by :func:`linear_config` from a table of
measured winners, when the caller passes one, or a heuristic. There is no ``triton.autotune``: it
would benchmark by running the kernel repeatedly, which corrupts in-place residual outputs and
cannot happen inside a CUDA graph capture. ``python -m labkit tune`` sweeps configs on the GPU
instead and writes the winners to ``data/tuning/<gpu>.json``, which :mod:`labkit.tuning` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .launch import (
    device_function,
    FLOAT_DTYPES,
    TORCH_TO_TL,
    arrive,
    cast,
    cdiv,
    check_devices,
    check_eps,
    check_pdl,
    check_no_overlap,
    check_tensor,
    dot,
    interpreter_flags,
    interpreting,
    next_pow2,
    num_sms,
    wait_until,
)
from .norm import rms_norm_ref


# -- kernel -------------------------------------------------------------------------------------------
@device_function
def _linear_epilogue(
    acc, acc1, acc2, offs_m, offs_n, m_mask, n_mask, N, pid_n, n_tiles,
    out_ptr, res_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
    OUT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, KW: tl.constexpr,
    RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, SHORT_CONV: tl.constexpr,
    STORE_OUT: tl.constexpr, ARGMAX: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    mask = m_mask[:, None] & n_mask[None, :]
    offs = offs_m[:, None] * N + offs_n[None, :]
    if SWIGLU:
        # gate and up are rounded to the activation dtype first, as two separate projections would be
        gate = cast(acc, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        up = cast(acc1, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
    elif SHORT_CONV:
        # LFM2's gated short conv on this tile's channels (see labkit.ops.short_conv): the rows of
        # B, C and x for channels n are this program's, so is their conv state.
        gate_b = cast(acc, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        gate_c = cast(acc1, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        xv = cast(acc2, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        bx = cast(gate_b * xv, OUT_DTYPE, EMULATE_RTNE)
        state = conv_state_ptr + offs_m[:, None] * ((KW - 1) * N) + offs_n[None, :]
        y = tl.zeros(acc.shape, dtype=tl.float32)
        for j in tl.static_range(KW - 1):
            w_j = tl.load(conv_w_ptr + offs_n * KW + j, mask=n_mask, other=0.0).to(tl.float32)
            y += tl.load(state + j * N, mask=mask, other=0.0).to(tl.float32) * w_j[None, :]
        w_last = tl.load(conv_w_ptr + offs_n * KW + KW - 1, mask=n_mask, other=0.0).to(tl.float32)
        y += bx.to(tl.float32) * w_last[None, :]
        tl.debug_barrier()  # the shift is in place: all reads of the old window first
        for j in tl.static_range(KW - 2):
            # Replicated lanes hold the same element: each row's loads must all come before any
            # thread overwrites that row in the next iteration (or with bx below).
            later = tl.load(state + (j + 1) * N, mask=mask, other=0.0)
            tl.debug_barrier()
            tl.store(state + j * N, later, mask=mask)
            tl.debug_barrier()
        tl.store(state + (KW - 2) * N, bx, mask=mask)
        y = gate_c * y
    elif RESIDUAL:
        y = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32) + acc
        tl.debug_barrier()  # out may be the residual itself: all reads before any write
    else:
        y = acc
    y = cast(y, OUT_DTYPE, EMULATE_RTNE)
    if STORE_OUT:
        tl.store(out_ptr + offs, y, mask=mask)
    if ARGMAX:
        # the argmax of the logits as stored (rounded), first index on ties, like torch.argmax
        vals = tl.where(n_mask[None, :], y.to(tl.float32), float("-inf"))
        best = tl.max(vals, axis=1)
        idx = tl.argmax(vals, axis=1, tie_break_left=True)
        tl.store(best_val_ptr + offs_m * n_tiles + pid_n, best, mask=m_mask)
        tl.store(best_idx_ptr + offs_m * n_tiles + pid_n, pid_n * BLOCK_N + idx, mask=m_mask)


@device_function
def linear_tile(
    pid_n, pid_k, pid_m, n_tiles, wait_ptr, wait_target,
    x_ptr, w_ptr, norm_w_ptr, out_ptr, res_ptr,
    part_ptr, count_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
    M, N, K, k_per_split, eps,
    OUT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ROW_BLOCKS: tl.constexpr, KW: tl.constexpr,
    NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, SHORT_CONV: tl.constexpr,
    STORE_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
    PRELOAD: tl.constexpr, RELEASE: tl.constexpr, WHOLE_ROW: tl.constexpr, WAIT_COUNTER: tl.constexpr,
):
    """out[m, n] = epilogue(acc_0..acc_{R-1}) for one [BLOCK_M, BLOCK_N] tile and one K split, with

        acc_r[m, n] = sum_k xn[m, k] * W[r * N + n, k]        r < ROW_BLOCKS (1; 2 for SwiGLU; 3 for the short conv)
        xn = x, or with NORM: xn[m, k] = x[m, k] / sqrt(mean_k' x[m, k']^2 + eps) * w[k] (or 1 + w[k]),

    xn rounded to the weight dtype (what a separate norm would have stored). The epilogue adds the
    residual (loaded after the K loop), or takes silu(acc_0) * acc_1, or runs the gated short conv on
    (B, C, x) = (acc_0, acc_1, acc_2) with its state, or stores per-tile argmaxes.
    W is [ROW_BLOCKS * N, K], row-major. The tile is (pid_n, pid_k, pid_m) of a grid of
    (n_tiles = cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)): :func:`_linear_kernel` runs one tile
    per program; the persistent decode kernel runs many per program, and with WAIT_COUNTER the
    tile waits for ``*wait_ptr >= wait_target`` (its input's producers, counted) where a PDL launch
    would wait for the previous grid: after the first weight tile is requested (PRELOAD), before
    the input is read.
    """
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_dtype = w_ptr.dtype.element_ty
    w0 = w_ptr + offs_n[:, None].to(tl.int64) * K  # [BLOCK_N, 1] rows of block 0
    w1 = w0 + N * K  # block 1 (SwiGLU's up, the conv's C)
    w2 = w1 + N * K  # block 2 (the conv's x)
    x_rows = x_ptr + offs_m[:, None] * K  # [BLOCK_M, 1]
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)

    # Programmatic dependent launch (USE_PDL): this kernel may start while the previous one still
    # runs. RELEASE says when the next kernel may be scheduled: 1 at once (its own wait still orders
    # it after this whole grid, so releasing early is always safe; it lets the next kernel's programs
    # take SMs as this one's tail frees them), 2 after the wait, 0 after the K loop.
    if BLOCK_M == 1:
        # GEMV, weights first: the first K tile of every row block is requested before anything
        # else (before the PDL wait with PRELOAD: weights depend on nothing launched before), so
        # its HBM latency overlaps the input's load and the norm's reduction instead of following
        # them. The first tile is peeled off the loop; with WHOLE_ROW it is all of K and the norm's
        # statistics come from the same registers.
        kk = (k_lo + offs_k)[None, :]
        if EVEN_K:
            w_mask = n_mask[:, None]
        else:
            w_mask = n_mask[:, None] & (kk < k_hi)
        if PRELOAD:
            wt0 = tl.load(w0 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 2:
                wt1 = tl.load(w1 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 3:
                wt2 = tl.load(w2 + kk, mask=w_mask, other=0.0)
        if USE_PDL:
            if RELEASE == 1:
                gdc_launch_dependents()
            gdc_wait()  # the input row comes from the previous kernel
            if RELEASE == 2:
                gdc_launch_dependents()
        if WAIT_COUNTER:
            wait_until(wait_ptr, wait_target)
        if not PRELOAD:
            wt0 = tl.load(w0 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 2:
                wt1 = tl.load(w1 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 3:
                wt2 = tl.load(w2 + kk, mask=w_mask, other=0.0)
        xf = tl.load(x_rows + kk, mask=m_mask[:, None] & (kk < k_hi), other=0.0).to(tl.float32)  # [1, BLOCK_K]
        if NORM:
            if WHOLE_ROW:
                sum_sq = tl.sum(xf * xf, axis=1)
            else:
                # squares summed per lane, reduced across the block once (x is small and in L2)
                sq = tl.zeros([1, BLOCK_K], dtype=tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    kx = (k0 + offs_k)[None, :]
                    xs = tl.load(x_rows + kx, mask=m_mask[:, None] & (kx < K), other=0.0).to(tl.float32)
                    sq += xs * xs
                sum_sq = tl.sum(sq, axis=1)
            rstd = tl.rsqrt(sum_sq / K + eps)
            nw = tl.load(norm_w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            if UNIT_OFFSET:
                nw = nw + 1.0
            xf = cast(xf * rstd[:, None] * nw, w_dtype, EMULATE_RTNE).to(tl.float32)
        lanes0 = wt0.to(tl.float32) * xf
        if ROW_BLOCKS >= 2:
            lanes1 = wt1.to(tl.float32) * xf
        else:
            lanes1 = lanes0
        if ROW_BLOCKS >= 3:
            lanes2 = wt2.to(tl.float32) * xf
        else:
            lanes2 = lanes0
        for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
            kk = (k0 + offs_k)[None, :]
            if EVEN_K:
                w_mask = n_mask[:, None]
            else:
                w_mask = n_mask[:, None] & (kk < k_hi)
            wt0 = tl.load(w0 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 2:
                wt1 = tl.load(w1 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 3:
                wt2 = tl.load(w2 + kk, mask=w_mask, other=0.0)
            xf = tl.load(x_rows + kk, mask=m_mask[:, None] & (kk < k_hi), other=0.0).to(tl.float32)
            if NORM:
                nw = tl.load(norm_w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                if UNIT_OFFSET:
                    nw = nw + 1.0
                xf = cast(xf * rstd[:, None] * nw, w_dtype, EMULATE_RTNE).to(tl.float32)
            lanes0 += wt0.to(tl.float32) * xf
            if ROW_BLOCKS >= 2:
                lanes1 += wt1.to(tl.float32) * xf
            if ROW_BLOCKS >= 3:
                lanes2 += wt2.to(tl.float32) * xf
        acc = tl.sum(lanes0, axis=1)[None, :]
        acc1 = tl.sum(lanes1, axis=1)[None, :]
        acc2 = tl.sum(lanes2, axis=1)[None, :]
    else:
        # tl.dot tiles: the loop is software-pipelined, the wait stays outside it
        if USE_PDL:
            if RELEASE == 1:
                gdc_launch_dependents()
            gdc_wait()
            if RELEASE == 2:
                gdc_launch_dependents()
        if WAIT_COUNTER:
            wait_until(wait_ptr, wait_target)
        if NORM:
            # a pass over the rows first (as on main: a [BLOCK_M, BLOCK_K] accumulator held across it
            # measured slower at batch 16)
            sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kx = k0 + offs_k
                xv = tl.load(x_rows + kx[None, :], mask=m_mask[:, None] & (kx[None, :] < K), other=0.0)
                xv = xv.to(tl.float32)
                sum_sq += tl.sum(xv * xv, axis=1)
            rstd = tl.rsqrt(sum_sq / K + eps)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            kk = (k0 + offs_k)[None, :]
            if EVEN_K:
                x_mask = m_mask[:, None]
                w_mask = n_mask[:, None]
            else:
                x_mask = m_mask[:, None] & (kk < k_hi)
                w_mask = n_mask[:, None] & (kk < k_hi)
            xv = tl.load(x_rows + kk, mask=x_mask, other=0.0)
            if NORM:
                nw = tl.load(norm_w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                if UNIT_OFFSET:
                    nw = nw + 1.0
                xv = cast(xv.to(tl.float32) * rstd[:, None] * nw, w_dtype, EMULATE_RTNE)
            wt0 = tl.load(w0 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 2:
                wt1 = tl.load(w1 + kk, mask=w_mask, other=0.0)
            if ROW_BLOCKS >= 3:
                wt2 = tl.load(w2 + kk, mask=w_mask, other=0.0)
            acc = dot(xv, tl.trans(wt0), acc, DOT_F32)
            if ROW_BLOCKS >= 2:
                acc1 = dot(xv, tl.trans(wt1), acc1, DOT_F32)
            if ROW_BLOCKS >= 3:
                acc2 = dot(xv, tl.trans(wt2), acc2, DOT_F32)

    if USE_PDL and RELEASE == 0:
        gdc_launch_dependents()

    if SPLIT_K == 1:
        _linear_epilogue(
            acc, acc1, acc2, offs_m, offs_n, m_mask, n_mask, N, pid_n, n_tiles,
            out_ptr, res_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
            OUT_DTYPE, BLOCK_N, KW, RESIDUAL, SWIGLU, SHORT_CONV, STORE_OUT, ARGMAX, EMULATE_RTNE,
        )
    else:
        # partials[s, m, r * N + n] in float32; the last program of the tile sums them in split order
        rows_w = ROW_BLOCKS * N
        tile_mask = m_mask[:, None] & n_mask[None, :]
        part = part_ptr + offs_m[:, None] * rows_w + offs_n[None, :]
        mine = part + pid_k * M * rows_w
        tl.store(mine, acc, mask=tile_mask)
        if ROW_BLOCKS >= 2:
            tl.store(mine + N, acc1, mask=tile_mask)
        if ROW_BLOCKS >= 3:
            tl.store(mine + 2 * N, acc2, mask=tile_mask)
        tile = pid_m * n_tiles + pid_n
        if arrive(count_ptr + tile, SPLIT_K):
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                theirs = part + s * M * rows_w
                total += tl.load(theirs, mask=tile_mask, other=0.0, cache_modifier=".cg")
                if ROW_BLOCKS >= 2:
                    total1 += tl.load(theirs + N, mask=tile_mask, other=0.0, cache_modifier=".cg")
                if ROW_BLOCKS >= 3:
                    total2 += tl.load(theirs + 2 * N, mask=tile_mask, other=0.0, cache_modifier=".cg")
            _linear_epilogue(
                total, total1, total2, offs_m, offs_n, m_mask, n_mask, N, pid_n, n_tiles,
                out_ptr, res_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
                OUT_DTYPE, BLOCK_N, KW, RESIDUAL, SWIGLU, SHORT_CONV, STORE_OUT, ARGMAX, EMULATE_RTNE,
            )


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, norm_w_ptr, out_ptr, res_ptr,
    part_ptr, count_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
    M, N, K, k_per_split, eps,
    OUT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ROW_BLOCKS: tl.constexpr, KW: tl.constexpr,
    NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, SHORT_CONV: tl.constexpr,
    STORE_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
    PRELOAD: tl.constexpr, RELEASE: tl.constexpr, WHOLE_ROW: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)): one :func:`linear_tile` per program."""
    linear_tile(
        tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(0), count_ptr, 0,
        x_ptr, w_ptr, norm_w_ptr, out_ptr, res_ptr,
        part_ptr, count_ptr, best_val_ptr, best_idx_ptr, conv_state_ptr, conv_w_ptr,
        M, N, K, k_per_split, eps,
        OUT_DTYPE, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, ROW_BLOCKS, KW, NORM, UNIT_OFFSET,
        RESIDUAL, SWIGLU, SHORT_CONV, STORE_OUT, ARGMAX, EVEN_K, DOT_F32, EMULATE_RTNE, USE_PDL,
        PRELOAD, RELEASE, WHOLE_ROW, False,
    )


# -- configuration ------------------------------------------------------------------------------------
RELEASES = {"end": 0, "early": 1, "after_wait": 2}


@dataclass(frozen=True)
class PdlPlacement:
    """Where a PDL launch of the kernel puts its two calls: ``preload`` the first K tile of weights
    before ``gdc_wait`` (GEMV loop only: the tl.dot loop is software-pipelined and the wait stays
    outside it); ``release`` the dependents (``gdc_launch_dependents``) ``"early"`` (first thing),
    ``"after_wait"``, or at the ``"end"`` of the K loop. Without PDL it has no effect."""

    preload: bool = True
    release: str = "early"

    def __post_init__(self) -> None:
        if self.release not in RELEASES:
            raise ValueError(f"PdlPlacement.release must be one of {sorted(RELEASES)}, got {self.release!r}")


# The default placement, PdlPlacement() (preload, release early), is the heuristic; a GPU's measured
# placement is its tuning file's (labkit.tuning.pdl_placement), which the fused decoder passes.
#
# Two forms measured slower and left the kernel (their figures: data/bench/nvidia-h200/linear-variants.json):
# the tl.dot loop's norm applied after the dot (the squares summed in the loop, the float32 sums scaled
# by rstd after it: LFM2-350M's batch-16 chain 0.950 ms against 0.669), and the residual tile loaded
# right after the PDL wait (as fast or slower than after the K loop at batch 1).


@dataclass(frozen=True)
class LinearConfig:
    """Blocking of one skinny GEMM. ``block_m == 1``: GEMV loop; ``block_m >= 16``: tl.dot loop."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"LinearConfig.{name} must be a power of two, got {v}")
        if not (self.block_m == 1 or (self.block_m >= 16 and self.block_m & (self.block_m - 1) == 0)):
            raise ValueError(f"LinearConfig.block_m must be 1 or a power of two >= 16, got {self.block_m}")
        if self.block_m >= 16 and (self.block_n < 16 or self.block_k < 16):
            raise ValueError("tl.dot tiles (block_m >= 16) need block_n >= 16 and block_k >= 16")
        if self.split_k < 1:
            raise ValueError(f"LinearConfig.split_k must be >= 1, got {self.split_k}")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"LinearConfig.num_warps must be a power of two, got {self.num_warps}")


MAX_BLOCK_M = 64  # rows of one tl.dot tile: larger batches take several row tiles of 64


def m_bucket(m: int) -> int:
    """Batches that share a configuration: 1, then 16, 32, 64 (tl.dot pads M to these); batches
    past 64 share bucket 64's tiles, one program per 64 rows (a [128, K] tile of the input alone
    would hold 32 KB per 128 columns of K in registers)."""
    return 1 if m == 1 else min(MAX_BLOCK_M, max(16, next_pow2(m)))


class TuningKey(NamedTuple):
    """What a measured configuration is measured for: the batch bucket (:func:`m_bucket`), the
    outputs per row block, K, the row blocks, and whether the greedy-head epilogue runs."""

    m_bucket: int
    n: int
    k: int
    row_blocks: int = 1
    argmax: bool = False


def tuning_key(m: int, n: int, k: int, *, row_blocks: int = 1, argmax: bool = False) -> TuningKey:
    return TuningKey(m_bucket(m), n, k, row_blocks, bool(argmax))


def _split(tiles: int, iters: int, target: int, cap: int = 16) -> int:
    """The smallest divisor d of ``iters`` (so every split gets whole K blocks) with
    ``tiles * d >= target``, else the largest divisor up to ``cap``."""
    best = 1
    for d in range(1, min(iters, cap) + 1):
        if iters % d == 0:
            best = d
            if tiles * d >= target:
                break
    return best


def _block_k(k: int, largest: int) -> int:
    """The largest power of two <= ``largest`` that divides K (no K masks), at least 16."""
    block = largest
    while block > 16 and (block > next_pow2(k) or k % block):
        block //= 2
    return block


def linear_config(
    m: int,
    n: int,
    k: int,
    *,
    row_blocks: int = 1,
    argmax: bool = False,
    table: Mapping[TuningKey, LinearConfig] | None = None,
) -> LinearConfig:
    """The configuration for an [m, k] x [row_blocks * n, k]^T product with n outputs per row block
    (2 blocks for SwiGLU, 3 for the short-conv epilogue): ``table``'s entry for its
    :func:`tuning_key` where there is one (measured winners for one GPU, which
    :mod:`labkit.tuning` reads from ``data/tuning/<gpu>.json``), else the heuristic below.

    Heuristic for a memory-bound stream: each program loads ~8 KB of weights per iteration (one
    [BLOCK_N, BLOCK_K] tile per row block), K blocks divide K, and K is split
    across programs until there are ~4 programs per SM for the GEMV loop (which is not
    software-pipelined, so parallelism must come from programs) or ~2 for tl.dot tiles (which are).
    ``argmax`` (the greedy LM head) prefers taller tiles: fewer per-tile winners to reduce; an LM
    head (n >= 32768) gets them either way, so its logits and greedy paths sum in the same order.
    """
    bucket = m_bucket(m)
    tuned = None if table is None else table.get(tuning_key(m, n, k, row_blocks=row_blocks, argmax=argmax))
    if tuned is not None:
        return tuned
    if interpreting():
        # few large programs: the interpreter pays per program, not per byte
        return LinearConfig(bucket, min(512, next_pow2(n)), min(128, next_pow2(k)))
    sms = num_sms()
    if bucket == 1:
        per_matrix = next_pow2(4096 // row_blocks + 1) // 2  # elements of one block's weight tile
        block_k = _block_k(k, 256 if argmax or n >= 32768 else 1024)
        block_n = max(1, min(16, per_matrix // block_k, next_pow2(n)))
        split = _split(cdiv(n, block_n), cdiv(k, block_k), 4 * sms)
        while cdiv(n, block_n) * split < 4 * sms and block_n > 2:
            block_n //= 2
        return LinearConfig(1, block_n, block_k, split, num_warps=4, num_stages=1)
    block_n = 64 if n >= 32768 else 16  # the LM head: fewer, wider tiles
    tiles = cdiv(n, block_n) * cdiv(m, bucket)
    best: tuple[int, int] | None = None
    for block_k in ((256, 128, 64) if bucket < 64 else (128, 64)):
        if k % block_k:
            continue
        split = _split(tiles, k // block_k, 2 * sms)
        if best is None or split * tiles > best[1] * tiles:
            best = (block_k, split)
        if tiles * split >= 2 * sms:
            break
    block_k, split = best if best is not None else (max(16, min(64, next_pow2(k))), 1)
    return LinearConfig(bucket, block_n, block_k, split, num_warps=4, num_stages=3)


# -- workspace ----------------------------------------------------------------------------------------
@dataclass
class LinearWorkspace:
    """Scratch for split-K: float32 partial sums and per-tile arrival counters (kept at zero
    between launches by the kernel itself). One workspace may serve every linear of a decode step,
    since their launches do not overlap."""

    partials: torch.Tensor  # float32, flat
    counters: torch.Tensor  # int32, flat, zeros

    @staticmethod
    def needed(m: int, n: int, config: LinearConfig, row_blocks: int = 1) -> tuple[int, int]:
        """(partials, counters) elements a launch of m rows, n outputs per row block needs."""
        if config.split_k == 1:
            return 0, 0
        return config.split_k * m * row_blocks * n, cdiv(n, config.block_n) * cdiv(m, config.block_m)

    @classmethod
    def allocate(cls, partials: int, counters: int, device: torch.device | str) -> "LinearWorkspace":
        return cls(
            torch.empty(max(partials, 1), dtype=torch.float32, device=device),
            torch.zeros(max(counters, 1), dtype=torch.int32, device=device),
        )


# -- launcher -----------------------------------------------------------------------------------------
def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    swiglu: bool = False,
    short_conv: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: LinearConfig | None = None,
    workspace: LinearWorkspace | None = None,
    pdl: bool = False,
    placement: PdlPlacement | None = None,
) -> torch.Tensor:
    """``epilogue(prologue(x) @ weight^T)`` for x [M, K], weight [N, K] (``[2N, K]`` with swiglu,
    ``[3N, K]`` with short_conv).

    - ``norm_weight`` [K]: RMSNorm the rows of x first (``norm_unit_offset``: weight ``1 + w``);
    - ``residual`` [M, N]: return ``residual + x W^T``; with ``out=None`` it is written in place
      into ``residual`` (``out`` may also be ``residual`` itself);
    - ``swiglu``: return ``silu(x W_g^T) * (x W_u^T)`` [M, N] for ``weight = [W_g; W_u]``;
    - ``short_conv = (conv_state [M, KW-1, N], conv_weight [N, KW])``: LFM2's in_proj followed by
      its gated short conv (:mod:`labkit.ops.short_conv`): return ``C * conv(B * x)`` [M, N] for
      ``(B, C, x) = x W^T`` and shift ``conv_state`` in place.

    All of x, weight, out, residual (and the conv state) share one float dtype; accumulation is float32.
    """
    return launch_linear(
        x, weight, out=out, residual=residual, norm_weight=norm_weight, norm_eps=norm_eps,
        norm_unit_offset=norm_unit_offset, swiglu=swiglu, short_conv=short_conv, config=config,
        workspace=workspace, pdl=pdl, placement=placement,
    )


def launch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    swiglu: bool = False,
    short_conv: tuple[torch.Tensor, torch.Tensor] | None = None,
    config: LinearConfig | None = None,
    workspace: LinearWorkspace | None = None,
    pdl: bool = False,
    store_out: bool = True,
    best_val: torch.Tensor | None = None,
    best_idx: torch.Tensor | None = None,
    placement: PdlPlacement | None = None,
) -> torch.Tensor | None:
    """:func:`linear`, plus the greedy-head epilogue (``best_val``/``best_idx`` [M, n_tiles]) and
    the PDL placement (default ``PdlPlacement()``, the heuristic; the fused decoder passes the
    tuning file's, :func:`labkit.tuning.pdl_placement`; ignored without ``pdl``)."""
    check_tensor("weight", weight, dtype=FLOAT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    rows_w, k = weight.shape
    if swiglu and short_conv is not None:
        raise ValueError("swiglu and short_conv epilogues cannot be combined")
    row_blocks = 2 if swiglu else 3 if short_conv is not None else 1
    if rows_w % row_blocks:
        what = "stacks gate over up" if swiglu else "stacks B, C and x"
        raise ValueError(f"a {'swiglu' if swiglu else 'short_conv'} weight {what} and needs a row count "
                         f"divisible by {row_blocks}, got {rows_w}")
    n = rows_w // row_blocks
    dtype = weight.dtype
    check_tensor("x", x, dtype=dtype, shape=(None, k))
    m = x.shape[0]
    if m < 1 or k < 1:
        raise ValueError(f"x must have at least one row and one column, got {list(x.shape)}")
    if row_blocks > 1 and residual is not None:
        raise ValueError("a residual epilogue cannot be combined with swiglu or short_conv")
    conv_state = conv_weight = None
    kw = 1
    if short_conv is not None:
        if not isinstance(short_conv, tuple) or len(short_conv) != 2:
            raise TypeError("short_conv must be a (conv_state, conv_weight) tuple")
        conv_state, conv_weight = short_conv
        check_tensor("conv_weight", conv_weight, dtype=FLOAT_DTYPES, shape=(n, None))
        kw = conv_weight.shape[1]
        if kw < 2:
            raise ValueError(f"the conv needs at least 2 taps (a state to carry), got {kw}")
        check_tensor("conv_state", conv_state, dtype=dtype, shape=(m, kw - 1, n))
    if residual is not None:
        check_tensor("residual", residual, dtype=dtype, shape=(m, n))
        if out is None:
            out = residual
    if out is None and store_out:
        out = torch.empty(m, n, dtype=dtype, device=x.device)
    if out is not None:
        check_tensor("out", out, dtype=dtype, shape=(m, n))
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, dtype=FLOAT_DTYPES, shape=(k,))
        norm_eps = check_eps("norm_eps", norm_eps)
    check_pdl(pdl, check_devices(x=x, weight=weight, out=out, residual=residual, norm_weight=norm_weight,
                                 conv_state=conv_state, conv_weight=conv_weight))
    check_no_overlap([("x", x, "out", out), ("weight", weight, "out", out), ("conv_state", conv_state, "out", out),
                      ("x", x, "conv_state", conv_state)])
    if residual is not None and out is not None and out.data_ptr() != residual.data_ptr():
        check_no_overlap([("residual", residual, "out", out)])

    cfg = config or linear_config(m, n, k, row_blocks=row_blocks, argmax=best_val is not None)
    if not isinstance(cfg, LinearConfig):
        raise TypeError(f"config must be a LinearConfig, got {type(cfg).__name__}")
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = k % cfg.block_k == 0 and k_per_split * cfg.split_k == k
    grid = (cdiv(n, cfg.block_n), cfg.split_k, cdiv(m, cfg.block_m))

    part = count = None
    if cfg.split_k > 1:
        need_p, need_c = LinearWorkspace.needed(m, n, cfg, row_blocks)
        if workspace is None:
            workspace = LinearWorkspace.allocate(need_p, need_c, x.device)
        if not isinstance(workspace, LinearWorkspace):
            raise TypeError(f"workspace must be a LinearWorkspace, got {type(workspace).__name__}")
        check_tensor("workspace.partials", workspace.partials, dtype=torch.float32)
        check_tensor("workspace.counters", workspace.counters, dtype=torch.int32)
        if workspace.partials.numel() < need_p or workspace.counters.numel() < need_c:
            raise ValueError(
                f"workspace too small for split_k={cfg.split_k}: needs {need_p} partials and {need_c} counters, "
                f"has {workspace.partials.numel()} and {workspace.counters.numel()}"
            )
        check_devices(x=x, partials=workspace.partials, counters=workspace.counters)
        part, count = workspace.partials, workspace.counters
    placement = PdlPlacement() if placement is None else placement
    if not isinstance(placement, PdlPlacement):
        raise TypeError(f"placement must be a PdlPlacement, got {type(placement).__name__}")
    argmax = best_val is not None
    if argmax:
        tiles = grid[0]
        check_tensor("best_val", best_val, dtype=torch.float32, shape=(m, tiles))
        check_tensor("best_idx", best_idx, dtype=torch.int32, shape=(m, tiles))

    _linear_kernel[grid](
        x, weight, norm_weight, out, residual,
        part, count, best_val, best_idx, conv_state, conv_weight,
        m, n, k, k_per_split, float(norm_eps),
        OUT_DTYPE=TORCH_TO_TL[dtype],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        ROW_BLOCKS=row_blocks, KW=kw, NORM=norm_weight is not None, UNIT_OFFSET=bool(norm_unit_offset),
        RESIDUAL=residual is not None, SWIGLU=bool(swiglu), SHORT_CONV=short_conv is not None,
        STORE_OUT=out is not None and store_out,
        ARGMAX=argmax, EVEN_K=even_k, USE_PDL=bool(pdl), PRELOAD=bool(pdl) and placement.preload,
        RELEASE=RELEASES[placement.release], WHOLE_ROW=cfg.split_k == 1 and k <= cfg.block_k,
        **interpreter_flags(dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=bool(pdl),
    )
    return out


# -- the unfused alternative --------------------------------------------------------------------------
def linear_unfused(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    swiglu: bool = False,
    short_conv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`linear`'s function with cuBLAS doing the matmul and each fusion its own one-kernel op:
    RMSNorm (:func:`labkit.ops.prefill_fusions.rms_norm_rows`), then ``addmm`` with the residual
    as its C (one cuBLAS call; the sum is rounded once, where the reference rounds the projection
    first), or ``mm`` followed by SwiGLU (:func:`~labkit.ops.prefill_fusions.swiglu_rows`) or the
    gated short conv (:func:`labkit.ops.short_conv.short_conv_decode`, which shifts ``conv_state``
    in place as :func:`linear` does). Up to three kernels where :func:`linear` launches one: the
    alternative a batch >= 16 projection is dispatched to where cuBLAS's matmul wins by more than
    the extra launches cost. Same arguments and in-place semantics as :func:`linear`."""
    from .prefill_fusions import rms_norm_rows, swiglu_rows
    from .short_conv import short_conv_decode

    check_tensor("weight", weight, dtype=FLOAT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    check_tensor("x", x, dtype=weight.dtype, shape=(None, weight.shape[1]))
    if swiglu and short_conv is not None:
        raise ValueError("swiglu and short_conv epilogues cannot be combined")
    if residual is not None and (swiglu or short_conv is not None):
        raise ValueError("a residual epilogue cannot be combined with swiglu or short_conv")
    xn = x if norm_weight is None else rms_norm_rows(x, norm_weight, check_eps("norm_eps", norm_eps), norm_unit_offset)
    if residual is not None:
        check_tensor("residual", residual, dtype=weight.dtype, shape=(x.shape[0], weight.shape[0]))
        if out is None or out.data_ptr() == residual.data_ptr():
            return residual.addmm_(xn, weight.t())
        return torch.addmm(residual, xn, weight.t(), out=out)
    if swiglu:
        y = swiglu_rows(torch.mm(xn, weight.t()))
        return y if out is None else out.copy_(y)
    if short_conv is not None:
        return short_conv_decode(torch.mm(xn, weight.t()), short_conv[0], short_conv[1], out=out)
    return torch.mm(xn, weight.t(), out=out)


# -- reference ----------------------------------------------------------------------------------------
def linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    swiglu: bool = False,
    short_conv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """What the reference model computes: a separate norm, F.linear, then the residual add,
    SwiGLU or short conv, each rounded to the activation dtype. The conv state is not modified
    (:func:`labkit.ops.short_conv.short_conv_decode_ref` gives the new one)."""
    if norm_weight is not None:
        x = rms_norm_ref(x, norm_weight, norm_eps, norm_unit_offset)
    y = F.linear(x, weight)
    if short_conv is not None:
        from .short_conv import short_conv_decode_ref

        return short_conv_decode_ref(y, short_conv[0], short_conv[1])[0]
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if residual is not None:
        return residual + y
    return y
