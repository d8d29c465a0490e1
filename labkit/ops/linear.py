"""Skinny GEMM for decode: ``x [M, K] @ W[N, K]^T`` for M = 1..64 rows, weights streamed once.

At decode time M is the batch (1..64) and every weight byte is read once per token, so the kernel
is a weight stream: its speed is bytes / bandwidth, provided enough programs are in flight to
keep HBM busy. Fused around the stream, so that the activations never make an extra round trip:

- prologue, optional: RMSNorm of the input rows (statistics of the whole K-row, taken in float32;
  weight ``w`` or ``1 + w``), exactly the block's pre-norm;
- epilogue, one of: plain store; residual add ``out = residual + x W^T`` (may write in place into
  the residual); SwiGLU ``out = silu(x W_g^T) * (x W_u^T)`` for stacked ``W = [W_g; W_u]``, both
  halves read by the same program; and for the LM head a per-tile (max, argmax) for greedy decode
  (reduced by :mod:`labkit.ops.greedy_head`).

Two inner loops:

- ``block_m == 1`` (batch 1): a GEMV. Each program multiplies a [BLOCK_N, BLOCK_K] weight tile
  elementwise with the input and accumulates in registers, reducing across K once at the end; no
  tensor cores, 16-byte loads along K.
- ``block_m >= 16`` (batch >= 2): ``tl.dot`` with the batch padded to the block (tensor cores).

Filling the GPU: N = 1024 outputs in blocks of 16 is 64 programs for 132 SMs. Programs can then
split K (``split_k``): each writes a float32 partial to a workspace and the last of a tile to
arrive (an atomic counter) sums the partials in a fixed order and runs the epilogue, so the result
is deterministic and still one launch. Block sizes are arguments (:class:`LinearConfig`), chosen by
:func:`linear_config` from a measured table (``TUNED``) or a heuristic. There is no
``triton.autotune``: it would benchmark by running the kernel repeatedly, which corrupts in-place
residual outputs and cannot happen inside a CUDA graph capture; ``tools/gpu_fused_check.py``
sweeps configs on the GPU instead and prints table entries.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    check_no_overlap,
    check_tensor,
    dot,
    interpreter_flags,
    interpreting,
    next_pow2,
    num_sms,
)
from .norm import rms_norm_ref


# -- kernel -------------------------------------------------------------------------------------------
@device_function
def _linear_epilogue(
    acc, acc_up, offs_m, offs_n, m_mask, n_mask, N, pid_n,
    out_ptr, res_ptr, best_val_ptr, best_idx_ptr,
    OUT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
    RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, STORE_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    mask = m_mask[:, None] & n_mask[None, :]
    offs = offs_m[:, None] * N + offs_n[None, :]
    if SWIGLU:
        # gate and up are rounded to the activation dtype first, as two separate projections would be
        gate = cast(acc, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        up = cast(acc_up, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        y = gate * tl.sigmoid(gate) * up
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
        n_tiles = tl.num_programs(0)
        tl.store(best_val_ptr + offs_m * n_tiles + pid_n, best, mask=m_mask)
        tl.store(best_idx_ptr + offs_m * n_tiles + pid_n, pid_n * BLOCK_N + idx, mask=m_mask)


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, norm_w_ptr, out_ptr, res_ptr,
    part_ptr, count_ptr, best_val_ptr, best_idx_ptr,
    M, N, K, k_per_split, eps,
    OUT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, STORE_OUT: tl.constexpr, ARGMAX: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """out[m, n] = epilogue(sum_k xn[m, k] * W[n, k]) for one [BLOCK_M, BLOCK_N] tile and one K split.

    xn = x, or with NORM: xn[m, k] = x[m, k] / sqrt(mean_k' x[m, k']^2 + eps) * w[k] (or 1 + w[k]),
    rounded to the weight dtype (what a separate norm would have stored). The epilogue adds the
    residual, or takes silu(gate) * up with up in weight rows N + n, or stores per-tile argmaxes.
    Grid: (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)); W has N rows (2N with SWIGLU), row-major.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_dtype = w_ptr.dtype.element_ty
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K  # [BLOCK_N, 1]
    x_rows = x_ptr + offs_m[:, None] * K  # [BLOCK_M, 1]
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)

    if USE_PDL:
        if BLOCK_M == 1:
            # The weights do not depend on the previous kernel: put the first tile in flight
            # before waiting for it (for K <= BLOCK_K, that is all of this program's weights).
            first_mask = n_mask[:, None] & ((k_lo + offs_k)[None, :] < k_hi)
            w_first = tl.load(w_rows + (k_lo + offs_k)[None, :], mask=first_mask, other=0.0)
            if SWIGLU:
                w_up_first = tl.load(w_rows + N * K + (k_lo + offs_k)[None, :], mask=first_mask, other=0.0)
        gdc_wait()  # the input rows come from the previous kernel

    if NORM:
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            xv = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & (kk[None, :] < K), other=0.0)
            xv = xv.to(tl.float32)
            sum_sq += tl.sum(xv * xv, axis=1)
        rstd = tl.rsqrt(sum_sq / K + eps)

    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc2_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        if EVEN_K:
            x_mask = m_mask[:, None]
            w_mask = n_mask[:, None]
        else:
            k_mask = kk < k_hi
            x_mask = m_mask[:, None] & k_mask[None, :]
            w_mask = n_mask[:, None] & k_mask[None, :]
        xv = tl.load(x_rows + kk[None, :], mask=x_mask, other=0.0)
        if NORM:
            nw = tl.load(norm_w_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            if UNIT_OFFSET:
                nw = nw + 1.0
            xv = cast(xv.to(tl.float32) * rstd[:, None] * nw[None, :], w_dtype, EMULATE_RTNE)
        if USE_PDL and BLOCK_M == 1:
            if k0 == k_lo:
                w = w_first
            else:
                w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
            if SWIGLU:
                if k0 == k_lo:
                    w_up = w_up_first
                else:
                    w_up = tl.load(w_rows + N * K + kk[None, :], mask=w_mask, other=0.0)
        else:
            w = tl.load(w_rows + kk[None, :], mask=w_mask, other=0.0)
            if SWIGLU:
                w_up = tl.load(w_rows + N * K + kk[None, :], mask=w_mask, other=0.0)
        if BLOCK_M == 1:
            xf = xv.to(tl.float32)  # [1, BLOCK_K], broadcast over the weight rows
            acc2 += w.to(tl.float32) * xf
            if SWIGLU:
                acc2_up += w_up.to(tl.float32) * xf
        else:
            acc = dot(xv, tl.trans(w), acc, DOT_F32)
            if SWIGLU:
                acc_up = dot(xv, tl.trans(w_up), acc_up, DOT_F32)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]
        acc_up = tl.sum(acc2_up, axis=1)[None, :]

    if USE_PDL:
        gdc_launch_dependents()

    if SPLIT_K == 1:
        _linear_epilogue(
            acc, acc_up, offs_m, offs_n, m_mask, n_mask, N, pid_n,
            out_ptr, res_ptr, best_val_ptr, best_idx_ptr,
            OUT_DTYPE, BLOCK_N, RESIDUAL, SWIGLU, STORE_OUT, ARGMAX, EMULATE_RTNE,
        )
    else:
        # partials[s, m, n] (float32, n over all weight rows), then the last program of the tile sums
        rows_w = 2 * N if SWIGLU else N
        tile_mask = m_mask[:, None] & n_mask[None, :]
        part = part_ptr + offs_m[:, None] * rows_w + offs_n[None, :]
        tl.store(part + pid_k * M * rows_w, acc, mask=tile_mask)
        if SWIGLU:
            tl.store(part + pid_k * M * rows_w + N, acc_up, mask=tile_mask)
        tile = pid_m * tl.num_programs(0) + pid_n
        if arrive(count_ptr + tile, SPLIT_K):
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(part + s * M * rows_w, mask=tile_mask, other=0.0, cache_modifier=".cg")
                if SWIGLU:
                    total_up += tl.load(part + s * M * rows_w + N, mask=tile_mask, other=0.0, cache_modifier=".cg")
            _linear_epilogue(
                total, total_up, offs_m, offs_n, m_mask, n_mask, N, pid_n,
                out_ptr, res_ptr, best_val_ptr, best_idx_ptr,
                OUT_DTYPE, BLOCK_N, RESIDUAL, SWIGLU, STORE_OUT, ARGMAX, EMULATE_RTNE,
            )


# -- configuration ------------------------------------------------------------------------------------
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


def m_bucket(m: int) -> int:
    """Batches that share a configuration: 1, then 16, 32, 64 (tl.dot pads M to these)."""
    return 1 if m == 1 else max(16, next_pow2(m))


# Measured winners, keyed by (m_bucket(M), N outputs, K, swiglu). Filled from the sweep that
# tools/gpu_fused_check.py prints on a GPU; anything missing falls back to the heuristic below.
TUNED: dict[tuple[int, int, int, bool], LinearConfig] = {}


def linear_config(m: int, n: int, k: int, swiglu: bool = False) -> LinearConfig:
    """The configuration for an [m, k] x [n (x2 with swiglu), k]^T product.

    Heuristic, for a memory-bound stream: about 8-16 KB of weights per program per iteration, and
    at least ~4 programs per SM (2 with tl.dot tiles, which pipeline their loads), splitting K when
    the output tiles alone cannot provide them.
    """
    bucket = m_bucket(m)
    tuned = TUNED.get((bucket, n, k, swiglu))
    if tuned is not None:
        return tuned
    if interpreting():
        # few large programs: the interpreter pays per program, not per byte
        return LinearConfig(bucket, min(512, next_pow2(n)), min(128, next_pow2(k)))
    sms = num_sms()
    if bucket == 1:
        # GEMV: about 8 KB of weights per program and iteration, K blocks that divide K (no masks)
        block_k = 512 if swiglu else 1024
        while block_k > 64 and (block_k > next_pow2(k) or k % block_k):
            block_k //= 2
        block_n = 16
        while block_n > 2 and cdiv(n, block_n) < 4 * sms:
            block_n //= 2
        while block_n * block_k > (2048 if swiglu else 4096) and block_k > 128:
            block_k //= 2
        return LinearConfig(1, block_n, block_k, 1, num_warps=4, num_stages=1)
    # tl.dot tiles: split K (evenly) until there are ~2 programs per SM
    block_n = 16 if n <= 8192 else 64
    tiles = cdiv(n, block_n) * cdiv(m, bucket)
    best = None
    for block_k in ((256, 128, 64) if bucket < 64 else (128, 64)):
        if k % block_k:
            continue
        split = 1
        while tiles * split < 2 * sms and split < 16 and k % (2 * split * block_k) == 0:
            split *= 2
        if best is None or tiles * split > tiles * best[1]:
            best = (block_k, split)
        if tiles * split >= 2 * sms:
            break
    block_k, split = best if best is not None else (min(64, max(16, next_pow2(k))), 1)
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
    def needed(m: int, n: int, k: int, swiglu: bool, config: LinearConfig) -> tuple[int, int]:
        """(partials, counters) elements a launch with this config needs."""
        if config.split_k == 1:
            return 0, 0
        rows_w = 2 * n if swiglu else n
        return config.split_k * m * rows_w, cdiv(n, config.block_n) * cdiv(m, config.block_m)

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
    config: LinearConfig | None = None,
    workspace: LinearWorkspace | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``epilogue(prologue(x) @ weight^T)`` for x [M, K], weight [N, K] (``[2I, K]`` with swiglu).

    - ``norm_weight`` [K]: RMSNorm the rows of x first (``norm_unit_offset``: weight ``1 + w``);
    - ``residual`` [M, N]: return ``residual + x W^T``; with ``out=None`` it is written in place
      into ``residual`` (``out`` may also be ``residual`` itself);
    - ``swiglu``: return ``silu(x W_g^T) * (x W_u^T)`` [M, I] for ``weight = [W_g; W_u]``.

    All of x, weight, out, residual share one float dtype; accumulation is float32.
    """
    return launch_linear(
        x, weight, out=out, residual=residual, norm_weight=norm_weight, norm_eps=norm_eps,
        norm_unit_offset=norm_unit_offset, swiglu=swiglu, config=config, workspace=workspace, pdl=pdl,
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
    config: LinearConfig | None = None,
    workspace: LinearWorkspace | None = None,
    pdl: bool = False,
    store_out: bool = True,
    best_val: torch.Tensor | None = None,
    best_idx: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """:func:`linear`, plus the greedy-head epilogue (``best_val``/``best_idx`` [M, n_tiles])."""
    check_tensor("weight", weight, dtype=FLOAT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    rows_w, k = weight.shape
    if swiglu and rows_w % 2:
        raise ValueError(f"a swiglu weight stacks gate over up and needs an even row count, got {rows_w}")
    n = rows_w // 2 if swiglu else rows_w
    dtype = weight.dtype
    check_tensor("x", x, dtype=dtype, shape=(None, k))
    m = x.shape[0]
    if m < 1 or k < 1:
        raise ValueError(f"x must have at least one row and one column, got {list(x.shape)}")
    if swiglu and residual is not None:
        raise ValueError("swiglu and residual epilogues cannot be combined")
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
    check_devices(x=x, weight=weight, out=out, residual=residual, norm_weight=norm_weight)
    check_no_overlap([("x", x, "out", out), ("weight", weight, "out", out)])
    if residual is not None and out is not None and out.data_ptr() != residual.data_ptr():
        check_no_overlap([("residual", residual, "out", out)])

    cfg = config or linear_config(m, n, k, swiglu)
    if not isinstance(cfg, LinearConfig):
        raise TypeError(f"config must be a LinearConfig, got {type(cfg).__name__}")
    k_per_split = cdiv(cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    even_k = k % cfg.block_k == 0 and k_per_split * cfg.split_k == k
    grid = (cdiv(n, cfg.block_n), cfg.split_k, cdiv(m, cfg.block_m))

    part = count = None
    if cfg.split_k > 1:
        need_p, need_c = LinearWorkspace.needed(m, n, k, swiglu, cfg)
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
    argmax = best_val is not None
    if argmax:
        tiles = grid[0]
        check_tensor("best_val", best_val, dtype=torch.float32, shape=(m, tiles))
        check_tensor("best_idx", best_idx, dtype=torch.int32, shape=(m, tiles))

    _linear_kernel[grid](
        x, weight, norm_weight, out, residual,
        part, count, best_val, best_idx,
        m, n, k, k_per_split, float(norm_eps),
        OUT_DTYPE=TORCH_TO_TL[dtype],
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        NORM=norm_weight is not None, UNIT_OFFSET=bool(norm_unit_offset),
        RESIDUAL=residual is not None, SWIGLU=bool(swiglu), STORE_OUT=out is not None and store_out,
        ARGMAX=argmax, EVEN_K=even_k, USE_PDL=bool(pdl), **interpreter_flags(dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=bool(pdl),
    )
    return out


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
) -> torch.Tensor:
    """What the reference model computes: a separate norm, F.linear, then the residual add or
    SwiGLU, each rounded to the activation dtype."""
    if norm_weight is not None:
        x = rms_norm_ref(x, norm_weight, norm_eps, norm_unit_offset)
    y = F.linear(x, weight)
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if residual is not None:
        return residual + y
    return y
