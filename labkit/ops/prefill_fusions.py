"""The element-wise work of a prefill between its GEMMs, one Triton kernel per piece.

The reference computes each of these as a chain of torch ops on float32 copies of [T, width]
tensors: every op a launch and a full read and write of the tensor. Each kernel here reads its
inputs once and writes its result once, with the same float32 arithmetic and the same single
rounding to the model's dtype at the end. References (one statement of each piece of maths):

- :func:`rms_norm_rows`: :func:`labkit.ops.norm.rms_norm_ref` over the last dim;
- :func:`gdn_inputs`: :func:`labkit.ops.mixers.gdn_inputs_ref`, Gated DeltaNet from its projection
  to what the delta rule takes: for channel c of q|k|v and token t, with the KW-1 earlier raw values
  from the conv state before the first token,

      x[t, c] = silu(sum_j w[c, j] u[t - KW + 1 + j, c]),   q, k: x / sqrt(|x_head|^2 + 1e-6)
      g[t, h] = -exp(A_log[h]) softplus(a[t, h] + dt_bias[h]),   beta[t, h] = sigmoid(b[t, h])

  q, k, v come out in the projection's dtype, laid out [B, T, heads, dim] as the chunked delta
  rule reads them; g, beta float32;
- :func:`gated_rms_norm_rows`: :func:`labkit.ops.norm.gated_rms_norm_ref`,
  rmsnorm(o) * w * silu(z) per head, z read in place from the projection (a strided view);
- :func:`short_conv_prefill`: :func:`labkit.ops.mixers.short_conv_ref`, LFM2's C * conv(B * x)
  over the prompt (B * x rounded to the dtype before the conv, as the reference forms it);
- :func:`swiglu_rows`: :func:`labkit.ops.mixers.swiglu_ref`, the MLP's silu(gate) * up;
- :func:`gate_up_swiglu`: ``swiglu_ref(F.linear(x, gate_up))``, for a few rows one skinny GEMM with
  SwiGLU in its epilogue (:mod:`labkit.ops.linear`), else cuBLAS then :func:`swiglu_rows`;
- :func:`norm_rope_rows`: :func:`labkit.ops.mixers.norm_rope_ref`, attention's per-head RMSNorm
  and RoPE of q and k, read in place from the projection;
- :func:`attention_inputs`: :func:`labkit.ops.mixers.attention_inputs_ref`, the same for q and k
  with k and v written into the KV cache at their positions, one launch for the three;
- :func:`sigmoid_gate_rows`: :func:`labkit.ops.mixers.output_gate_ref`, Qwen3.5 attention's
  o * sigmoid(gate), the gate read in place from the projection;
- :func:`project_residual`: :func:`labkit.ops.mixers.project_ref` with the residual add in cuBLAS's
  epilogue (no kernel of ours: one ``addmm_``).

The two convs also write their new windows (the last KW-1 inputs) from the programs of the first
block of tokens, the only ones that read the old window: into a new tensor, or into the cache's
own (``update_state``), which spares the prefill a ``torch.cat`` and a copy per layer.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .gemm_swiglu import GemmConfig, gemm_swiglu
from .launch import (FLOAT_DTYPES, TORCH_TO_TL, cast, cdiv, check_devices, check_eps, check_no_overlap, check_tensor,
                     device_function, interpreter_flags, interpreting, next_pow2, num_sms)
from .linear import LinearConfig, linear, linear_config, m_bucket
from .mixers import GdnDims


def _rows_block(width: int) -> int:
    """Rows per program: about 4K elements a program (a few KB of registers at 4-8 warps)."""
    return max(1, min(64, 4096 // next_pow2(width)))


def _checked_block_t(block_t: int, kw: int) -> int:
    """Tokens per program of a conv over the prompt: a power of two covering the KW - 1 rows before
    it (so that only the first block of tokens reads the conv state)."""
    if not isinstance(block_t, int) or block_t < 1 or block_t & (block_t - 1) or block_t < kw - 1:
        raise ValueError(f"block_t must be a power of two >= the conv's {kw - 1} window rows, got {block_t!r}")
    return block_t


def _checked_warps(num_warps: int) -> int:
    if not isinstance(num_warps, int) or num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"num_warps must be a power of two from 1 to 32, got {num_warps!r}")
    return num_warps


# -- RMSNorm over rows ------------------------------------------------------------------------------
@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, rows, D, eps,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, UNIT_OFFSET: tl.constexpr,
                     OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(rows, BLOCK_R)): out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (w + 1 with UNIT_OFFSET)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    m = (r < rows)[:, None] & (c < D)[None, :]
    offs = r.to(tl.int64)[:, None] * D + c[None, :]
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    x = x * tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None]
    w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        w = w + 1.0
    tl.store(out_ptr + offs, cast(x * w[None, :], OUT_DTYPE, EMULATE_RTNE), mask=m)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
    """:func:`labkit.ops.norm.rms_norm_ref` in one kernel: x [..., D] (a strided view is copied
    contiguous first), weight [D]."""
    check_tensor("x", x, dtype=FLOAT_DTYPES, contiguous=False, aligned=False)
    x = x.contiguous()
    D = x.shape[-1]
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(D,), aligned=False)
    check_devices(x=x, weight=weight)
    eps = check_eps("eps", eps)
    out = torch.empty_like(x)
    rows = x.numel() // D if D else 0
    if rows == 0:
        return out
    block_r = _rows_block(D)
    _rms_norm_kernel[(cdiv(rows, block_r),)](
        x, weight, out, rows, D, eps, BLOCK_R=block_r, BLOCK_D=next_pow2(D), UNIT_OFFSET=bool(unit_offset),
        OUT_DTYPE=TORCH_TO_TL[x.dtype], **interpreter_flags(x.dtype), num_warps=4 if D <= 2048 else 8,
    )
    return out


# -- the MLP's activation ---------------------------------------------------------------------------
@triton.jit
def _swiglu_kernel(gu_ptr, out_ptr, rows, W, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr,
                   OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(rows, BLOCK_R), cdiv(W, BLOCK_W)): out = silu(gate) * up, silu rounded to the dtype first."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    m = (r < rows)[:, None] & (c < W)[None, :]
    at = gu_ptr + r[:, None] * 2 * W + c[None, :]
    g = tl.load(at, mask=m, other=0.0).to(tl.float32)
    up = tl.load(at + W, mask=m, other=0.0).to(tl.float32)
    s = cast(g / (1.0 + tl.exp(-g)), OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    tl.store(out_ptr + r[:, None] * W + c[None, :], cast(s * up, OUT_DTYPE, EMULATE_RTNE), mask=m)


def swiglu_rows(gate_up: torch.Tensor) -> torch.Tensor:
    """:func:`labkit.ops.mixers.swiglu_ref` in one kernel: gate_up [..., 2W] contiguous -> [..., W]."""
    check_tensor("gate_up", gate_up, dtype=FLOAT_DTYPES, aligned=False)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up must end in 2W (gate | up) columns, got {list(gate_up.shape)}")
    W = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], W, dtype=gate_up.dtype, device=gate_up.device)
    rows = out.numel() // W if W else 0
    if rows == 0:
        return out
    block_w = min(1024, next_pow2(W))
    block_r = max(1, 4096 // block_w)
    _swiglu_kernel[(cdiv(rows, block_r), cdiv(W, block_w))](
        gate_up, out, rows, W, BLOCK_R=block_r, BLOCK_W=block_w, OUT_DTYPE=TORCH_TO_TL[gate_up.dtype],
        **interpreter_flags(gate_up.dtype), num_warps=4,
    )
    return out


def gate_up_swiglu(x: torch.Tensor, weight: torch.Tensor, *, max_rows: int = 64, block_n: int = 64,
                   block_k: int = 128, num_warps: int = 4, num_stages: int = 4,
                   prompt: Mapping[str, Any] | None = None) -> torch.Tensor:
    """The MLP's input, ``swiglu_ref(F.linear(x, weight))`` for x [..., K] and ``weight`` [2W, K]
    (W_gate over W_up) -> [..., W].

    Up to ``max_rows`` rows (a prefix-cache hit's tail): one launch of :func:`labkit.ops.linear.linear`
    with SwiGLU in its epilogue, each program holding the gate and the up tile of its columns, so
    that neither the [rows, 2W] projection nor a second kernel exists; its blocking is
    ``block_n``, ``block_k``, ``num_warps``, ``num_stages`` (one K split: split-K's partial sums
    measured slower at 64 rows; ``block_k`` counts elements of a 16-bit model: a float32 model's
    K tiles hold as many bytes, half the elements, so that its pipeline fits shared memory).
    More rows of a 16-bit model, from ``prompt["min_rows"]`` on (the tuning section
    ``prompt_gate_up``; None or 0: never): :func:`labkit.ops.gemm_swiglu.gemm_swiglu`, a tiled GEMM
    with the same epilogue, at the blocking the rest of ``prompt`` gives (its tiles are sized for
    16-bit elements; a float32 model's prompt stays on cuBLAS). Otherwise cuBLAS's GEMM, then
    :func:`swiglu_rows`.
    The epilogues round gate and up to the dtype before silu, as the two-step reference does; only
    the sums' order differs."""
    check_tensor("x", x, dtype=FLOAT_DTYPES)
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    if rows > max_rows and prompt and 0 < prompt["min_rows"] <= rows and x.element_size() == 2:
        return gemm_swiglu(x, weight, GemmConfig(**{k: v for k, v in prompt.items() if k != "min_rows"}))
    if rows == 0 or rows > max_rows:
        return swiglu_rows(F.linear(x, weight))
    if interpreting():  # the interpreter pays per program: its own few large tiles
        config = linear_config(rows, weight.shape[0] // 2, K, row_blocks=2)
    else:
        block_k = max(16, block_k * 2 // x.element_size())
        config = LinearConfig(m_bucket(rows), block_n, block_k, 1, num_warps, num_stages)
    return linear(x.reshape(rows, K), weight, swiglu=True, config=config).view(*x.shape[:-1], -1)


# -- attention's output gate (Qwen3.5) ---------------------------------------------------------------
@triton.jit
def _sigmoid_gate_kernel(o_ptr, g_ptr, out_ptr, rows, T, H, o_sb, o_st, o_sh, o_sd, g_sb, g_st, g_sh, g_sd,
                         D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                         OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(rows, BLOCK_R)), a row per (token, head): out = o * sigmoid(gate), sigmoid rounded
    to the dtype first; o and gate read through their strides (a unit stride along D is
    specialised by Triton: contiguous loads), out contiguous."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    m = (r < rows)[:, None] & (c < D)[None, :]
    token = r // H
    bt, tt, hh = token // T, token % T, r % H
    o = tl.load(o_ptr + (bt * o_sb + tt * o_st + hh * o_sh)[:, None] + c[None, :] * o_sd, mask=m, other=0.0)
    g = tl.load(g_ptr + (bt * g_sb + tt * g_st + hh * g_sh)[:, None] + c[None, :] * g_sd, mask=m,
                other=0.0).to(tl.float32)
    s = cast(1.0 / (1.0 + tl.exp(-g)), OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    tl.store(out_ptr + r[:, None] * D + c[None, :], cast(o.to(tl.float32) * s, OUT_DTYPE, EMULATE_RTNE), mask=m)


def sigmoid_gate_rows(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`labkit.ops.mixers.output_gate_ref` in one kernel: o, gate [B, T, H, D] of one dtype, any
    strides (o: attention's output as the core leaves it, gate: a view of the projection).
    Returns a contiguous [B, T, H, D]."""
    check_tensor("o", o, dtype=FLOAT_DTYPES, shape=(None, None, None, None), contiguous=False, aligned=False)
    B, T, H, D = o.shape
    check_tensor("gate", gate, dtype=o.dtype, shape=(B, T, H, D), contiguous=False, aligned=False)
    check_devices(o=o, gate=gate)
    out = torch.empty(B, T, H, D, dtype=o.dtype, device=o.device)
    rows = B * T * H
    if rows * D == 0:
        return out
    block_r = _rows_block(D)
    _sigmoid_gate_kernel[(cdiv(rows, block_r),)](
        o, gate, out, rows, T, H, *o.stride(), *gate.stride(), D=D, BLOCK_R=block_r, BLOCK_D=next_pow2(D),
        OUT_DTYPE=TORCH_TO_TL[o.dtype], **interpreter_flags(o.dtype), num_warps=4,
    )
    return out


# -- output projections with the residual add ---------------------------------------------------------
def project_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`labkit.ops.mixers.project_ref` with the residual add inside cuBLAS's GEMM: with
    ``residual`` [..., N], ``residual += x @ weight^T`` as one ``addmm_`` (beta = 1: the epilogue
    reads residual and adds it in float32), updated in place and returned; no add kernel, no
    second pass over the [T, N] activations. Rounding: the sum is rounded once, where the
    reference rounds the projection to the dtype first and then the sum, so the two can differ by
    one unit in the last place of the dtype. x [..., K], weight [N, K], all of one dtype and device;
    residual contiguous (it is written through a [rows, N] view). Without ``residual``: F.linear."""
    if residual is None:
        return F.linear(x, weight)
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(None, None), contiguous=False, aligned=False)
    N, K = weight.shape
    check_tensor("x", x, dtype=weight.dtype, contiguous=False, aligned=False)
    check_tensor("residual", residual, dtype=weight.dtype, aligned=False)
    if x.shape[-1] != K or residual.shape != (*x.shape[:-1], N):
        raise ValueError(f"project_residual: x {list(x.shape)} @ weight^T {[K, N]} does not give residual's "
                         f"shape {list(residual.shape)}")
    if len({x.device, weight.device, residual.device}) != 1:
        raise ValueError(f"x, weight and residual must be on one device, got {x.device}, {weight.device}, {residual.device}")
    residual.view(-1, N).addmm_(x.reshape(-1, K), weight.t())
    return residual


# -- Gated DeltaNet: projection -> q, k, v, g, beta -------------------------------------------------
@device_function
def _conv_window_store(row0, st0, new_st0, ch, cmask, T, P, C, X_OFFSET, KW: tl.constexpr, KW_PAD: tl.constexpr,
                       GATED: tl.constexpr, OUT_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr,
                       EMULATE_RTNE: tl.constexpr):
    """A causal conv's new window, channels ``ch`` of one sequence: row i < KW - 1 is u[T + i] of
    u = (old window, the conv's inputs over the prompt): input row T - (KW - 1) + i, or old row
    T + i for a prompt shorter than the window; in the projection's dtype, then the state's (as the
    references' ``torch.cat`` rounds them). The input at row s, channel c is proj[s, c] (Gated
    DeltaNet's raw q|k|v, row stride P), or with GATED proj[s, c] * proj[s, c + X_OFFSET] rounded
    (LFM2's B * x).

    The window may be updated in place (``new_st0`` is ``st0``): only the calling program reads or
    writes these channels of it, and the barrier keeps every load of the old window (the caller's
    taps and the rows here) ahead of every store."""
    i = tl.arange(0, KW_PAD)
    src = T - (KW - 1) + i
    live = (i < KW - 1)[:, None] & cmask[None, :]
    fresh = live & (src >= 0)[:, None]
    at = row0 + src.to(tl.int64)[:, None] * P + ch[None, :]
    new = tl.load(at, mask=fresh, other=0.0)
    if GATED:
        x = tl.load(at + X_OFFSET, mask=fresh, other=0.0)
        new = cast(new.to(tl.float32) * x.to(tl.float32), OUT_DTYPE, EMULATE_RTNE)
    old = tl.load(st0 + (T + i)[:, None] * C + ch[None, :], mask=live & (src < 0)[:, None], other=0.0)
    win = tl.where((src >= 0)[:, None], new, cast(old, OUT_DTYPE, EMULATE_RTNE))
    tl.debug_barrier()
    tl.store(new_st0 + i[:, None] * C + ch[None, :], cast(win, STATE_DTYPE, EMULATE_RTNE), mask=live)


@triton.jit
def _gdn_inputs_kernel(
    proj_ptr, state_ptr, new_state_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,
    T, P, C,
    NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr, KW_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HEADS_FIRST: tl.constexpr,
    OUT_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (2 NK + NV, cdiv(T, BLOCK_T), B) with HEADS_FIRST, else (cdiv(T, BLOCK_T), 2 NK + NV, B):
    one head of q, k or v (j < NK: q head j; j < 2 NK: k head j - NK; else v head j - 2 NK, which
    also writes that head's g and beta) for a block of tokens of sequence b. HEADS_FIRST puts the
    heads of one block of tokens next to each other in launch order, so the programs running at
    once read whole rows of the projection rather than one head's 2 * DK bytes of many rows.

    The conv's taps read rows t - KW + 1 .. t, each tap's tile at a fixed row offset from one tile
    of pointers. Rows before the prompt (t' < 0) come from the conv state (its row KW - 1 + t'): only
    the first block of tokens reaches them (BLOCK_T >= KW - 1), so only it loads the state, and it
    also writes the new window (:func:`_conv_window_store`) to ``new_state_ptr``."""
    if HEADS_FIRST:
        j = tl.program_id(0)
        tb = tl.program_id(1)
    else:
        tb = tl.program_id(0)
        j = tl.program_id(1)
    b = tl.program_id(2)
    is_v = j >= 2 * NK
    D = tl.where(is_v, DV, DK)
    c0 = tl.where(is_v, 2 * NK * DK + (j - 2 * NK) * DV, j * DK)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    ch = c0 + d
    m = tmask[:, None] & dmask[None, :]
    row0 = proj_ptr + b.to(tl.int64) * T * P
    at = row0 + t.to(tl.int64)[:, None] * P + ch[None, :]
    st0 = state_ptr + b.to(tl.int64) * (KW - 1) * C
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for tap in tl.static_range(KW):  # tap reads KW - 1 - tap rows back from t
        xp = tl.load(at - (KW - 1 - tap) * P, mask=m & (t >= KW - 1 - tap)[:, None], other=0.0)
        x = xp.to(tl.float32)
        if tap < KW - 1:
            if tb == 0:  # the prompt's first rows: this tap reaches into the conv state (zero-filled elsewhere)
                xs = tl.load(st0 + (t + tap)[:, None] * C + ch[None, :], mask=m & (t < KW - 1 - tap)[:, None],
                             other=0.0)
                x += cast(xs, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        w = tl.load(conv_w_ptr + ch * KW + tap, mask=dmask, other=0.0).to(tl.float32)
        acc += x * w[None, :]
    acc = acc / (1.0 + tl.exp(-acc))  # silu
    if j < 2 * NK:
        acc = acc * tl.rsqrt(tl.sum(acc * acc, 1) + 1e-6)[:, None]
    token = b * T + t
    if j < NK:
        tl.store(q_ptr + (token.to(tl.int64)[:, None] * NK + j) * DK + d[None, :], cast(acc, OUT_DTYPE, EMULATE_RTNE), mask=m)
    elif j < 2 * NK:
        tl.store(k_ptr + (token.to(tl.int64)[:, None] * NK + j - NK) * DK + d[None, :], cast(acc, OUT_DTYPE, EMULATE_RTNE), mask=m)
    else:
        h = j - 2 * NK
        tl.store(v_ptr + (token.to(tl.int64)[:, None] * NV + h) * DV + d[None, :], cast(acc, OUT_DTYPE, EMULATE_RTNE), mask=m)
        gates = row0 + t.to(tl.int64) * P + C + NV * DV
        bb = tl.load(gates + h, mask=tmask, other=0.0).to(tl.float32)
        aa = tl.load(gates + NV + h, mask=tmask, other=0.0).to(tl.float32) + tl.load(dt_bias_ptr + h).to(tl.float32)
        # softplus as torch takes it: x above 20, else log(1 + e^x) (e^x itself where 1 + e^x rounds to 1)
        soft = tl.where(aa > 20.0, aa, tl.where(aa < -15.0, tl.exp(aa), tl.log(1.0 + tl.exp(aa))))
        g = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32)) * soft
        tl.store(g_ptr + token * NV + h, g, mask=tmask)
        tl.store(beta_ptr + token * NV + h, 1.0 / (1.0 + tl.exp(-bb)), mask=tmask)
    if tb == 0:
        _conv_window_store(row0, st0, new_state_ptr + b.to(tl.int64) * (KW - 1) * C, ch, dmask, T, P, C, 0,
                           KW, KW_PAD, False, OUT_DTYPE, STATE_DTYPE, EMULATE_RTNE)


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second and third axes


def gdn_inputs(
    proj: torch.Tensor,
    conv_state: torch.Tensor | None,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    dims: GdnDims,
    *,
    update_state: bool = False,
    block_t: int = 32,
    num_warps: int = 4,
    heads_first: bool = True,
) -> tuple[torch.Tensor, ...]:
    """:func:`labkit.ops.mixers.gdn_inputs_ref` in one kernel (module docstring), with q, k, v in
    ``proj``'s dtype: (q, k [B, T, nk, dk], v [B, T, nv, dv], g, beta [B, T, nv] float32, z (a view of
    proj), the new conv state). ``conv_state`` [B, KW-1, C] (None: zeros) is not modified, unless
    ``update_state``: then the kernel writes the new window into it and returns it (what the fused
    prefill asks, so that the model's copy into the cache is a no-op).

    ``block_t`` (tokens per program, a power of two >= KW - 1), ``num_warps``, ``heads_first`` (the
    grid's order, see the kernel): launch settings, any of which gives the same bits."""
    check_tensor("proj", proj, dtype=FLOAT_DTYPES, shape=(None, None, dims.proj_dim), aligned=False)
    B, T, P = proj.shape
    C = dims.conv_dim
    check_tensor("conv_weight", conv_weight, dtype=FLOAT_DTYPES, shape=(C, None), aligned=False)
    KW = conv_weight.shape[1]
    nk, nv, dk, dv = dims.num_k_heads, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim
    check_tensor("A_log", A_log, dtype=FLOAT_DTYPES, shape=(nv,), aligned=False)
    check_tensor("dt_bias", dt_bias, dtype=FLOAT_DTYPES, shape=(nv,), aligned=False)
    if KW < 2:
        raise ValueError(f"the conv needs at least 2 taps (a state to carry), got {KW}")
    if conv_state is None:
        conv_state = proj.new_zeros(B, KW - 1, C)
    check_tensor("conv_state", conv_state, dtype=FLOAT_DTYPES, shape=(B, KW - 1, C), aligned=False)
    check_devices(proj=proj, conv_state=conv_state, conv_weight=conv_weight, A_log=A_log, dt_bias=dt_bias)
    block_t = _checked_block_t(block_t, KW)
    grid_t = cdiv(T, block_t)
    if max(B, grid_t if heads_first else 2 * nk + nv) > MAX_GRID_Y:
        raise ValueError(f"{T} tokens in blocks of {block_t} at batch {B} exceed the grid's {MAX_GRID_Y} "
                         "programs per axis: a larger block_t, or heads_first=False")
    new_state = conv_state if update_state else torch.empty(conv_state.shape, dtype=conv_state.dtype, device=conv_state.device)
    dt, dev = proj.dtype, proj.device
    q = torch.empty(B, T, nk, dk, dtype=dt, device=dev)
    k = torch.empty(B, T, nk, dk, dtype=dt, device=dev)
    v = torch.empty(B, T, nv, dv, dtype=dt, device=dev)
    g = torch.empty(B, T, nv, dtype=torch.float32, device=dev)
    beta = torch.empty(B, T, nv, dtype=torch.float32, device=dev)
    heads = 2 * nk + nv
    _gdn_inputs_kernel[(heads, grid_t, B) if heads_first else (grid_t, heads, B)](
        proj, conv_state, new_state, conv_weight, A_log, dt_bias, q, k, v, g, beta, T, P, C,
        NK=nk, NV=nv, DK=dk, DV=dv, KW=KW, KW_PAD=next_pow2(KW - 1), BLOCK_T=block_t,
        BLOCK_D=max(16, next_pow2(max(dk, dv))), HEADS_FIRST=bool(heads_first),
        OUT_DTYPE=TORCH_TO_TL[dt], STATE_DTYPE=TORCH_TO_TL[conv_state.dtype], **interpreter_flags(dt),
        num_warps=_checked_warps(num_warps),
    )
    z = proj[..., C:C + dims.value_dim].reshape(B, T, nv, dv)
    return q, k, v, g, beta, z, new_state


# -- Gated DeltaNet's output norm -------------------------------------------------------------------
@triton.jit
def _gated_rms_norm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, rows, T, H, z_stride_b, z_stride_t, z_stride_h, eps,
                           D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                           OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(rows, BLOCK_R)), a row per (token, head): out = o / sqrt(mean(o^2) + eps) * w * silu(z)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_D)
    m = (r < rows)[:, None] & (c < D)[None, :]
    r64 = r.to(tl.int64)
    x = tl.load(o_ptr + r64[:, None] * D + c[None, :], mask=m, other=0.0).to(tl.float32)
    token = r64 // H
    z_offs = (token // T) * z_stride_b + (token % T) * z_stride_t + (r64 % H) * z_stride_h
    z = tl.load(z_ptr + z_offs[:, None] + c[None, :], mask=m, other=0.0)
    z = z.to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 1) / D + eps)[:, None] * w[None, :] * (z / (1.0 + tl.exp(-z)))
    tl.store(out_ptr + r64[:, None] * D + c[None, :], cast(y, OUT_DTYPE, EMULATE_RTNE), mask=m)


def gated_rms_norm_rows(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`labkit.ops.norm.gated_rms_norm_ref` in one kernel: o [B, T, H, D] contiguous, z of o's shape
    with unit stride along D (a view of the projection), weight [D]. Returns o's shape and dtype."""
    check_tensor("o", o, dtype=FLOAT_DTYPES, shape=(None, None, None, None), aligned=False)
    B, T, H, D = o.shape
    check_tensor("z", z, dtype=FLOAT_DTYPES, shape=(B, T, H, D), contiguous=False, aligned=False)
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(D,), aligned=False)
    if z.stride(3) != 1:
        raise ValueError(f"z must have unit stride along its last dim, got strides {z.stride()}")
    check_devices(o=o, z=z, weight=weight)
    eps = check_eps("eps", eps)
    out = torch.empty_like(o)
    rows = B * T * H
    block_r = _rows_block(D)
    _gated_rms_norm_kernel[(cdiv(rows, block_r),)](
        o, z, weight, out, rows, T, H, z.stride(0), z.stride(1), z.stride(2), eps, D=D, BLOCK_R=block_r, BLOCK_D=next_pow2(D),
        OUT_DTYPE=TORCH_TO_TL[o.dtype], **interpreter_flags(o.dtype), num_warps=4,
    )
    return out


# -- LFM2's gated short conv over a prompt ----------------------------------------------------------
@triton.jit
def _short_conv_prefill_kernel(proj_ptr, state_ptr, new_state_ptr, w_ptr, out_ptr, T, H,
                               KW: tl.constexpr, KW_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                               OUT_DTYPE: tl.constexpr, STATE_DTYPE: tl.constexpr, DOT_F32: tl.constexpr,
                               EMULATE_RTNE: tl.constexpr):
    """Grid (cdiv(T, BLOCK_T), cdiv(H, BLOCK_H), B): y[t, c] = C[t, c] * sum_j w[c, j] (B*x)[t - KW + 1 + j, c],
    B*x rounded to the dtype; rows before the prompt from the state, which only the first block of
    tokens reaches (BLOCK_T >= KW - 1): it also writes the new window (:func:`_conv_window_store`)."""
    tb = tl.program_id(0)
    b = tl.program_id(2)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tmask, cmask = t < T, c < H
    m = tmask[:, None] & cmask[None, :]
    row0 = proj_ptr + b.to(tl.int64) * T * 3 * H
    at = row0 + t.to(tl.int64)[:, None] * 3 * H + c[None, :]
    st0 = state_ptr + b.to(tl.int64) * (KW - 1) * H
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for tap in tl.static_range(KW):  # tap reads KW - 1 - tap rows back from t
        live = m & (t >= KW - 1 - tap)[:, None]
        bv = tl.load(at - (KW - 1 - tap) * 3 * H, mask=live, other=0.0)
        xv = tl.load(at - (KW - 1 - tap) * 3 * H + 2 * H, mask=live, other=0.0)
        u = cast(bv.to(tl.float32) * xv.to(tl.float32), OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        if tap < KW - 1:
            if tb == 0:  # the prompt's first rows: this tap reaches into the conv state (zero-filled elsewhere)
                st = tl.load(st0 + (t + tap)[:, None] * H + c[None, :], mask=m & (t < KW - 1 - tap)[:, None],
                             other=0.0)
                u += cast(st, OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
        acc += u * tl.load(w_ptr + c * KW + tap, mask=cmask, other=0.0).to(tl.float32)[None, :]
    cv = tl.load(at + H, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + (b * T + t).to(tl.int64)[:, None] * H + c[None, :], cast(cv * acc, OUT_DTYPE, EMULATE_RTNE), mask=m)
    if tb == 0:
        _conv_window_store(row0, st0, new_state_ptr + b.to(tl.int64) * (KW - 1) * H, c, cmask, T, 3 * H, H, 2 * H,
                           KW, KW_PAD, True, OUT_DTYPE, STATE_DTYPE, EMULATE_RTNE)


def short_conv_prefill(
    proj: torch.Tensor, state: torch.Tensor | None, weight: torch.Tensor, *, update_state: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`labkit.ops.mixers.short_conv_ref` in one kernel: (y [B, T, H] in proj's dtype, new state
    [B, K-1, H]). ``proj`` [B, T, 3H] contiguous; ``state`` (None: zeros) is not modified, unless
    ``update_state``: then the kernel writes the new window into it and returns it."""
    check_tensor("proj", proj, dtype=FLOAT_DTYPES, shape=(None, None, None), aligned=False)
    B, T, H3 = proj.shape
    if H3 % 3:
        raise ValueError(f"proj must be [B, T, 3H] (B | C | x), got {list(proj.shape)}")
    H = H3 // 3
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(H, None), aligned=False)
    KW = weight.shape[1]
    if KW < 2:
        raise ValueError(f"the conv needs at least 2 taps (a state to carry), got {KW}")
    if state is None:
        state = proj.new_zeros(B, KW - 1, H)
    check_tensor("state", state, dtype=FLOAT_DTYPES, shape=(B, KW - 1, H), aligned=False)
    check_devices(proj=proj, state=state, weight=weight)
    new_state = state if update_state else torch.empty(state.shape, dtype=state.dtype, device=state.device)
    out = torch.empty(B, T, H, dtype=proj.dtype, device=proj.device)
    block_h = min(256, next_pow2(H))
    block_t = max(next_pow2(KW - 1), min(32, 4096 // block_h))  # >= KW - 1: only the first block reads the state
    _short_conv_prefill_kernel[(cdiv(T, block_t), cdiv(H, block_h), B)](
        proj, state, new_state, weight, out, T, H, KW=KW, KW_PAD=next_pow2(KW - 1), BLOCK_T=block_t, BLOCK_H=block_h,
        OUT_DTYPE=TORCH_TO_TL[proj.dtype], STATE_DTYPE=TORCH_TO_TL[state.dtype], **interpreter_flags(proj.dtype),
        num_warps=8,
    )
    return out, new_state


# -- attention: per-head RMSNorm + RoPE of q and k -------------------------------------------------
@device_function
def _norm_rope_tile(x_ptr, x_row, out_ptr, out_row, rm, pos, w_ptr, inv_ptr, eps,
                    D: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
                    UNIT_OFFSET: tl.constexpr, OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Rows ``x_ptr + x_row`` (BLOCK_R offsets, unit stride along D; ``rm`` masks them) normed and
    rotated at ``pos`` (float32, one per row) into ``out_ptr + out_row``, with the angles of the
    rotated channels only: the whole row for its statistics and the pass-through channels, the two
    halves (i and i + HALF, i < HALF) as tiles of their own (second reads of the same lines) for
    the rotation."""
    c = tl.arange(0, BLOCK_D)
    cm = c < D
    m = rm[:, None] & cm[None, :]
    x = tl.load(x_ptr + x_row[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
    w = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        w = w + 1.0
    xn = cast(x * inv_rms[:, None] * w[None, :], OUT_DTYPE, EMULATE_RTNE)
    tl.store(out_ptr + out_row[:, None] + c[None, :], xn, mask=m & (c >= 2 * HALF)[None, :])
    h = tl.arange(0, BLOCK_H)
    hm = h < HALF
    mh = rm[:, None] & hm[None, :]
    xa = tl.load(x_ptr + x_row[:, None] + h[None, :], mask=mh, other=0.0).to(tl.float32)
    xb = tl.load(x_ptr + x_row[:, None] + HALF + h[None, :], mask=mh, other=0.0).to(tl.float32)
    wa = tl.load(w_ptr + h, mask=hm, other=0.0).to(tl.float32)
    wb = tl.load(w_ptr + HALF + h, mask=hm, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        wa = wa + 1.0
        wb = wb + 1.0
    xa = cast(xa * inv_rms[:, None] * wa[None, :], OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    xb = cast(xb * inv_rms[:, None] * wb[None, :], OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    freq = tl.load(inv_ptr + h, mask=hm, other=0.0)
    angle = pos[:, None] * freq[None, :]
    cos, sin = tl.cos(angle), tl.sin(angle)
    out_at = out_ptr + out_row[:, None] + h[None, :]
    tl.store(out_at, cast(xa * cos - xb * sin, OUT_DTYPE, EMULATE_RTNE), mask=mh)
    tl.store(out_at + HALF, cast(xb * cos + xa * sin, OUT_DTYPE, EMULATE_RTNE), mask=mh)


@device_function
def _norm_rope_rotated_only(x_ptr, w_ptr, pos_ptr, inv_ptr, out_ptr, rows, T, H, s_b, s_t, s_h, eps,
                            D: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_H: tl.constexpr, UNIT_OFFSET: tl.constexpr, OUT_DTYPE: tl.constexpr,
                            EMULATE_RTNE: tl.constexpr):
    """_norm_rope_kernel's rows, (token, head) each, through :func:`_norm_rope_tile` into a
    contiguous [rows, D] output."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rm = r < rows
    token = r // H
    base = (token // T) * s_b + (token % T) * s_t + (r % H) * s_h
    pos = tl.load(pos_ptr + token, mask=rm, other=0).to(tl.float32)
    _norm_rope_tile(x_ptr, base, out_ptr, r * D, rm, pos, w_ptr, inv_ptr, eps,
                    D, HALF, BLOCK_D, BLOCK_H, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)


@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, pos_ptr, inv_ptr, out_ptr, rows, T, H, s_b, s_t, s_h, eps,
                      D: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                      UNIT_OFFSET: tl.constexpr, OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr,
                      EMULATE_RTNE: tl.constexpr, ROTATED_ONLY: tl.constexpr = False,
                      BLOCK_H: tl.constexpr = 1):
    """Grid (cdiv(rows, BLOCK_R)), a row per (token, head): y = rmsnorm(x) * w rounded to the dtype,
    then channel pairs (i, i + HALF), i < HALF, rotated by pos * inv_freq[i]; channels from 2 HALF on
    pass through. Each channel's partner is loaded as a second tile (same row statistics).

    ROTATED_ONLY: cos and sin only over the HALF angles of a row (tiles of BLOCK_H >= HALF channels
    for each half), the pass-through channels stored from the full tile; else over every channel
    of the row (angle 0 past 2 HALF), which with partial RoPE (Qwen3.5: 64 of 256 channels) is 8
    times the transcendental work the rotation needs. Both give the same bits."""
    if ROTATED_ONLY:
        _norm_rope_rotated_only(x_ptr, w_ptr, pos_ptr, inv_ptr, out_ptr, rows, T, H, s_b, s_t, s_h, eps,
                                D, HALF, BLOCK_R, BLOCK_D, BLOCK_H, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)
        return
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.arange(0, BLOCK_D)
    cm = c < D
    m = (r < rows)[:, None] & cm[None, :]
    token = r // H
    base = (token // T) * s_b + (token % T) * s_t + (r % H) * s_h
    x = tl.load(x_ptr + base[:, None] + c[None, :], mask=m, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
    partner = tl.where(c < HALF, c + HALF, tl.where(c < 2 * HALF, c - HALF, c))
    xp = tl.load(x_ptr + base[:, None] + partner[None, :], mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=cm, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        w = w + 1.0
        wp = wp + 1.0
    xn = cast(x * inv_rms[:, None] * w[None, :], OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    xpn = cast(xp * inv_rms[:, None] * wp[None, :], OUT_DTYPE, EMULATE_RTNE).to(tl.float32)
    rot = c < 2 * HALF
    freq = tl.load(inv_ptr + tl.where(c < HALF, c, c - HALF), mask=rot, other=0.0)
    pos = tl.load(pos_ptr + token, mask=r < rows, other=0).to(tl.float32)
    angle = pos[:, None] * freq[None, :]
    cos, sin = tl.cos(angle), tl.sin(angle)
    y = tl.where((c < HALF)[None, :], xn * cos - xpn * sin, tl.where(rot[None, :], xn * cos + xpn * sin, xn))
    tl.store(out_ptr + r[:, None] * D + c[None, :], cast(y, OUT_DTYPE, EMULATE_RTNE), mask=m)


def norm_rope_rows(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                   eps: float, unit_offset: bool = False, *, rotated_only: bool = True,
                   num_warps: int | None = None) -> torch.Tensor:
    """:func:`labkit.ops.mixers.norm_rope_ref` in one kernel: x [B, T, H, D] with unit stride along D
    (a view of the projection), weight [D], positions [B, T] integer, inv_freq [r/2] float32.
    Returns a contiguous [B, T, H, D] in x's dtype. rotated_only: the kernel's form
    (``_norm_rope_kernel``'s ROTATED_ONLY); num_warps: its warps (None: 4 for the rotated-only form,
    8 for the other, which spills at 4 on sm_90). The defaults are the heuristic, the H200's
    measurement (its tuning file's ``norm_rope`` settings, with the figures), which the fused
    prefill passes for the GPU at hand (``labkit.tuning.settings("norm_rope")``)."""
    check_tensor("x", x, dtype=FLOAT_DTYPES, shape=(None, None, None, None), contiguous=False, aligned=False)
    B, T, H, D = x.shape
    if x.stride(3) != 1:
        raise ValueError(f"x must have unit stride along its last dim, got strides {x.stride()}")
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(D,), aligned=False)
    check_tensor("positions", positions, dtype=(torch.int32, torch.int64), shape=(B, T), aligned=False)
    check_tensor("inv_freq", inv_freq, dtype=torch.float32, shape=(None,), aligned=False)
    half = inv_freq.shape[0]
    if not 0 < 2 * half <= D:
        raise ValueError(f"inv_freq has {half} frequencies: rotating {2 * half} channels of {D}")
    check_devices(x=x, weight=weight, positions=positions, inv_freq=inv_freq)
    eps = check_eps("eps", eps)
    out = torch.empty(B, T, H, D, dtype=x.dtype, device=x.device)
    rows = B * T * H
    if rows == 0:
        return out
    block_r = _rows_block(D)
    rotated_only = bool(rotated_only)
    _norm_rope_kernel[(cdiv(rows, block_r),)](
        x, weight, positions, inv_freq, out, rows, T, H, x.stride(0), x.stride(1), x.stride(2), eps,
        D=D, HALF=half, BLOCK_R=block_r, BLOCK_D=next_pow2(D), UNIT_OFFSET=bool(unit_offset),
        OUT_DTYPE=TORCH_TO_TL[x.dtype], **interpreter_flags(x.dtype),
        ROTATED_ONLY=rotated_only, BLOCK_H=next_pow2(half),
        num_warps=num_warps or (4 if rotated_only else 8),
    )
    return out


# -- attention: q and k normed and rotated, k and v written into the cache, one launch -------------
@triton.jit
def _attention_inputs_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, pos_ptr, inv_ptr, q_out_ptr, keys_ptr, values_ptr,
                             B, T, NH, NKV, q_sb, q_st, q_sh, kv_sb, kv_st, kv_sh, c_sb, c_sh, c_sl, eps,
                             D: tl.constexpr, HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                             BLOCK_H: tl.constexpr, UNIT_OFFSET: tl.constexpr, OUT_DTYPE: tl.constexpr,
                             DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (q's row blocks + 2 x k's): q's blocks, then k's, then v's; a row is one (token, head).

        q_out[b, t, h]           = rope(rmsnorm(q[b, t, h]) * wq, pos[b, t])     contiguous
        keys[b, h, pos[b, t]]    = rope(rmsnorm(k[b, t, h]) * wk, pos[b, t])     the cache's slot
        values[b, h, pos[b, t]]  = v[b, t, h]

    (the slot of a token is its position, as :func:`labkit.ops.mixers.store_kv_ref` writes it),
    each row normed and rotated by :func:`_norm_rope_tile`, :func:`norm_rope_rows`' arithmetic (its
    row sums may add in another order where the tiles' heights differ: a float32 bit or so)."""
    pid = tl.program_id(0)
    q_blocks = tl.cdiv(B * T * NH, BLOCK_R)
    kv_blocks = tl.cdiv(B * T * NKV, BLOCK_R)
    past_q = (pid >= q_blocks).to(tl.int32)
    past_k = (pid >= q_blocks + kv_blocks).to(tl.int32)
    part = past_q + past_k
    H = NH if part == 0 else NKV
    block = pid - past_q * q_blocks - past_k * kv_blocks
    r = (block * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    rm = r < B * T * H
    token = r // H
    b, t, h = token // T, token % T, r % H
    pos_i = tl.load(pos_ptr + token, mask=rm, other=0).to(tl.int64)
    slot = b * c_sb + h * c_sh + pos_i * c_sl
    if part == 0:
        _norm_rope_tile(q_ptr, b * q_sb + t * q_st + h * q_sh, q_out_ptr, r * D, rm, pos_i.to(tl.float32), qw_ptr,
                        inv_ptr, eps, D, HALF, BLOCK_D, BLOCK_H, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)
    elif part == 1:
        _norm_rope_tile(k_ptr, b * kv_sb + t * kv_st + h * kv_sh, keys_ptr, slot, rm, pos_i.to(tl.float32), kw_ptr,
                        inv_ptr, eps, D, HALF, BLOCK_D, BLOCK_H, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)
    else:
        c = tl.arange(0, BLOCK_D)
        m = rm[:, None] & (c < D)[None, :]
        x = tl.load(v_ptr + (b * kv_sb + t * kv_st + h * kv_sh)[:, None] + c[None, :], mask=m)
        tl.store(values_ptr + slot[:, None] + c[None, :], x, mask=m)


def attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, eps: float,
                     unit_offset: bool, keys: torch.Tensor, values: torch.Tensor, *, key_positions: torch.Tensor,
                     num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`labkit.ops.mixers.attention_inputs_ref` in one launch: q and k through
    :func:`norm_rope_rows`' arithmetic, k and v written into the cache at their positions.

    q [B, T, nh, D], k, v [B, T, nkv, D] (views of the projection, unit stride along D, k and v
    with one layout); ``keys``, ``values`` [B, nkv, L, D] of q's dtype (views of the cache, unit
    stride along D, one layout); positions [B, T] integer, each below L; ``key_positions``
    [B, >= L] the slots' positions (0, 1, ...), made once by the caller for every layer. Returns
    q normed and rotated, contiguous [B, T, nh, D], and ``key_positions[:, :L]``. The caller
    vouches for the positions (reading them here would sync the device: the model checks the
    cache's room before a prompt); the shapes are checked. Rows differ freely (a token's slot is its
    position). ``num_warps``: as :func:`norm_rope_rows`' (the tuning file's ``norm_rope``)."""
    check_tensor("q", q, dtype=FLOAT_DTYPES, shape=(None, None, None, None), contiguous=False, aligned=False)
    B, T, NH, D = q.shape
    for name, t in (("k", k), ("v", v), ("keys", keys), ("values", values)):
        check_tensor(name, t, dtype=q.dtype, shape=(B, None, None, D), contiguous=False, aligned=False)
        if t.stride(3) != 1:
            raise ValueError(f"{name} must have unit stride along its last dim, got strides {t.stride()}")
    if q.stride(3) != 1:
        raise ValueError(f"q must have unit stride along its last dim, got strides {q.stride()}")
    NKV, L = k.shape[2], keys.shape[2]
    if k.shape != (B, T, NKV, D) or v.shape != k.shape or v.stride() != k.stride():
        raise ValueError(f"k and v must both be [B, T, nkv, D] = {[B, T, NKV, D]} with one layout, got "
                         f"{list(k.shape)} / {list(v.shape)}, strides {k.stride()} / {v.stride()}")
    if keys.shape[1] != NKV or values.shape != keys.shape or values.stride() != keys.stride():
        raise ValueError(f"keys and values must both be [B, nkv, L, D] = {[B, NKV, L, D]} with one layout, got "
                         f"{list(keys.shape)} / {list(values.shape)}, strides {keys.stride()} / {values.stride()}")
    if NH % NKV:
        raise ValueError(f"q's {NH} heads are not a multiple of k's {NKV}")
    check_tensor("q_weight", q_weight, dtype=FLOAT_DTYPES, shape=(D,), aligned=False)
    check_tensor("k_weight", k_weight, dtype=FLOAT_DTYPES, shape=(D,), aligned=False)
    check_tensor("positions", positions, dtype=(torch.int32, torch.int64), shape=(B, T), aligned=False)
    check_tensor("inv_freq", inv_freq, dtype=torch.float32, shape=(None,), aligned=False)
    check_tensor("key_positions", key_positions, shape=(B, None), contiguous=False, aligned=False)
    if key_positions.shape[1] < L:
        raise ValueError(f"key_positions has {key_positions.shape[1]} slots, the cache view {L}")
    half = inv_freq.shape[0]
    if not 0 < 2 * half <= D:
        raise ValueError(f"inv_freq has {half} frequencies: rotating {2 * half} channels of {D}")
    check_devices(q=q, k=k, v=v, q_weight=q_weight, k_weight=k_weight, positions=positions, inv_freq=inv_freq,
                  keys=keys, values=values, key_positions=key_positions)
    check_no_overlap([("keys", keys, "values", values)] + [(a, c, b, x) for a, c in (("keys", keys), ("values", values))
                                                        for b, x in (("q", q), ("k", k), ("v", v))])
    eps = check_eps("eps", eps)
    out = torch.empty(B, T, NH, D, dtype=q.dtype, device=q.device)
    if B * T == 0:
        return out, key_positions[:, :L]
    # at most 32 rows: at 64 rows of 64 channels (LFM2) this kernel compiles to 128 registers and 56 bytes
    # of stack for sm_90, at 32 to 72 and 40 (python -m labkit.lab.compile_check_prefill --fusions)
    block_r = min(_rows_block(D), 32)
    if not interpreting():
        # a short prompt (a prefix-cache hit's tail) in enough programs to spread over the SMs
        while block_r > 1 and cdiv(B * T * NH, block_r) < 2 * num_sms(q.device.index):
            block_r //= 2
    # every program has rows: the grid is exactly q's blocks, then k's and v's
    _attention_inputs_kernel[(cdiv(B * T * NH, block_r) + 2 * cdiv(B * T * NKV, block_r),)](
        q, k, v, q_weight, k_weight, positions, inv_freq, out, keys, values, B, T, NH, NKV,
        *q.stride()[:3], *k.stride()[:3], keys.stride(0), keys.stride(1), keys.stride(2), eps,
        D=D, HALF=half, BLOCK_R=block_r, BLOCK_D=next_pow2(D), BLOCK_H=next_pow2(half),
        UNIT_OFFSET=bool(unit_offset), OUT_DTYPE=TORCH_TO_TL[q.dtype], **interpreter_flags(q.dtype),
        num_warps=num_warps or 4,
    )
    return out, key_positions[:, :L]
