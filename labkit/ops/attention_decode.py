"""Grouped-query attention for one new token over a static KV cache, in one kernel.

From the qkv projection ``proj [B, P]`` = (q: nh*hd | k: nkv*hd | v: nkv*hd | gate: nh*hd,
Qwen3.5 only) and the caches ``keys, values [B, nkv, max_len, hd]`` holding ``lengths[b]`` tokens:

    q_h = rope(rmsnorm(q_h) , pos)   k = rope(rmsnorm(k), pos)    pos = lengths[b] (device memory)
    keys[b, :, pos], values[b, :, pos] = k, v                       the new token enters the cache
    o_h = softmax_{s <= pos}(q_h . keys[s] / sqrt(hd)) values[s]    query head h reads kv head h // G
    out_h = o_h * sigmoid(gate_h)  (Qwen3.5)  or  o_h               ready for wo

RMSNorm per head (weight ``w`` or ``1 + w``); rotate-half RoPE on the first ``rotary_dim``
channels (see :mod:`labkit.ops.rope`), angles reduced to [-pi, pi] before tl.sin/tl.cos (on the
GPU, libdevice's sinf/cosf: accurate everywhere, but beyond ~1e5 radians they take a slow path
through local memory; positions times frequencies reach 2.6e5 at Qwen3.5's context length).
Normed and rotated q, k are rounded to the cache dtype as the reference stores them.

Parallelism, flash-decoding style: one program per (sequence, kv head, chunk of CHUNK positions),
over every chunk that ``max_len`` allows, so the grid is fixed and a CUDA graph can replay it at
any length; chunks past ``lengths[b]`` return at once. Each program handles all G query heads of
its kv head (G padded to 16 rows so that q K^T and P V are ``tl.dot``s) with an online softmax.
The program whose chunk holds ``pos`` adds the new token from registers and writes it to the
cache; no program reads position ``pos`` from memory, so there is no race. With a single active
chunk the program writes the output directly; otherwise chunks leave (max, sum, acc) partials and
the last to arrive (:func:`labkit.ops.launch.arrive`) merges them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
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
    wait_until,
)
from .mixers import AttentionDims, attention_ref


@device_function
def _cos_sin(angle):
    """cos, sin of float32 angles of any size: Cody-Waite reduction by 2*pi (6.28125 has 8 significant
    bits, so n * 6.28125 is exact for |n| < 2**16), then sin/cos on [-pi, pi]."""
    n = tl.floor(angle * 0.15915494309189535 + 0.5)
    r = angle - n * 6.28125
    r = r - n * 1.9353071795864769e-3
    return tl.cos(r), tl.sin(r)


@device_function
def _norm_rope(base, rows, rmask, d, norm_w_ptr, inv_freq_ptr, pos, eps,
               HD: tl.constexpr, ROT: tl.constexpr, UNIT_OFFSET: tl.constexpr,
               DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """[R, HD_PAD] rows at base + rows * HD: per-row RMSNorm, RoPE on d < ROT at position ``pos``,
    each step rounded to DTYPE like the reference; returned as float32."""
    dmask = d < HD
    ptrs = base + rows[:, None] * HD
    x = tl.load(ptrs + d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HD + eps)
    w = tl.load(norm_w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        w = w + 1.0
    xn = cast(x * rstd[:, None] * w[None, :], DTYPE, EMULATE_RTNE).to(tl.float32)
    HALF: tl.constexpr = ROT // 2
    is_rot = d < ROT
    first = d < HALF
    partner = tl.where(first, d + HALF, d - HALF)
    xp = tl.load(ptrs + partner[None, :], mask=rmask[:, None] & is_rot[None, :], other=0.0).to(tl.float32)
    wp = tl.load(norm_w_ptr + partner, mask=is_rot, other=0.0).to(tl.float32)
    if UNIT_OFFSET:
        wp = wp + 1.0
    xpn = cast(xp * rstd[:, None] * wp[None, :], DTYPE, EMULATE_RTNE).to(tl.float32)
    freq = tl.load(inv_freq_ptr + tl.where(first, d, d - HALF), mask=is_rot, other=0.0)
    cos, sin = _cos_sin(pos.to(tl.float32) * freq)
    sign = tl.where(first, -1.0, 1.0)
    rotated = xn * cos[None, :] + sign[None, :] * xpn * sin[None, :]
    out = tl.where(is_rot[None, :], rotated, xn)
    return cast(out, DTYPE, EMULATE_RTNE).to(tl.float32)


@device_function
def _attention_store(o, row, out_ptr, b, heads, gmask, d, dmask,
                     NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, GATE: tl.constexpr,
                     OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    mask = gmask[:, None] & dmask[None, :]
    offs = heads[:, None] * HD + d[None, :]
    if GATE:
        gate = tl.load(row + (NH + 2 * NKV) * HD + offs, mask=mask, other=0.0).to(tl.float32)
        o = o * tl.sigmoid(gate)
    tl.store(out_ptr + b * NH * HD + offs, cast(o, OUT_DTYPE, EMULATE_RTNE), mask=mask)


@device_function
def attention_tile(
    pid, split, n_splits, wait_ptr, wait_target,
    proj_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr, lengths_ptr, out_ptr,
    count_ptr, part_ptr, ml_ptr,
    P, max_len, eps, scale,
    NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr,
    GATE: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    G_PAD: tl.constexpr, HD_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
    OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
    RELEASE_EARLY: tl.constexpr, WAIT_COUNTER: tl.constexpr,
):
    """Chunk ``split`` of ``n_splits`` for (sequence, kv head) ``pid = b * NKV + kvh``; see the
    module docstring for the maths. With WAIT_COUNTER it first waits for ``*wait_ptr >=
    wait_target`` (the persistent decode kernel's dependency), where a PDL launch waits for the
    previous grid."""
    b = pid // NKV
    kvh = pid % NKV
    G: tl.constexpr = NH // NKV
    if USE_PDL:
        if RELEASE_EARLY:
            # Release the next kernel at once: it waits for this whole grid before reading what
            # it writes, and meanwhile can put its own weights in flight on SMs this grid leaves idle.
            gdc_launch_dependents()
        gdc_wait()
    if WAIT_COUNTER:
        wait_until(wait_ptr, wait_target)
    pos = tl.load(lengths_ptr + b)
    c0 = split * CHUNK
    if c0 <= pos:
        g = tl.arange(0, G_PAD)
        gmask = g < G
        heads = kvh * G + g
        d = tl.arange(0, HD_PAD)
        dmask = d < HD
        row = proj_ptr + b * P
        q = _norm_rope(row, heads, gmask, d, q_norm_ptr, inv_freq_ptr, pos, eps,
                       HD, ROT, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)  # [G_PAD, HD_PAD]
        one = tl.arange(0, 1)
        k_new = _norm_rope(row + NH * HD, kvh + one, one < 1, d, k_norm_ptr, inv_freq_ptr, pos, eps,
                           HD, ROT, UNIT_OFFSET, OUT_DTYPE, EMULATE_RTNE)  # [1, HD_PAD]
        # The new token's score and its cache slot, before the loop, so that the float32 q and k
        # are dead during it (fewer live registers). Only the chunk holding pos writes the slot;
        # the loop reads positions < pos, so nothing reads it in this launch.
        tail = pos < c0 + CHUNK
        s_new = tl.where(tail, tl.sum(q * k_new, axis=1) * scale, float("-inf"))  # [G_PAD]
        kv_base = pid.to(tl.int64) * max_len * HD
        k_rows = k_cache_ptr + kv_base
        v_rows = v_cache_ptr + kv_base
        v_src = row + (NH + NKV) * HD + kvh * HD + d
        new_mask = dmask & tail & (pos < max_len)
        tl.store(k_rows + pos * HD + d[None, :], cast(k_new, OUT_DTYPE, EMULATE_RTNE), mask=new_mask[None, :])
        tl.store(v_rows + pos * HD + d, tl.load(v_src, mask=dmask, other=0.0), mask=new_mask)
        q_dot = cast(q, OUT_DTYPE, EMULATE_RTNE)  # exact: q is already rounded

        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], dtype=tl.float32)
        acc = tl.zeros([G_PAD, HD_PAD], dtype=tl.float32)
        hi = tl.minimum(c0 + CHUNK, pos)  # cached positions of this chunk: [c0, hi)
        for s0 in range(c0, hi, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            smask = s < hi
            kv_mask = smask[:, None] & dmask[None, :]
            kt = tl.load(k_rows + s[:, None] * HD + d[None, :], mask=kv_mask, other=0.0)
            vt = tl.load(v_rows + s[:, None] * HD + d[None, :], mask=kv_mask, other=0.0)
            scores = dot(q_dot, tl.trans(kt), tl.zeros([G_PAD, BLOCK_S], dtype=tl.float32), DOT_F32) * scale
            scores = tl.where(smask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = dot(cast(p, OUT_DTYPE, EMULATE_RTNE), vt, acc * alpha[:, None], DOT_F32)
            m_i = m_new

        # the new token (a -inf score outside the chunk that holds pos)
        m_new = tl.maximum(m_i, s_new)
        alpha = tl.exp(m_i - m_new)
        p_new = tl.exp(s_new - m_new)
        l_i = l_i * alpha + p_new
        v_new = tl.load(v_src, mask=dmask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + p_new[:, None] * v_new[None, :]
        m_i = m_new

        n_active = pos // CHUNK + 1
        if n_active == 1:
            _attention_store(acc / l_i[:, None], row, out_ptr, b, heads, gmask, d, dmask,
                             NH, NKV, HD, GATE, OUT_DTYPE, EMULATE_RTNE)
        else:
            slot = pid * n_splits + split
            tl.store(part_ptr + (slot * G + g[:, None]) * HD + d[None, :], acc, mask=gmask[:, None] & dmask[None, :])
            tl.store(ml_ptr + (slot * 2) * G + g, m_i, mask=gmask)
            tl.store(ml_ptr + (slot * 2 + 1) * G + g, l_i, mask=gmask)
            if arrive(count_ptr + pid, n_active):
                # merge the chunks' partial softmaxes; -1e30 (not -inf) keeps padded rows NaN-free
                m_all = tl.full([G_PAD], -1e30, tl.float32)
                l_all = tl.zeros([G_PAD], dtype=tl.float32)
                o_all = tl.zeros([G_PAD, HD_PAD], dtype=tl.float32)
                for t in range(0, n_active):
                    slot_t = pid * n_splits + t
                    m_t = tl.load(ml_ptr + (slot_t * 2) * G + g, mask=gmask, other=float("-inf"), cache_modifier=".cg")
                    l_t = tl.load(ml_ptr + (slot_t * 2 + 1) * G + g, mask=gmask, other=0.0, cache_modifier=".cg")
                    a_t = tl.load(part_ptr + (slot_t * G + g[:, None]) * HD + d[None, :],
                                  mask=gmask[:, None] & dmask[None, :], other=0.0, cache_modifier=".cg")
                    m_new = tl.maximum(m_all, m_t)
                    alpha = tl.exp(m_all - m_new)
                    beta = tl.exp(m_t - m_new)
                    l_all = l_all * alpha + l_t * beta
                    o_all = o_all * alpha[:, None] + a_t * beta[:, None]
                    m_all = m_new
                l_all = tl.where(l_all > 0, l_all, 1.0)  # padded rows only
                _attention_store(o_all / l_all[:, None], row, out_ptr, b, heads, gmask, d, dmask,
                                 NH, NKV, HD, GATE, OUT_DTYPE, EMULATE_RTNE)


@triton.jit
def _attention_decode_kernel(
    proj_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr, lengths_ptr, out_ptr,
    count_ptr, part_ptr, ml_ptr,
    P, max_len, eps, scale,
    NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr,
    GATE: tl.constexpr, UNIT_OFFSET: tl.constexpr,
    G_PAD: tl.constexpr, HD_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
    OUT_DTYPE: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
    RELEASE_EARLY: tl.constexpr,
):
    """Grid (B * NKV, cdiv(max_len, CHUNK)): one :func:`attention_tile` per program."""
    attention_tile(
        tl.program_id(0), tl.program_id(1), tl.num_programs(1), count_ptr, 0,
        proj_ptr, q_norm_ptr, k_norm_ptr, inv_freq_ptr, k_cache_ptr, v_cache_ptr, lengths_ptr, out_ptr,
        count_ptr, part_ptr, ml_ptr, P, max_len, eps, scale,
        NH, NKV, HD, ROT, GATE, UNIT_OFFSET, G_PAD, HD_PAD, CHUNK, BLOCK_S,
        OUT_DTYPE, DOT_F32, EMULATE_RTNE, USE_PDL, RELEASE_EARLY, False,
    )


@dataclass
class AttentionWorkspace:
    """Per-chunk softmax partials and per-(sequence, kv head) arrival counters (zero between launches)."""

    counters: torch.Tensor  # int32 [B * nkv]
    partials: torch.Tensor  # float32 [B * nkv * n_splits * G * hd]
    max_sum: torch.Tensor  # float32 [B * nkv * n_splits * 2 * G]

    @classmethod
    def allocate(cls, batch: int, dims: AttentionDims, n_splits: int, device: torch.device | str) -> "AttentionWorkspace":
        slots = batch * dims.num_kv_heads * n_splits
        return cls(
            torch.zeros(batch * dims.num_kv_heads, dtype=torch.int32, device=device),
            torch.empty(slots * dims.group * dims.head_dim, dtype=torch.float32, device=device),
            torch.empty(slots * 2 * dims.group, dtype=torch.float32, device=device),
        )


def attention_chunk(max_len: int, head_dim: int, *, min_chunk: int = 256, max_chunks: int = 64) -> tuple[int, int]:
    """(CHUNK, BLOCK_S): positions per program and per inner step. At most ``max_chunks`` chunks,
    so the merge stays short; at least ``min_chunk`` positions per chunk, so short contexts need no
    merge at all. The defaults are the heuristic (a GPU's own are its tuning file's:
    ``labkit.tuning.settings("attention_decode")``)."""
    if interpreting():
        block_s = 16
        return max(block_s, min(64, next_pow2(max_len))), block_s
    block_s = 64 if head_dim <= 128 else 32
    if min_chunk < block_s or min_chunk & (min_chunk - 1) or max_chunks < 1:
        raise ValueError(f"min_chunk must be a power of two >= {block_s} and max_chunks >= 1, "
                         f"got min_chunk={min_chunk}, max_chunks={max_chunks}")
    chunk = max(min_chunk, next_pow2(cdiv(max_len, max_chunks)))
    return chunk, block_s


def tile_sizes(dims: AttentionDims, chunk: int, block_s: int) -> dict[str, object]:
    """The constexpr sizes of :func:`attention_tile` (this module's kernel and the persistent step's)."""
    return dict(NH=dims.num_heads, NKV=dims.num_kv_heads, HD=dims.head_dim, ROT=dims.rotary_dim,
                GATE=dims.output_gate, G_PAD=max(16, next_pow2(dims.group)), HD_PAD=max(16, next_pow2(dims.head_dim)),
                CHUNK=chunk, BLOCK_S=block_s)


def attention_decode(
    proj: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    dims: AttentionDims,
    eps: float,
    unit_offset: bool,
    *,
    out: torch.Tensor | None = None,
    workspace: AttentionWorkspace | None = None,
    chunk: int | None = None,
    block_s: int | None = None,
    num_warps: int | None = None,
    pdl: bool = False,
    release_early: bool = True,
) -> torch.Tensor:
    """Attention output ``[B, nh*hd]`` for the new token; writes its k, v into ``keys``/``values`` at
    ``lengths[b]`` (lengths are not advanced: that is the caller's, once per step).

    ``chunk``: positions per program (default :func:`attention_chunk`'s). ``release_early``: under
    PDL, release the next kernel first thing (True, the heuristic) or at the end (False); safe
    either way, since the next kernel waits for this whole grid before reading its outputs (a GPU's
    measured choice is its tuning file's, which the fused decoder passes)."""
    if not isinstance(dims, AttentionDims):
        raise TypeError(f"dims must be AttentionDims, got {type(dims).__name__}")
    if dims.num_heads % dims.num_kv_heads:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    if dims.rotary_dim % 2 or not 0 < dims.rotary_dim <= dims.head_dim:
        raise ValueError(f"rotary_dim must be even and in (0, head_dim], got {dims.rotary_dim}")
    check_tensor("proj", proj, dtype=FLOAT_DTYPES, shape=(None, dims.proj_dim))
    bsz, dtype = proj.shape[0], proj.dtype
    hd = dims.head_dim
    check_tensor("keys", keys, dtype=dtype, shape=(bsz, dims.num_kv_heads, None, hd))
    max_len = keys.shape[2]
    check_tensor("values", values, dtype=dtype, shape=(bsz, dims.num_kv_heads, max_len, hd))
    check_tensor("lengths", lengths, dtype=torch.int32, shape=(bsz,))
    check_tensor("q_norm_weight", q_norm_weight, dtype=FLOAT_DTYPES, shape=(hd,))
    check_tensor("k_norm_weight", k_norm_weight, dtype=FLOAT_DTYPES, shape=(hd,))
    check_tensor("inv_freq", inv_freq, dtype=torch.float32, shape=(dims.rotary_dim // 2,))
    eps = check_eps("eps", eps)
    if out is None:
        out = torch.empty(bsz, dims.num_heads * hd, dtype=dtype, device=proj.device)
    check_tensor("out", out, dtype=dtype, shape=(bsz, dims.num_heads * hd))
    check_pdl(pdl, check_devices(proj=proj, keys=keys, values=values, lengths=lengths, out=out, inv_freq=inv_freq,
                                 q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight))
    check_no_overlap([("proj", proj, "out", out), ("keys", keys, "values", values)])
    ch, bs = attention_chunk(max_len, hd)
    ch, bs = chunk or ch, block_s or bs
    if bs < 16 or bs & (bs - 1) or ch % bs:
        raise ValueError(f"block_s must be a power of two >= 16 dividing chunk, got block_s={bs}, chunk={ch}")
    n_splits = cdiv(max_len, ch)
    if num_warps is None:  # the [16, hd] float32 accumulator and q: wide heads get more threads
        num_warps = 8 if hd >= 256 else 4
    if workspace is None:
        workspace = AttentionWorkspace.allocate(bsz, dims, n_splits, proj.device)
    if not isinstance(workspace, AttentionWorkspace):
        raise TypeError(f"workspace must be an AttentionWorkspace, got {type(workspace).__name__}")
    slots = bsz * dims.num_kv_heads * n_splits
    check_tensor("workspace.counters", workspace.counters, dtype=torch.int32, shape=(bsz * dims.num_kv_heads,))
    if workspace.partials.numel() < slots * dims.group * hd or workspace.max_sum.numel() < slots * 2 * dims.group:
        raise ValueError(f"workspace too small for {n_splits} chunks of {ch} positions")
    _attention_decode_kernel[(bsz * dims.num_kv_heads, n_splits)](
        proj, q_norm_weight, k_norm_weight, inv_freq, keys, values, lengths, out,
        workspace.counters, workspace.partials, workspace.max_sum,
        proj.shape[1], max_len, eps, hd**-0.5,
        **tile_sizes(dims, ch, bs), UNIT_OFFSET=bool(unit_offset),
        OUT_DTYPE=TORCH_TO_TL[dtype], USE_PDL=bool(pdl), RELEASE_EARLY=bool(release_early), **interpreter_flags(dtype),
        num_warps=num_warps, num_stages=2, launch_pdl=bool(pdl),
    )
    return out


def attention_decode_ref(
    proj: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    dims: AttentionDims,
    eps: float,
    unit_offset: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [B, nh*hd], new keys, new values): :func:`labkit.ops.mixers.attention_ref` (the model's
    maths) for one token at position ``lengths[b]``; the caches are not modified. Sequences may
    have different lengths."""
    keys, values = keys.clone(), values.clone()
    seen = int(lengths.max()) + 1  # no query reads past the longest sequence's new token
    out = attention_ref(
        proj[:, None], q_norm_weight, k_norm_weight, inv_freq, keys[:, :, :seen], values[:, :, :seen],
        lengths.long()[:, None], dims, eps, unit_offset,
    )
    return out[:, 0], keys, values
