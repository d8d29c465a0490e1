"""Attention of a few new tokens that continue a long cache (a prefix-cache hit's tail), split over the keys.

The function is :func:`labkit.ops.mixers.attend_continuing`'s (and so :func:`~labkit.ops.mixers.attend_ref`'s):
for the T new queries of every sequence at positions start..start+T-1 and the keys at 0..L-1,

    o[b, h, t] = sum_{s <= start + t} softmax_s(q[b, h, t] . k[b, h // G, s] / sqrt(hd)) v[b, h // G, s]

with G = nh / nkv query heads per key head. A 64-token tail after 4,096 cached tokens has few
queries and many keys: SDPA's flash kernel then splits the keys and merges the splits in a second
kernel, 27 us a layer for Qwen3.5-0.8B on an H100, where the layer's keys and values are 8.5 MB
(2.8 us at the GPU's copy bandwidth).

Two kernels here too, shaped for this case. ``_split_kernel``: one program per (sequence, key
head, block of BLOCK_M query rows, split of the keys). A key head's G query heads are its rows
(row r is token r // G of query head h * G + r % G), so the keys and values a program loads serve
all G heads, and q K^T is one ``tl.dot`` of BLOCK_M rows. Over its keys the program keeps the
online softmax (m, l, acc) of its rows, masked where a key is past a query's position, and stores
them in float32. ``_merge_kernel``: per (sequence, key head, block of rows, block of columns), the
splits merged,

    M = max_s m_s,   o = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s,

written in the query's dtype. Splits are sized so that the first kernel has about one program per
SM, at most MAX_SPLITS of them (the merge reads every split's partials). A row that sees no key of
a split (its keys all past the row's position) leaves m = -inf, l = 0 there, which the merge
weighs by zero; every row sees key 0, so M is finite.
Precision: products take the inputs' dtype (bf16 tensor-core dots on a GPU, float32 for float32
inputs), the softmax and the accumulators float32.

Measured, and so off in the fused prefill (``FAST_PATHS["tail_attention"]``): on an H100, 64 new
tokens after 4,096, a chain over the attention layers (python -m labkit bench tail-ops,
data/bench/nvidia-h100-80gb-hbm3/tail-ops.json), 31.95 us a layer against SDPA's 26.98 for
Qwen3.5-0.8B (8 heads of 256 over 2 key heads), 19.19 against 19.07 for LFM2-350M (16 of 64 over
8); at 16 new tokens 32.43 against 23.74 and 17.64 against 18.76. Both are far from the keys'
2.8 us: the split kernel's loop of dependent products over a few key blocks is latency, as SDPA's is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .mixers import attend_continuing
from .launch import (FLOAT_DTYPES, TORCH_TO_TL, cast, cdiv, check_devices, check_tensor, dot, interpreter_flags,
                     next_pow2, num_sms)

MAX_TOKENS = 64  # new tokens per sequence this form is for (more: SDPA's kernels fill the GPU)
BLOCK_M = 64  # query rows (tokens x grouped heads) per program
MERGE_BLOCK_M, MERGE_BLOCK_D = 16, 64  # rows and columns per program of the merge
MAX_SPLITS = 16  # the partials the merge reads grow with the splits: rows x head dim x 4 bytes each


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, start, T, NKV, rows, keys_per_split, splits, scale,
                  q_sb, q_sh, q_st, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl,
                  G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (B * NKV, cdiv(rows, BLOCK_M), splits): the online softmax of BLOCK_M query rows over
    keys [split * keys_per_split, ...) up to start + T, into m, l [B*NKV, splits, rows] and acc
    [B*NKV, splits, rows, D] (float32)."""
    bh = tl.program_id(0)
    b = bh // NKV
    h = bh % NKV
    split = tl.program_id(2)
    r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = r < rows
    t = r // G
    head = h * G + r % G
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    q = tl.load(q_ptr + b.to(tl.int64) * q_sb + head[:, None] * q_sh + t[:, None] * q_st + d[None, :],
                mask=live[:, None] & dm[None, :], other=0.0)
    used = start + T
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, used)
    k_base = k_ptr + b.to(tl.int64) * k_sb + h.to(tl.int64) * k_sh
    v_base = v_ptr + b.to(tl.int64) * v_sb + h.to(tl.int64) * v_sh
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        nm = n < hi
        kt = tl.load(k_base + n[:, None].to(tl.int64) * k_sl + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0)
        s = dot(q, tl.trans(kt), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), DOT_F32) * scale
        seen = nm[None, :] & (n[None, :] <= (start + t)[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        l = l * alpha + tl.sum(p, 1)
        vt = tl.load(v_base + n[:, None].to(tl.int64) * v_sl + d[None, :], mask=nm[:, None] & dm[None, :], other=0.0)
        acc = dot(cast(p, DT, EMULATE_RTNE), vt, acc * alpha[:, None], DOT_F32)
        m = m_new
    at = (bh * splits + split).to(tl.int64) * rows + r
    tl.store(m_ptr + at, m, mask=live)
    tl.store(l_ptr + at, l, mask=live)
    tl.store(acc_ptr + at[:, None] * D + d[None, :], acc, mask=live[:, None] & dm[None, :])


@triton.jit
def _merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, T, NKV, NH, rows, splits,
                  G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_S: tl.constexpr, OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Grid (B * NKV, cdiv(rows, BLOCK_M), cdiv(D, BLOCK_D)): the splits' partials of BLOCK_M rows
    and BLOCK_D columns merged into o [B, T, NH, D]. (Small blocks: the partials are about as many
    bytes as the keys and values, and a few programs reading them all would take longer than the
    split kernel.)"""
    bh = tl.program_id(0)
    b = bh // NKV
    h = bh % NKV
    r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    live = r < rows
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    dm = d < D
    sp = tl.arange(0, BLOCK_S)
    base = (bh * splits).to(tl.int64) * rows
    ms = tl.load(m_ptr + base + sp[:, None] * rows + r[None, :], mask=(sp < splits)[:, None] & live[None, :],
                 other=float("-inf"))  # [BLOCK_S, BLOCK_M]
    top = tl.max(ms, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # padding rows only: every live row saw key 0
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for s in range(0, splits):
        at = base + s * rows + r
        w = tl.exp(tl.load(m_ptr + at, mask=live, other=float("-inf")) - top)
        total += w * tl.load(l_ptr + at, mask=live, other=0.0)
        acc += w[:, None] * tl.load(acc_ptr + at[:, None] * D + d[None, :], mask=live[:, None] & dm[None, :], other=0.0)
    t = r // G
    head = h * G + r % G
    o = acc / tl.where(live, total, 1.0)[:, None]
    tl.store(o_ptr + ((b * T + t[:, None]).to(tl.int64) * NH + head[:, None]) * D + d[None, :],
             cast(o, OUT_DTYPE, EMULATE_RTNE), mask=live[:, None] & dm[None, :])


def attend_tail(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                key_positions: torch.Tensor, *, start: int, splits: int | None = None) -> torch.Tensor:
    """:func:`labkit.ops.mixers.attend_continuing` in two Triton kernels (the module's docstring):
    q [B, nh, T, hd] (any strides along B, nh, T; hd contiguous: the transposed view the attention
    mixer passes), keys, values [B, nkv, L, hd] (hd contiguous), every sequence continuing ``start``
    cached tokens (the caller vouches, as for :func:`~labkit.ops.mixers.attend_continuing`:
    reading ``positions`` would sync the device), T <= ``MAX_TOKENS``. Returns [B, nh, T, hd], a
    transposed view of a contiguous [B, T, nh, hd] tensor. ``splits``: how many parts the keys are
    cut into (None: about one program per SM, at most ``MAX_SPLITS``), whole blocks of keys each."""
    check_tensor("q", q, dtype=FLOAT_DTYPES, shape=(None, None, None, None), contiguous=False)
    B, nh, T, D = q.shape
    for name, x in (("keys", keys), ("values", values)):
        check_tensor(name, x, dtype=q.dtype, shape=(B, None, None, D), contiguous=False)
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have contiguous head dims (stride 1), got strides {x.stride()}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must have contiguous head dims (stride 1), got strides {q.stride()}")
    nkv, L = keys.shape[1], keys.shape[2]
    if values.shape != keys.shape:
        raise ValueError(f"values must have keys' shape {list(keys.shape)}, got {list(values.shape)}")
    if nkv < 1 or nh % nkv:
        raise ValueError(f"the query heads ({nh}) must be a multiple of the key heads ({nkv})")
    if not 1 <= T <= MAX_TOKENS:
        raise ValueError(f"attend_tail is for 1..{MAX_TOKENS} new tokens per sequence, got T = {T}")
    if not isinstance(start, int) or start < 1 or L < start + T or positions.shape != (B, T):
        raise ValueError(
            f"attend_tail needs start >= 1 cached tokens, a key buffer of at least start + T = {start + T} and "
            f"positions [B, T] = {[B, T]} (start={start!r}, {L} keys, positions {list(positions.shape)})")
    check_devices(q=q, keys=keys, values=values, positions=positions, key_positions=key_positions)
    G, rows = nh // nkv, T * (nh // nkv)
    row_blocks = cdiv(rows, BLOCK_M)
    used = start + T
    block_d = max(16, next_pow2(D))
    block_n = 32 if block_d > 128 else 64
    # about one program per SM in the first kernel, whole key blocks per split
    if splits is None:
        splits = max(1, min(cdiv(used, block_n), MAX_SPLITS, num_sms() // max(1, B * nkv * row_blocks)))
    elif not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits must be a positive integer, got {splits!r}")
    per_split = cdiv(cdiv(used, splits), block_n) * block_n
    splits = cdiv(used, per_split)
    dev = q.device
    m = torch.empty(B * nkv, splits, rows, dtype=torch.float32, device=dev)
    l = torch.empty_like(m)
    acc = torch.empty(B * nkv, splits, rows, D, dtype=torch.float32, device=dev)
    flags = interpreter_flags(q.dtype)
    warps = 8 if block_d > 128 else 4
    _split_kernel[(B * nkv, row_blocks, splits)](
        q, keys, values, m, l, acc, start, T, nkv, rows, per_split, splits, D ** -0.5,
        q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        G=G, D=D, BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_D=block_d, DT=TORCH_TO_TL[q.dtype], **flags,
        num_warps=warps, num_stages=2,
    )
    out = torch.empty(B, T, nh, D, dtype=q.dtype, device=dev)
    merge_d = min(block_d, MERGE_BLOCK_D)
    _merge_kernel[(B * nkv, cdiv(rows, MERGE_BLOCK_M), cdiv(D, merge_d))](
        m, l, acc, out, T, nkv, nh, rows, splits, G=G, D=D, BLOCK_M=MERGE_BLOCK_M, BLOCK_D=merge_d,
        BLOCK_S=next_pow2(splits), OUT_DTYPE=TORCH_TO_TL[q.dtype], EMULATE_RTNE=flags["EMULATE_RTNE"], num_warps=4,
    )
    return out.transpose(1, 2)


def attend_short_tail(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                      key_positions: torch.Tensor, *, start: int) -> torch.Tensor:
    """:func:`labkit.ops.mixers.attend_continuing`'s function: :func:`attend_tail` for up to
    ``MAX_TOKENS`` new tokens per sequence, SDPA's bottom-right causal form (attend_continuing) for more."""
    if q.shape[2] <= MAX_TOKENS:
        return attend_tail(q, keys, values, positions, key_positions, start=start)
    return attend_continuing(q, keys, values, positions, key_positions, start=start)
