"""The gated delta rule over whole prompts (prefill), a chunk of 64 tokens at a time, in Triton.

Forward only. The function is :func:`labkit.ops.delta_rule.delta_rule_recurrent_ref`'s: per
sequence and value head, from a float32 state S [K, V],

    S <- exp(g_t) S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t / sqrt(K)

computed in the chunked WY / UT form of :mod:`labkit.ops.delta_rule`'s docstring. Within a chunk
of C = 64 tokens that starts from state S0, with G_t = g_1 + ... + g_t (float32 cumulative
log-decays, so exp(G_t) <= 1 is the decay from the chunk start to token t):

    L[s, r] = beta_s exp(G_s - G_r) (k_s . k_r)   for r < s, else 0           [C, C]
    X       = (I + L)^-1                          unit lower-triangular       [C, C]
    W       = X diag(beta exp(G)) K               how the start state leaks into the deltas [C, K]
    U0      = X diag(beta) V                      the deltas from a zero start state        [C, V]
    P       = M o (Q K^T) / sqrt(K),  M[t, s] = exp(G_t - G_s) for s <= t, else 0      [C, C]

    U       = U0 - W S0                                            the deltas u_t of the chunk
    O       = diag(exp(G)) Q S0 / sqrt(K) + P U                    its outputs
    S_C     = exp(G_C) S0 + (diag(exp(G_C - G)) K)^T U             the state after it

Only the last three lines depend on S0. Three kernels (like fla's chunk path, but with the output
products folded into the state walk, so chunk states never go through memory):

- ``_prepare_kernel``, one program per (chunk, value head), all in parallel: G, W, U0, P (stored
  like the inputs, [tokens, Hv, ...]). X is formed in 16 x 16 blocks (the smallest tl.dot tile):
  each diagonal block by forward substitution, then X_ij = -X_ii sum_{j<=m<i} L_im X_mj below
  the diagonal. That is the usual stable triangular inverse; power-series shortcuts
  ((I - L)(I + L^2)(I + L^4)...) cancel catastrophically when keys repeat, so none is used.
- ``_walk_kernel``, one program per (sequence, value head, block of BLOCK_V value columns): walks
  the chunks in order carrying S[:, block] in registers, and writes each chunk's outputs, the
  checkpoints and the final state. Value columns are independent, so the blocks need no
  coordination.

Two other forms of the same two steps, chosen by ``prepare`` and ``defer_outputs`` (the benchmark
picks the defaults, ``PREPARE`` and ``DEFER_OUTPUTS``):

- ``prepare="split"``: ``_solve_kernel`` forms L whole (one [C, K] x [K, C] product), parks it in
  an X buffer and inverts it block by block from there (no key tile stays live through the solve,
  which is what makes the fused kernel spill), then ``_products_kernel`` forms W, U0 and P, each
  by its own program (grid (chunk slots, Hv, 3)), from the stored X and G. Two choices inside it:
  ``invert="rows"`` inverts the four diagonal blocks together by forward substitution a row at a
  time (broadcast products and in-warp sums, about 50 barriers a chunk on sm_90) instead of 15
  dot rounds each (``"dots"``: a layout conversion through shared memory per round, about 170
  barriers), and ``products="full"`` forms W and U0 with X whole, one 64-row tensor-core product
  per column block, instead of ten 16 x 16 block products (``"blocks"``). ``prepare="merged"`` runs
  the two kernels' work ("rows", then "full") one after the other in one program per chunk.
- ``defer_outputs``: the walk keeps only the two products the recurrence needs (U = U0 - W S and
  the state update) and stores each chunk's start state S0 and deltas U in the input dtype (the
  rounding the output products would apply anyway); ``_output_kernel`` then forms every chunk's
  outputs in parallel. The sequential part halves, for a [chunks, Hv, K, V] buffer of states.

At batch 1 (16 heads x 128 columns in blocks of 16) that is 128 sequential programs for 132 SMs.
The state update is affine in S, S_end = A S_start + B over any stretch of tokens, so a long
sequence is also cut into segments of ``split`` chunks:

- ``_transition_kernel``, per (segment, value head, column block): B = the segment's walk from
  S = 0; A (a [K, K] matrix) = the walk from S = I with U0 = 0 (its deltas are -W S only). One
  walk over the augmented state [B | A] of V + K columns; the last segment of each sequence is
  never needed and skipped.
- ``_combine_kernel``, per (sequence, value head, column block): S_{j+1} = A_j S_j + B_j in order
  over the segments (a short sequential scan), leaving each segment's start state in memory.
- ``_walk_kernel`` again, now per (segment, value head, column block) from those start states.

Each segment is walked twice (for its map, over V + K columns, then for its outputs): two to
three times the plain walk's arithmetic, for ``segments`` times its parallelism, so
:func:`prefill_split` turns it on only where heads alone cannot fill the GPU.

A call whose sequences are all at most one chunk long (a prefix-cache hit's tail: the restored
state is S0 and the new tokens fit one chunk) runs four dependent kernels of a few microseconds
each. ``_single_chunk_kernel`` does the same sums in one launch, one program per (sequence, value
head, block of value columns): the solve (``_solve_chunk``, through the program's own scratch rows),
then U = U0 - W S0, O and S_C as above, in registers. It is chunk_delta_rule's default where every
sequence fits a chunk and sequences x value heads is at most the SM count (``single_chunk``;
:func:`use_single_chunk`). Measured on the H200 (64-token tail after 4,096 restored tokens, 16
heads, K = V = 128; data/bench/nvidia-h200/hit-timeline.json, and as committed in 158eaee for the
four kernels): 22.4 us
of kernel time a layer against 18.3 us for the four kernels, yet the tail's graph replay 2.27 ms
against 2.30 (the four kernels' gaps) and 54 launches fewer for an eager tail. Its one program per
head holds a whole [64, 128] chunk: that, not the launches, is what to tune next.

Precision, as in fla's chunk kernels: the state, gates, cumulative decays, accumulators and the
triangular inverse are float32 (the inverse with full-float32 "ieee" dots). Every other product
takes its operands in the input dtype (bf16 tensor-core products on a GPU), so the state and the
deltas are rounded to bf16 where they enter a product, never where they are kept; W, U0 and P
are stored in the input dtype. With bf16 inputs the error is then of the order of the output's
own bf16 rounding (the tests bound it by 1e-2). Float32 inputs get float32 products throughout.

Variable-length batches come packed along T with batch 1 and cumulative offsets ``cu_seqlens``
(as in fla and FlashInfer). Programs find their sequence and chunk by a vector search over
``cu_seqlens`` on the GPU, so nothing is read back to the host and a call can be captured in a
CUDA graph; grids are sized by an upper bound, and programs past the last chunk exit.
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from .launch import (
    FLOAT_DTYPES,
    TORCH_TO_TL,
    cast,
    cdiv,
    check_devices,
    check_no_overlap,
    check_tensor,
    device_function,
    dot,
    interpreter_flags,
    interpreting,
    next_pow2,
    num_sms,
)

CHUNK = 64  # tokens per chunk: 4 blocks of SUB for the triangular inverse
SUB = 16  # the triangular inverse's block (tl.dot's smallest tile)
MAX_HEAD_DIM = 256
# A segment shorter than this many chunks does not repay the combine's per-segment [K, K] product
# (a guess until the benchmark sweeps it on the GPU).
MIN_SEGMENT_CHUNKS = 8
PREPARE_KINDS = ("fused", "split", "merged")
# The defaults (see chunk_delta_rule's ``prepare`` and ``defer_outputs``): the split prepare (no
# spills on sm_90, where the fused one spills at 255 registers) and the walk without the output
# products (half its sequential work; fla's layout). Chosen from the compiler's register counts and
# the walk's critical path, then timed on the H200 (2026-12-01, tools/gpu_experiments/gdn-speed.sh):
# with the inner forms below, the fused prepare + walk that writes the outputs took 0.371 / 1.438 ms at
# T = 4,096 / 16,384 against 0.239 / 0.913 for these two, and the walk with outputs 0.262 / 1.004.
PREPARE = "split"
DEFER_OUTPUTS = True
# How the split prepare inverts and multiplies (chunk_delta_rule's ``invert`` and ``products``):
# "rows" substitutes the diagonal blocks a row at a time (no dot rounds), "dots" by 15 dot rounds
# each; "full" forms W and U0 with X whole (one 64-row tile), "blocks" by its 16 x 16 blocks.
INVERT_KINDS = ("dots", "rows")
PRODUCTS_KINDS = ("blocks", "full")
# Measured on the H200 (2026-12-01, tools/gpu_experiments/gdn-speed.sh, B = 1, 16 heads, K = V = 128,
# bf16): "rows" + "full" at 4 warps took the split prepare from 1,161 to 306 us at T = 16,384
# (solve 330 -> 150, products 831 -> 156), the whole call from 0.433 / 1.773 / 1.515 ms to
# 0.246 / 0.922 / 0.652 ms at T = 4,096 / 16,384 / 8 x 2,048.
INVERT = "rows"
PRODUCTS = "full"
# The prepare's warps where K >= 128 (4 below): the fused kernel spills at 4; the split one's solve
# and products were faster at 4 (two or more programs per SM); the merged one spills at 4.
PREPARE_WARPS = {"fused": 8, "split": 4, "merged": 8}
# With deferred outputs: P formed by the output kernel rather than stored by the prepare. The walk's
# launch: WALK_BLOCK_V value columns per program at WALK_WARPS warps. Measured on the H200 in one
# run (2026-12-01, gdn-speed.sh, B = 1, 16 heads, K = V = 128, beside fla 0.6.0 at 0.172 / 0.632 ms):
# from 0.239 / 0.913 ms at T = 4,096 / 16,384 (P stored, [128, 32] slices at 8 warps), recompute_p
# gave 0.234 / 0.888, 4 warps 0.221 / 0.831, the three together 0.210 / 0.788, the fastest form
# timed; 64 columns, the sequence split, the merged prepare and the walk that writes the outputs
# were all slower.
RECOMPUTE_P = True
WALK_BLOCK_V = 16
WALK_WARPS = 4
# On the H200 the split was never faster at batch 1, T = 1k..64k (data/bench/nvidia-h200/gdn-prefill.json,
# 2026-12-01, with the walk that writes the outputs): off unless asked for (split=N, or this flag).
# Again slower in gdn-speed's round B (prefill_split's choice: 0.270 / 0.947 ms against 0.239 / 0.913
# at T = 4,096 / 16,384 with the [128, 32] walk).
SPLIT_BY_DEFAULT = False
OUTPUT_BLOCK_V = 64  # value columns per program of the deferred outputs (each re-reads its Q and P)
# The single-chunk path (chunk_delta_rule's ``single_chunk``): value columns per program (the whole
# head of Qwen3.5's 128) and warps: untuned (the module docstring has its measured cost;
# tools/gpu_experiments/gdn-tail.sh times the variants).
SINGLE_BLOCK_V = 128
SINGLE_WARPS = 4


# -- device helpers ---------------------------------------------------------------------------------
@device_function
def _mm(a, b, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """a @ b with float32 accumulation on operands rounded to DT, the input dtype (bf16 tensor-core
    products on a GPU, as fla rounds them). With DOT_F32 (the interpreter) the rounded operands
    are multiplied as float32, which gives the same products."""
    a = cast(a, DT, EMULATE_RTNE)
    b = cast(b, DT, EMULATE_RTNE)
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@device_function
def _mm32(a, b, EXACT: tl.constexpr):
    """a @ b of float32 operands: full float32 ("ieee", CUDA-core FMAs) when EXACT, else TF32."""
    if EXACT:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision="tf32")


@device_function
def _lengths(cu_ptr, num_seqs, BLOCK_N: tl.constexpr):
    """(index, start, end) of every sequence as [BLOCK_N] vectors; padding lanes are empty."""
    i = tl.arange(0, BLOCK_N)
    live = i < num_seqs
    bos = tl.load(cu_ptr + i, mask=live, other=0).to(tl.int32)
    eos = tl.load(cu_ptr + i + 1, mask=live, other=0).to(tl.int32)
    return i, bos, tl.maximum(eos, bos)


@device_function
def _locate(cu_ptr, unit, num_seqs, span, BLOCK_N: tl.constexpr):
    """Which piece is work unit ``unit``, counting the pieces of ``span`` tokens (the last one of a
    sequence shorter) of every sequence in order: (sequence, piece within it, start and end of
    the sequence). Past the last piece the sequence is >= num_seqs and start == end == 0."""
    i, bos_i, eos_i = _lengths(cu_ptr, num_seqs, BLOCK_N)
    pieces = tl.cdiv(eos_i - bos_i, span)
    ends = tl.cumsum(pieces, 0)
    seq = tl.sum((ends <= unit).to(tl.int32), 0)
    here = i == seq
    first = tl.sum(tl.where(here, ends - pieces, 0), 0)
    bos = tl.sum(tl.where(here, bos_i, 0), 0)
    eos = tl.sum(tl.where(here, eos_i, 0), 0)
    return seq, unit - first, bos, eos


@device_function
def _at(ptr, t, H, h, D):
    """&x[t, h, 0] of a [tokens, H, D] tensor. The int64 arithmetic happens once, on this scalar;
    offsets within a chunk fit int32, so tiles carry no 64-bit index per element (registers)."""
    return ptr + (tl.cast(t, tl.int64) * H + h) * D


@device_function
def _tile(base, rows, m, stride, cols, cmask):
    """base[rows * stride + cols] (zero where masked), in its own dtype."""
    return tl.load(base + rows[:, None] * stride + cols[None, :], mask=m[:, None] & cmask[None, :], other=0.0)


@device_function
def _store_tile(base, rows, m, stride, cols, cmask, x, OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    tl.store(base + rows[:, None] * stride + cols[None, :], cast(x, OUT_DTYPE, EMULATE_RTNE),
             mask=m[:, None] & cmask[None, :])


@device_function
def _gates(g_base, beta_base, gcum_base, rows, m, carry, HV):
    """Gates of a block of rows: (G, beta) as float32, G = carry + the running sum of g (stored);
    and the new carry."""
    g = tl.load(g_base + rows * HV, mask=m, other=0.0).to(tl.float32)
    G = carry + tl.cumsum(g, 0)
    tl.store(gcum_base + rows * HV, G, mask=m)
    beta = tl.load(beta_base + rows * HV, mask=m, other=0.0).to(tl.float32)
    return G, beta, carry + tl.sum(g, 0)


@device_function
def _decayed(a, b, Ga, Gb, DIAG: tl.constexpr, DOT_F32: tl.constexpr):
    """exp(Ga[s] - Gb[r]) (a_s . b_r) for rows s and columns r of one chunk: all of them when
    the rows are a later block than the columns (DIAG 0); only r < s (DIAG 1) or r <= s (DIAG 2)
    when they are the same tokens. Masked before the exp: above the diagonal Ga - Gb > 0 could
    overflow."""
    n: tl.constexpr = a.shape[0]
    ab = dot(a, tl.trans(b), tl.zeros([n, n], dtype=tl.float32), DOT_F32)
    diff = Ga[:, None] - Gb[None, :]
    if DIAG == 1:
        diff = tl.where(tl.arange(0, n)[:, None] > tl.arange(0, n)[None, :], diff, float("-inf"))
    elif DIAG == 2:
        diff = tl.where(tl.arange(0, n)[:, None] >= tl.arange(0, n)[None, :], diff, float("-inf"))
    return tl.exp(diff) * ab


@device_function
def _invert_unit_lower(L):
    """(I + L)^-1 for a strictly lower-triangular n x n L: n - 1 rounds of X <- I - L X from X = I.

    This is forward substitution with every row redone each round (one dot per round instead
    of n row extractions): row i of I - L X reads only rows r < i of X (L[i, r] = 0 for r >= i),
    and after round m rows 0..m are final, computed from final rows as forward substitution
    computes them. Rows not final yet hold partial Neumann sums; they are finite for n = 16 and
    |L| <= 1 (below 2^n), and only ever meet the exact zeros of L.
    """
    n: tl.constexpr = L.shape[0]
    eye = (tl.arange(0, n)[:, None] == tl.arange(0, n)[None, :]).to(tl.float32)
    X = eye
    for _ in tl.static_range(1, n):
        X = eye - _mm32(L, X, True)
    return X


@device_function
def _invert4_by_rows(l_at, l_stride, n, SUB: tl.constexpr):
    """(I + L_bb)^-1 of the chunk's four diagonal 16 x 16 blocks b, L stored float32 at
    l_at[row * l_stride + column] (strictly lower: zeros on and above the diagonal).

    Forward substitution one row at a time, the four blocks in the same loop (four independent
    chains the compiler can interleave): row i of X = e_i - sum_{m<i} L[i, m] X[m, :], with X's
    rows m >= i still e_m, which L[i, m] = 0 leaves out. Each step is a broadcast product and a
    sum of a 16 x 16 tile, no tl.dot: the dot form (``_invert_unit_lower``) pays an operand
    layout conversion through shared memory per round, for 16 x 16 x 16 FMAs. The blocks are
    kept transposed (Y = X^T, row i of X is column i of Y), so that the sum runs along a tile's
    second axis, which Triton lays out within a warp: shuffles, no barrier per step. L's row i is
    loaded from memory straight into the layout it is used in. Rows at or past n stay e_i."""
    r = tl.arange(0, SUB)
    eye = (r[:, None] == r[None, :]).to(tl.float32)
    Y0 = eye
    Y1 = eye
    Y2 = eye
    Y3 = eye
    for i in tl.static_range(1, SUB):
        a0 = tl.load(l_at + i * l_stride + r, mask=(i < n) & (r < i), other=0.0)
        a1 = tl.load(l_at + (SUB + i) * l_stride + SUB + r, mask=(SUB + i < n) & (r < i), other=0.0)
        a2 = tl.load(l_at + (2 * SUB + i) * l_stride + 2 * SUB + r, mask=(2 * SUB + i < n) & (r < i), other=0.0)
        a3 = tl.load(l_at + (3 * SUB + i) * l_stride + 3 * SUB + r, mask=(3 * SUB + i < n) & (r < i), other=0.0)
        col = r[None, :] == i
        Y0 = tl.where(col, eye - tl.sum(Y0 * a0[None, :], 1)[:, None], Y0)
        Y1 = tl.where(col, eye - tl.sum(Y1 * a1[None, :], 1)[:, None], Y1)
        Y2 = tl.where(col, eye - tl.sum(Y2 * a2[None, :], 1)[:, None], Y2)
        Y3 = tl.where(col, eye - tl.sum(Y3 * a3[None, :], 1)[:, None], Y3)
    return tl.trans(Y0), tl.trans(Y1), tl.trans(Y2), tl.trans(Y3)


@device_function
def _solve_rows(out_at, out_stride, x_at, x_stride, D, BLOCK_D: tl.constexpr, CB: tl.constexpr, n,
                X00, X10, X11, X20, X21, X22, X30, X31, X32, X33, c0, c1, c2, c3,
                SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """out = (X diag(c)) x over the chunk's n rows, for X block lower-triangular (16 x 16 blocks
    X_ij) and column scales c (blocks c0..c3): the scales go on X, so x enters the products as
    loaded; CB columns at a time (fewer live registers)."""
    r = tl.arange(0, SUB)
    Y00, Y10, Y11 = X00 * c0[None, :], X10 * c0[None, :], X11 * c1[None, :]
    Y20, Y21, Y22 = X20 * c0[None, :], X21 * c1[None, :], X22 * c2[None, :]
    Y30, Y31, Y32, Y33 = X30 * c0[None, :], X31 * c1[None, :], X32 * c2[None, :], X33 * c3[None, :]
    for col0 in tl.static_range(0, BLOCK_D, CB):
        cols = col0 + tl.arange(0, CB)
        cm = cols < D
        x0 = _tile(x_at, r, r < n, x_stride, cols, cm)
        x1 = _tile(x_at, SUB + r, SUB + r < n, x_stride, cols, cm)
        x2 = _tile(x_at, 2 * SUB + r, 2 * SUB + r < n, x_stride, cols, cm)
        x3 = _tile(x_at, 3 * SUB + r, 3 * SUB + r < n, x_stride, cols, cm)
        _store_tile(out_at, r, r < n, out_stride, cols, cm, _mm(Y00, x0, DT, DOT_F32, EMULATE_RTNE), DT, EMULATE_RTNE)
        _store_tile(out_at, SUB + r, SUB + r < n, out_stride, cols, cm,
                    _mm(Y10, x0, DT, DOT_F32, EMULATE_RTNE) + _mm(Y11, x1, DT, DOT_F32, EMULATE_RTNE), DT, EMULATE_RTNE)
        _store_tile(out_at, 2 * SUB + r, 2 * SUB + r < n, out_stride, cols, cm,
                    _mm(Y20, x0, DT, DOT_F32, EMULATE_RTNE) + _mm(Y21, x1, DT, DOT_F32, EMULATE_RTNE)
                    + _mm(Y22, x2, DT, DOT_F32, EMULATE_RTNE), DT, EMULATE_RTNE)
        _store_tile(out_at, 3 * SUB + r, 3 * SUB + r < n, out_stride, cols, cm,
                    _mm(Y30, x0, DT, DOT_F32, EMULATE_RTNE) + _mm(Y31, x1, DT, DOT_F32, EMULATE_RTNE)
                    + _mm(Y32, x2, DT, DOT_F32, EMULATE_RTNE) + _mm(Y33, x3, DT, DOT_F32, EMULATE_RTNE),
                    DT, EMULATE_RTNE)


@device_function
def _solve_rows_full(out_at, out_stride, x_at, x_stride, D, BLOCK_D: tl.constexpr, CB: tl.constexpr, rm, Y,
                     DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """out = Y x over the chunk's rows (mask rm), Y = X diag(c) whole [C, C]; CB columns at a time."""
    r = tl.arange(0, Y.shape[0])
    for col0 in tl.static_range(0, BLOCK_D, CB):
        cols = col0 + tl.arange(0, CB)
        cm = cols < D
        _store_tile(out_at, r, rm, out_stride, cols, cm,
                    _mm(Y, _tile(x_at, r, rm, x_stride, cols, cm), DT, DOT_F32, EMULATE_RTNE), DT, EMULATE_RTNE)


# -- kernel A: the intra-chunk quantities -----------------------------------------------------------
@device_function
def _prepare_chunk(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr, t0, n, hv, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, KC: tl.constexpr, VC: tl.constexpr,
    SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    """The chunk of n tokens from t0, value head hv."""
    C: tl.constexpr = 4 * SUB
    hk = hv // (HV // HK)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    q_at = _at(q_ptr, t0, HK, hk, DK)
    k_at = _at(k_ptr, t0, HK, hk, DK)
    v_at = _at(v_ptr, t0, HV, hv, DV)
    g_at = _at(g_ptr, t0, HV, hv, 1)
    beta_at = _at(beta_ptr, t0, HV, hv, 1)
    gcum_at = _at(gcum_ptr, t0, HV, hv, 1)
    r0 = tl.arange(0, SUB)
    r1 = SUB + r0
    r2 = 2 * SUB + r0
    r3 = 3 * SUB + r0
    m0, m1, m2, m3 = r0 < n, r1 < n, r2 < n, r3 < n
    # Rows past the chunk's end read g = beta = k = v = 0: they decay nothing and write nothing.
    G0, b0, carry = _gates(g_at, beta_at, gcum_at, r0, m0, 0.0, HV)
    G1, b1, carry = _gates(g_at, beta_at, gcum_at, r1, m1, carry, HV)
    G2, b2, carry = _gates(g_at, beta_at, gcum_at, r2, m2, carry, HV)
    G3, b3, carry = _gates(g_at, beta_at, gcum_at, r3, m3, carry, HV)
    k0 = _tile(k_at, r0, m0, HK * DK, kk, kmask)
    k1 = _tile(k_at, r1, m1, HK * DK, kk, kmask)
    k2 = _tile(k_at, r2, m2, HK * DK, kk, kmask)
    k3 = _tile(k_at, r3, m3, HK * DK, kk, kmask)

    # X = (I + L)^-1 by 16 x 16 blocks; L_ij = diag(beta_i) (decayed k_i k_j^T)
    X00 = _invert_unit_lower(b0[:, None] * _decayed(k0, k0, G0, G0, 1, DOT_F32))
    X11 = _invert_unit_lower(b1[:, None] * _decayed(k1, k1, G1, G1, 1, DOT_F32))
    X22 = _invert_unit_lower(b2[:, None] * _decayed(k2, k2, G2, G2, 1, DOT_F32))
    X33 = _invert_unit_lower(b3[:, None] * _decayed(k3, k3, G3, G3, 1, DOT_F32))
    L10 = b1[:, None] * _decayed(k1, k0, G1, G0, 0, DOT_F32)
    L20 = b2[:, None] * _decayed(k2, k0, G2, G0, 0, DOT_F32)
    L21 = b2[:, None] * _decayed(k2, k1, G2, G1, 0, DOT_F32)
    L30 = b3[:, None] * _decayed(k3, k0, G3, G0, 0, DOT_F32)
    L31 = b3[:, None] * _decayed(k3, k1, G3, G1, 0, DOT_F32)
    L32 = b3[:, None] * _decayed(k3, k2, G3, G2, 0, DOT_F32)
    X10 = -_mm32(X11, _mm32(L10, X00, True), True)
    X21 = -_mm32(X22, _mm32(L21, X11, True), True)
    X32 = -_mm32(X33, _mm32(L32, X22, True), True)
    X20 = -_mm32(X22, _mm32(L20, X00, True) + _mm32(L21, X10, True), True)
    X31 = -_mm32(X33, _mm32(L31, X11, True) + _mm32(L32, X21, True), True)
    X30 = -_mm32(X33, _mm32(L30, X00, True) + _mm32(L31, X10, True) + _mm32(L32, X20, True), True)

    # W = X diag(beta e^G) K and U0 = X diag(beta) V
    _solve_rows(_at(w_ptr, t0, HV, hv, DK), HV * DK, k_at, HK * DK, DK, BLOCK_K, KC, n,
                X00, X10, X11, X20, X21, X22, X30, X31, X32, X33,
                b0 * tl.exp(G0), b1 * tl.exp(G1), b2 * tl.exp(G2), b3 * tl.exp(G3), SUB, DT, DOT_F32, EMULATE_RTNE)
    _solve_rows(_at(u_ptr, t0, HV, hv, DV), HV * DV, v_at, HV * DV, DV, BLOCK_DV, VC, n,
                X00, X10, X11, X20, X21, X22, X30, X31, X32, X33, b0, b1, b2, b3, SUB, DT, DOT_F32, EMULATE_RTNE)

    # P = M o (Q K^T) * scale over the whole chunk (G again, as one vector)
    r = tl.arange(0, C)
    rm = r < n
    G = tl.cumsum(tl.load(g_at + r * HV, mask=rm, other=0.0).to(tl.float32), 0)
    P = _decayed(_tile(q_at, r, rm, HK * DK, kk, kmask), _tile(k_at, r, rm, HK * DK, kk, kmask), G, G, 2, DOT_F32)
    _store_tile(_at(p_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C, P * scale, DT, EMULATE_RTNE)


@triton.jit
def _prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr,
    num_seqs, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, KC: tl.constexpr, VC: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    """Grid (chunk slots, HV): G, W, U0 and P of one chunk of one value head (module docstring)."""
    C: tl.constexpr = 4 * SUB
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    seq, c, bos, eos = _locate(cu_ptr, unit, num_seqs, C, BLOCK_N)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)  # tokens in this chunk; <= 0 for slots past the last chunk
    if n > 0:
        _prepare_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr, t0, n, hv, scale,
                       HK, HV, DK, DV, BLOCK_K, BLOCK_DV, KC, VC, SUB, DT, DOT_F32, EMULATE_RTNE)


# -- kernel A split in two: the triangular solve, then the products (lower register pressure) --------
@device_function
def _solve_chunk(k_ptr, g_ptr, beta_ptr, x_ptr, gcum_ptr, t0, n, hv,
                 HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr,
                 SUB: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, INVERT_ROWS: tl.constexpr):
    """G (stored) and X = (I + L)^-1 of the chunk of n tokens from t0, value head hv, stored float32
    as x[t0 + row, hv, column] (rows past n are not written).

    L is formed whole, by one [C, K] x [K, C] product, and parked in x (this program's own rows):
    the solve then reads it back one 16 x 16 block at a time, so that no key tile stays live
    through the solve (the fused kernel's register pressure). Row block i of X replaces row block
    i of L once every thread has read the latter (a barrier: the same program's threads).

    INVERT_ROWS: the diagonal blocks by row substitution, all four at once
    (:func:`_invert4_by_rows`), then every off-diagonal block from registers and one store of
    all of X at the end (no barrier between the blocks); else block row by block row with
    ``_invert_unit_lower``'s dot rounds."""
    C: tl.constexpr = 4 * SUB
    hk = hv // (HV // HK)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    x_at = _at(x_ptr, t0, HV, hv, C)
    r = tl.arange(0, C)
    rm = r < n
    G, beta, _ = _gates(_at(g_ptr, t0, HV, hv, 1), _at(beta_ptr, t0, HV, hv, 1), _at(gcum_ptr, t0, HV, hv, 1),
                        r, rm, 0.0, HV)
    kt = _tile(_at(k_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
    F32: tl.constexpr = tl.float32
    _store_tile(x_at, r, rm, HV * C, r, r < C, beta[:, None] * _decayed(kt, kt, G, G, 1, DOT_F32), F32, EMULATE_RTNE)
    tl.debug_barrier()
    r0 = tl.arange(0, SUB)
    r1, r2, r3 = SUB + r0, 2 * SUB + r0, 3 * SUB + r0
    m0, m1, m2, m3 = r0 < n, r1 < n, r2 < n, r3 < n
    full = r0 < SUB
    if INVERT_ROWS:
        X00, X11, X22, X33 = _invert4_by_rows(x_at, HV * C, n, SUB)
        L10 = _tile(x_at, r1, m1, HV * C, r0, full)
        L20 = _tile(x_at, r2, m2, HV * C, r0, full)
        L21 = _tile(x_at, r2, m2, HV * C, r1, full)
        L30 = _tile(x_at, r3, m3, HV * C, r0, full)
        L31 = _tile(x_at, r3, m3, HV * C, r1, full)
        L32 = _tile(x_at, r3, m3, HV * C, r2, full)
        X10 = -_mm32(X11, _mm32(L10, X00, True), True)
        X21 = -_mm32(X22, _mm32(L21, X11, True), True)
        X32 = -_mm32(X33, _mm32(L32, X22, True), True)
        X20 = -_mm32(X22, _mm32(L20, X00, True) + _mm32(L21, X10, True), True)
        X31 = -_mm32(X33, _mm32(L31, X11, True) + _mm32(L32, X21, True), True)
        X30 = -_mm32(X33, _mm32(L30, X00, True) + _mm32(L31, X10, True) + _mm32(L32, X20, True), True)
        tl.debug_barrier()
        _store_tile(x_at, r0, m0, HV * C, r0, full, X00, F32, EMULATE_RTNE)
        _store_tile(x_at, r1, m1, HV * C, r0, full, X10, F32, EMULATE_RTNE)
        _store_tile(x_at, r1, m1, HV * C, r1, full, X11, F32, EMULATE_RTNE)
        _store_tile(x_at, r2, m2, HV * C, r0, full, X20, F32, EMULATE_RTNE)
        _store_tile(x_at, r2, m2, HV * C, r1, full, X21, F32, EMULATE_RTNE)
        _store_tile(x_at, r2, m2, HV * C, r2, full, X22, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r0, full, X30, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r1, full, X31, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r2, full, X32, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r3, full, X33, F32, EMULATE_RTNE)
    else:
        X00 = _invert_unit_lower(_tile(x_at, r0, m0, HV * C, r0, full))
        tl.debug_barrier()
        _store_tile(x_at, r0, m0, HV * C, r0, full, X00, F32, EMULATE_RTNE)
        X11 = _invert_unit_lower(_tile(x_at, r1, m1, HV * C, r1, full))
        X10 = -_mm32(X11, _mm32(_tile(x_at, r1, m1, HV * C, r0, full), X00, True), True)
        tl.debug_barrier()
        _store_tile(x_at, r1, m1, HV * C, r0, full, X10, F32, EMULATE_RTNE)
        _store_tile(x_at, r1, m1, HV * C, r1, full, X11, F32, EMULATE_RTNE)
        L21 = _tile(x_at, r2, m2, HV * C, r1, full)
        X22 = _invert_unit_lower(_tile(x_at, r2, m2, HV * C, r2, full))
        X21 = -_mm32(X22, _mm32(L21, X11, True), True)
        X20 = -_mm32(X22, _mm32(_tile(x_at, r2, m2, HV * C, r0, full), X00, True) + _mm32(L21, X10, True), True)
        tl.debug_barrier()
        _store_tile(x_at, r2, m2, HV * C, r0, full, X20, F32, EMULATE_RTNE)
        _store_tile(x_at, r2, m2, HV * C, r1, full, X21, F32, EMULATE_RTNE)
        _store_tile(x_at, r2, m2, HV * C, r2, full, X22, F32, EMULATE_RTNE)
        L31 = _tile(x_at, r3, m3, HV * C, r1, full)
        L32 = _tile(x_at, r3, m3, HV * C, r2, full)
        X33 = _invert_unit_lower(_tile(x_at, r3, m3, HV * C, r3, full))
        X32 = -_mm32(X33, _mm32(L32, X22, True), True)
        X31 = -_mm32(X33, _mm32(L31, X11, True) + _mm32(L32, X21, True), True)
        X30 = -_mm32(X33, _mm32(_tile(x_at, r3, m3, HV * C, r0, full), X00, True) + _mm32(L31, X10, True)
                     + _mm32(L32, X20, True), True)
        tl.debug_barrier()
        _store_tile(x_at, r3, m3, HV * C, r0, full, X30, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r1, full, X31, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r2, full, X32, F32, EMULATE_RTNE)
        _store_tile(x_at, r3, m3, HV * C, r3, full, X33, F32, EMULATE_RTNE)


@triton.jit
def _solve_kernel(
    k_ptr, g_ptr, beta_ptr, cu_ptr, x_ptr, gcum_ptr, num_seqs,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
    INVERT_ROWS: tl.constexpr,
):
    """Grid (chunk slots, HV): G and X of one chunk of one value head (the first half of
    ``_prepare_kernel``'s work)."""
    C: tl.constexpr = 4 * SUB
    seq, c, bos, eos = _locate(cu_ptr, tl.program_id(0), num_seqs, C, BLOCK_N)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        _solve_chunk(k_ptr, g_ptr, beta_ptr, x_ptr, gcum_ptr, t0, n, tl.program_id(1),
                     HK, HV, DK, BLOCK_K, SUB, DOT_F32, EMULATE_RTNE, INVERT_ROWS)


@triton.jit
def _products_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, cu_ptr, x_ptr, gcum_ptr, w_ptr, u_ptr, p_ptr, num_seqs, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, KC: tl.constexpr, VC: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
    FULL_X: tl.constexpr,
):
    """Grid (chunk slots, HV, 3): from the stored X and G, one of W = X diag(beta e^G) K (part 0),
    U0 = X diag(beta) V (part 1), P = M o (Q K^T) / sqrt(K) (part 2), each by its own program.

    FULL_X: W and U0 as one [C, C] x [C, cols] product each (X whole, its zero upper blocks
    included: one tensor-core tile of 64 rows, as fla's recompute of w and u does); else by its
    16 x 16 blocks (``_solve_rows``: no multiplications by zero blocks, but ten small products)."""
    C: tl.constexpr = 4 * SUB
    seq, c, bos, eos = _locate(cu_ptr, tl.program_id(0), num_seqs, C, BLOCK_N)
    hv = tl.program_id(1)
    part = tl.program_id(2)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        hk = hv // (HV // HK)
        kk = tl.arange(0, BLOCK_K)
        kmask = kk < DK
        k_at = _at(k_ptr, t0, HK, hk, DK)
        gcum_at = _at(gcum_ptr, t0, HV, hv, 1)
        if part == 2:
            r = tl.arange(0, C)
            rm = r < n
            G = tl.load(gcum_at + r * HV, mask=rm, other=0.0)
            P = _decayed(_tile(_at(q_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask),
                         _tile(k_at, r, rm, HK * DK, kk, kmask), G, G, 2, DOT_F32)
            _store_tile(_at(p_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C, P * scale, DT, EMULATE_RTNE)
        elif FULL_X:
            r = tl.arange(0, C)
            rm = r < n
            x_at = _at(x_ptr, t0, HV, hv, C)
            X = _tile(x_at, r, rm, HV * C, r, r < C)  # rows past n are another chunk's: masked to 0
            cs = tl.load(_at(beta_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0).to(tl.float32)
            if part == 0:
                cs = cs * tl.exp(tl.load(gcum_at + r * HV, mask=rm, other=0.0))
                _solve_rows_full(_at(w_ptr, t0, HV, hv, DK), HV * DK, k_at, HK * DK, DK, BLOCK_K, KC, rm, X * cs[None, :],
                                 DT, DOT_F32, EMULATE_RTNE)
            else:
                _solve_rows_full(_at(u_ptr, t0, HV, hv, DV), HV * DV, _at(v_ptr, t0, HV, hv, DV), HV * DV, DV,
                                 BLOCK_DV, VC, rm, X * cs[None, :], DT, DOT_F32, EMULATE_RTNE)
        else:
            x_at = _at(x_ptr, t0, HV, hv, C)
            beta_at = _at(beta_ptr, t0, HV, hv, 1)
            r0 = tl.arange(0, SUB)
            r1, r2, r3 = SUB + r0, 2 * SUB + r0, 3 * SUB + r0
            m0, m1, m2, m3 = r0 < n, r1 < n, r2 < n, r3 < n
            full = r0 < SUB
            X00 = _tile(x_at, r0, m0, HV * C, r0, full)
            X10 = _tile(x_at, r1, m1, HV * C, r0, full)
            X11 = _tile(x_at, r1, m1, HV * C, r1, full)
            X20 = _tile(x_at, r2, m2, HV * C, r0, full)
            X21 = _tile(x_at, r2, m2, HV * C, r1, full)
            X22 = _tile(x_at, r2, m2, HV * C, r2, full)
            X30 = _tile(x_at, r3, m3, HV * C, r0, full)
            X31 = _tile(x_at, r3, m3, HV * C, r1, full)
            X32 = _tile(x_at, r3, m3, HV * C, r2, full)
            X33 = _tile(x_at, r3, m3, HV * C, r3, full)
            b0 = tl.load(beta_at + r0 * HV, mask=m0, other=0.0).to(tl.float32)
            b1 = tl.load(beta_at + r1 * HV, mask=m1, other=0.0).to(tl.float32)
            b2 = tl.load(beta_at + r2 * HV, mask=m2, other=0.0).to(tl.float32)
            b3 = tl.load(beta_at + r3 * HV, mask=m3, other=0.0).to(tl.float32)
            if part == 0:
                e0 = tl.exp(tl.load(gcum_at + r0 * HV, mask=m0, other=0.0))
                e1 = tl.exp(tl.load(gcum_at + r1 * HV, mask=m1, other=0.0))
                e2 = tl.exp(tl.load(gcum_at + r2 * HV, mask=m2, other=0.0))
                e3 = tl.exp(tl.load(gcum_at + r3 * HV, mask=m3, other=0.0))
                _solve_rows(_at(w_ptr, t0, HV, hv, DK), HV * DK, k_at, HK * DK, DK, BLOCK_K, KC, n,
                            X00, X10, X11, X20, X21, X22, X30, X31, X32, X33,
                            b0 * e0, b1 * e1, b2 * e2, b3 * e3, SUB, DT, DOT_F32, EMULATE_RTNE)
            else:
                _solve_rows(_at(u_ptr, t0, HV, hv, DV), HV * DV, _at(v_ptr, t0, HV, hv, DV), HV * DV, DV,
                            BLOCK_DV, VC, n, X00, X10, X11, X20, X21, X22, X30, X31, X32, X33,
                            b0, b1, b2, b3, SUB, DT, DOT_F32, EMULATE_RTNE)


@triton.jit
def _solve_products_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, x_ptr, gcum_ptr, w_ptr, u_ptr, p_ptr, num_seqs, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, KC: tl.constexpr, VC: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, WITH_P: tl.constexpr,
):
    """Grid (chunk slots, HV), prepare="merged": ``_solve_kernel``'s work (row-substitution inverse),
    then, in the same program, ``_products_kernel``'s with X whole: W, U0 and (WITH_P) P. X is read
    back by the program that stored it (after a barrier), from cache rather than by another kernel."""
    C: tl.constexpr = 4 * SUB
    seq, c, bos, eos = _locate(cu_ptr, tl.program_id(0), num_seqs, C, BLOCK_N)
    hv = tl.program_id(1)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        _solve_chunk(k_ptr, g_ptr, beta_ptr, x_ptr, gcum_ptr, t0, n, hv, HK, HV, DK, BLOCK_K, SUB, DOT_F32,
                     EMULATE_RTNE, True)
        tl.debug_barrier()  # every thread's X (and G) stored before any thread reads them whole
        hk = hv // (HV // HK)
        kk = tl.arange(0, BLOCK_K)
        kmask = kk < DK
        k_at = _at(k_ptr, t0, HK, hk, DK)
        r = tl.arange(0, C)
        rm = r < n
        G = tl.load(_at(gcum_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0)
        b = tl.load(_at(beta_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0).to(tl.float32)
        X = _tile(_at(x_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C)
        _solve_rows_full(_at(w_ptr, t0, HV, hv, DK), HV * DK, k_at, HK * DK, DK, BLOCK_K, KC, rm,
                         X * (b * tl.exp(G))[None, :], DT, DOT_F32, EMULATE_RTNE)
        _solve_rows_full(_at(u_ptr, t0, HV, hv, DV), HV * DV, _at(v_ptr, t0, HV, hv, DV), HV * DV, DV, BLOCK_DV,
                         VC, rm, X * b[None, :], DT, DOT_F32, EMULATE_RTNE)
        if WITH_P:
            P = _decayed(_tile(_at(q_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask),
                         _tile(k_at, r, rm, HK * DK, kk, kmask), G, G, 2, DOT_F32)
            _store_tile(_at(p_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C, P * scale, DT, EMULATE_RTNE)


# -- the state walk ---------------------------------------------------------------------------------
@device_function
def _advance(S, t0, end, hv, hk, q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr, o_ptr,
             kk, kmask, cols, vmask, umask, scale,
             HK, HV, DK, DV, C: tl.constexpr, OUTPUTS: tl.constexpr, DT: tl.constexpr,
             DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, unew_ptr, STORE_U: tl.constexpr):
    """The state columns S [BLOCK_K, BLOCK_V] after the chunk [t0, min(t0 + C, end)); writes the
    chunk's outputs in those columns when OUTPUTS, its deltas U (in DT, to ``unew_ptr``, laid out
    like u) when STORE_U. U0 is read where ``umask`` (else taken as 0).

    The decays go on the small side of each product (rows of Q S, rows of U), so that Q, K and W
    enter the products as loaded, in the input dtype: no float32 copy of a [C, K] tile.
    """
    r = tl.arange(0, C)
    n = tl.minimum(end - t0, C)
    rm = r < n
    gcum_at = _at(gcum_ptr, t0, HV, hv, 1)
    G = tl.load(gcum_at + r * HV, mask=rm, other=0.0)
    G_end = tl.load(gcum_at + (n - 1) * HV)
    W = _tile(_at(w_ptr, t0, HV, hv, DK), r, rm, HV * DK, kk, kmask)
    U = _tile(_at(u_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, umask).to(tl.float32)
    U = U - _mm(W, S, DT, DOT_F32, EMULATE_RTNE)
    if STORE_U:
        _store_tile(_at(unew_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask, U, DT, EMULATE_RTNE)
    if OUTPUTS:
        q = _tile(_at(q_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
        P = _tile(_at(p_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C)
        O = (tl.exp(G) * scale)[:, None] * _mm(q, S, DT, DOT_F32, EMULATE_RTNE) + _mm(P, U, DT, DOT_F32, EMULATE_RTNE)
        _store_tile(_at(o_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask, O, DT, EMULATE_RTNE)
    k = _tile(_at(k_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
    return S * tl.exp(G_end) + _mm(tl.trans(k), U * tl.exp(G_end - G)[:, None], DT, DOT_F32, EMULATE_RTNE)


@device_function
def _state_slice(DK, DV, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """This program's state columns (block program_id(2) of BLOCK_V): rows kk, columns cols, their
    masks, and their offsets within one [DK, DV] state."""
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = cols < DV
    return kk, kmask, cols, vmask, kmask[:, None] & vmask[None, :], kk[:, None] * DV + cols[None, :]


@device_function
def _state_at(ptr, row, hv, HV, DK, DV):
    """&x[row, hv, 0, 0] of a [rows, HV, DK, DV] state tensor."""
    return ptr + (tl.cast(row, tl.int64) * HV + hv) * DK * DV


@triton.jit
def _walk_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr, cu_ptr, start_ptr, o_ptr, final_ptr, ckpt_ptr,
    unew_ptr, states_ptr,
    num_seqs, seg_tokens, ckpt_every, ckpt_rows, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr,
    SEGMENTED: tl.constexpr, HAS_START: tl.constexpr, CHECKPOINTS: tl.constexpr, DEFER_OUTPUTS: tl.constexpr,
    DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (sequences or segment slots, HV, value blocks): outputs, checkpoints, final state.

    SEGMENTED: unit is a segment slot, started from the combine's start states (start_ptr, one
    row per slot); else unit is a sequence, started from its initial state (start_ptr, one row
    per sequence) or zero. DEFER_OUTPUTS: instead of the outputs, each chunk's start state (in DT,
    states_ptr, one row per chunk slot) and deltas (unew_ptr) go to memory, for ``_output_kernel``:
    the sequential walk is left two of its four products.
    """
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    kk, kmask, cols, vmask, smask, s_offs = _state_slice(DK, DV, BLOCK_K, BLOCK_V)
    if SEGMENTED:
        seq, seg, bos, eos = _locate(cu_ptr, unit, num_seqs, seg_tokens, BLOCK_N)
        start = bos + seg * seg_tokens
        stop = tl.minimum(eos, start + seg_tokens)
    else:
        seq = unit
        bos = tl.load(cu_ptr + seq).to(tl.int32)
        eos = tl.maximum(tl.load(cu_ptr + seq + 1).to(tl.int32), bos)
        start = bos
        stop = eos
    live = seq < num_seqs
    if HAS_START:
        S = tl.load(_state_at(start_ptr, unit, hv, HV, DK, DV) + s_offs, mask=smask & live, other=0.0)
    else:
        S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    if CHECKPOINTS:
        # checkpoints of earlier sequences come first in the buffer
        i, bos_i, eos_i = _lengths(cu_ptr, num_seqs, BLOCK_N)
        base = tl.sum(tl.where(i < seq, (eos_i - bos_i) // ckpt_every, 0), 0)
    if DEFER_OUTPUTS:  # chunk slots of earlier sequences come first (the order _locate counts them in)
        i2, bos2, eos2 = _lengths(cu_ptr, num_seqs, BLOCK_N)
        first_chunk = tl.sum(tl.where(i2 < seq, tl.cdiv(eos2 - bos2, C), 0), 0)
    for t0 in range(start, stop, C):
        if DEFER_OUTPUTS:
            slot = first_chunk + (t0 - bos) // C
            tl.store(_state_at(states_ptr, slot, hv, HV, DK, DV) + s_offs, cast(S, DT, EMULATE_RTNE), mask=smask)
        S = _advance(S, t0, stop, hv, hk, q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, gcum_ptr, o_ptr,
                     kk, kmask, cols, vmask, vmask, scale, HK, HV, DK, DV, C, not DEFER_OUTPUTS, DT, DOT_F32,
                     EMULATE_RTNE, unew_ptr, DEFER_OUTPUTS)
        if CHECKPOINTS:
            done = t0 + C - bos  # tokens of the sequence behind this state (a whole chunk: N % C == 0)
            row = base + done // ckpt_every - 1
            keep = (done % ckpt_every == 0) & (t0 + C <= eos) & (row < ckpt_rows)
            tl.store(_state_at(ckpt_ptr, row, hv, HV, DK, DV) + s_offs, S, mask=smask & keep)
    tl.store(_state_at(final_ptr, seq, hv, HV, DK, DV) + s_offs, S, mask=smask & live & (stop == eos))


@triton.jit
def _output_kernel(
    q_ptr, k_ptr, p_ptr, gcum_ptr, unew_ptr, states_ptr, cu_ptr, o_ptr, num_seqs, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr,
    DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, RECOMPUTE_P: tl.constexpr,
):
    """Grid (chunk slots, HV, value blocks), all in parallel after a DEFER_OUTPUTS walk:
    O = diag(exp(G)) Q S0 / sqrt(K) + P U of one chunk, from its start state S0 and deltas U.
    RECOMPUTE_P: P = M o (Q K^T) / sqrt(K) formed here from the key tile (one [C, K] x [K, C]
    product) instead of read from p (which the prepare then never writes): 2 x C bytes less of
    traffic per token and value head, for a product per value block."""
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    seq, c, bos, eos = _locate(cu_ptr, unit, num_seqs, C, BLOCK_N)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        hk = hv // (HV // HK)
        kk, kmask, cols, vmask, smask, s_offs = _state_slice(DK, DV, BLOCK_K, BLOCK_V)
        S = tl.load(_state_at(states_ptr, unit, hv, HV, DK, DV) + s_offs, mask=smask, other=0.0)
        r = tl.arange(0, C)
        rm = r < n
        G = tl.load(_at(gcum_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0)
        q = _tile(_at(q_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
        if RECOMPUTE_P:
            P = _decayed(q, _tile(_at(k_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask), G, G, 2, DOT_F32) * scale
        else:
            P = _tile(_at(p_ptr, t0, HV, hv, C), r, rm, HV * C, r, r < C)
        U = _tile(_at(unew_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask)
        O = (tl.exp(G) * scale)[:, None] * _mm(q, S, DT, DOT_F32, EMULATE_RTNE) + _mm(P, U, DT, DOT_F32, EMULATE_RTNE)
        _store_tile(_at(o_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask, O, DT, EMULATE_RTNE)


# -- one chunk per sequence: the whole call in one kernel (a prefix-cache hit's short tail) ----------
@triton.jit
def _single_chunk_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, init_ptr, o_ptr, final_ptr, ckpt_ptr, x_ptr, gcum_ptr,
    num_seqs, tokens, ckpt_every, ckpt_rows, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, SUB: tl.constexpr,
    HAS_INIT: tl.constexpr, CHECKPOINTS: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr,
    EMULATE_RTNE: tl.constexpr,
):
    """Grid (sequences, HV, value blocks), every sequence at most one chunk (n <= C = 64 tokens):
    the prepare, the walk and the outputs of the module docstring in one program, for value
    columns ``cols`` of one head, from the start state S0 (``init_ptr``, or zero):

        G = cumsum(g),  X = (I + L)^-1        (``_solve_chunk``: the split prepare's solve, "rows")
        U = X diag(beta) (V - diag(exp(G)) K S0)                      = U0 - W S0
        O = diag(exp(G)) Q S0 / sqrt(K) + P U,  P = M o (Q K^T) / sqrt(K)
        S = exp(G_n) S0 + (diag(exp(G_n - G)) K)^T U                  the final state

    (W S0 = X diag(beta exp(G)) K S0 is formed as X diag(beta) (diag(exp(G)) K S0): one [C, K] x
    [K, BLOCK_V] product instead of W's [C, C] x [C, K].) X and G go through this program's own
    scratch rows (x_ptr, gcum_ptr: [value blocks, tokens, HV, ...], so that programs of other value
    blocks never touch them), as in the merged prepare: the solve parks L there and inverts it in
    place. The state after the chunk is also checkpoint row ``base`` when the sequence is exactly
    ``ckpt_every`` (= 64) tokens long, ``base`` counting the checkpoints of earlier sequences
    (``_walk_kernel``'s layout). A sequence without tokens gets its start state as final state."""
    C: tl.constexpr = 4 * SUB
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    kk, kmask, cols, vmask, smask, s_offs = _state_slice(DK, DV, BLOCK_K, BLOCK_V)
    bos = tl.load(cu_ptr + seq).to(tl.int32)
    n = tl.minimum(tl.maximum(tl.load(cu_ptr + seq + 1).to(tl.int32), bos) - bos, C)
    scratch = tl.program_id(2).to(tl.int64) * tokens * HV
    x_at = x_ptr + scratch * C
    gcum_at = gcum_ptr + scratch
    if n > 0:
        _solve_chunk(k_ptr, g_ptr, beta_ptr, x_at, gcum_at, bos, n, hv, HK, HV, DK, BLOCK_K, SUB, DOT_F32,
                     EMULATE_RTNE, True)
    tl.debug_barrier()  # every thread's X (and G) stored before any thread reads them whole
    # S0 is read after the solve (its registers are not held through it), first rounded to DT for
    # the two products that take it, and again in float32 for the final state.
    if HAS_INIT:
        s0_at = _state_at(init_ptr, seq, hv, HV, DK, DV) + s_offs
    else:
        s0_at = _state_at(final_ptr, seq, hv, HV, DK, DV) + s_offs  # never read
    if n > 0:
        r = tl.arange(0, C)
        rm = r < n
        G = tl.load(_at(gcum_at, bos, HV, hv, 1) + r * HV, mask=rm, other=0.0)
        G_n = tl.sum(tl.where(r == n - 1, G, 0.0), 0)
        G = tl.where(rm, G, G_n)  # rows past the end decay no further (P's exp(G_s - G_r) stays <= 1)
        k = _tile(_at(k_ptr, bos, HK, hk, DK), r, rm, HK * DK, kk, kmask)
        v = _tile(_at(v_ptr, bos, HV, hv, DV), r, rm, HV * DV, cols, vmask).to(tl.float32)
        if HAS_INIT:
            S0 = cast(tl.load(s0_at, mask=smask, other=0.0), DT, EMULATE_RTNE)
            v = v - tl.exp(G)[:, None] * _mm(k, S0, DT, DOT_F32, EMULATE_RTNE)
        beta = tl.load(_at(beta_ptr, bos, HV, hv, 1) + r * HV, mask=rm, other=0.0).to(tl.float32)
        X = _tile(_at(x_at, bos, HV, hv, C), r, rm, HV * C, r, r < C)  # rows past n: another sequence's
        U = _mm(X * beta[None, :], v, DT, DOT_F32, EMULATE_RTNE)
        q = _tile(_at(q_ptr, bos, HK, hk, DK), r, rm, HK * DK, kk, kmask)
        O = _mm(_decayed(q, k, G, G, 2, DOT_F32) * scale, U, DT, DOT_F32, EMULATE_RTNE)
        if HAS_INIT:
            O += (tl.exp(G) * scale)[:, None] * _mm(q, S0, DT, DOT_F32, EMULATE_RTNE)
        _store_tile(_at(o_ptr, bos, HV, hv, DV), r, rm, HV * DV, cols, vmask, O, DT, EMULATE_RTNE)
        S = _mm(tl.trans(k), U * tl.exp(G_n - G)[:, None], DT, DOT_F32, EMULATE_RTNE)
        if HAS_INIT:
            S += tl.load(s0_at, mask=smask, other=0.0) * tl.exp(G_n)
        if CHECKPOINTS:
            i, bos_i, eos_i = _lengths(cu_ptr, num_seqs, BLOCK_N)
            base = tl.sum(tl.where(i < seq, (eos_i - bos_i) // ckpt_every, 0), 0)
            keep = (n == ckpt_every) & (base < ckpt_rows)
            tl.store(_state_at(ckpt_ptr, base, hv, HV, DK, DV) + s_offs, S, mask=smask & keep)
    elif HAS_INIT:
        S = tl.load(s0_at, mask=smask, other=0.0)
    else:
        S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    tl.store(_state_at(final_ptr, seq, hv, HV, DK, DV) + s_offs, S, mask=smask)

# -- the sequence split: segment transitions and their scan -----------------------------------------
@triton.jit
def _transition_kernel(
    k_ptr, w_ptr, u_ptr, gcum_ptr, cu_ptr, trans_ptr,
    num_seqs, seg_tokens,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr,
    DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (segment slots, HV, value blocks + key blocks): the segment's affine map S -> A S + B
    as trans[slot, hv] = [B | A] ([DK, DV + DK]). Value blocks walk from S = 0 with the deltas U0;
    key blocks walk columns of the identity with U0 = 0."""
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    block = tl.program_id(2)
    hk = hv // (HV // HK)
    seq, seg, bos, eos = _locate(cu_ptr, unit, num_seqs, seg_tokens, BLOCK_N)
    start = bos + seg * seg_tokens
    stop = tl.minimum(eos, start + seg_tokens)
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    value_blocks = tl.cdiv(DV, BLOCK_V)
    is_a = block >= value_blocks
    cols = tl.where(is_a, block - value_blocks, block) * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < tl.where(is_a, DK, DV)
    S = tl.where(is_a & (kk[:, None] == cols[None, :]), 1.0, 0.0)
    # The combine never needs the map of a sequence's last segment: skip its walk.
    needed = (stop < eos) & (seq < num_seqs)
    for t0 in range(start, tl.where(needed, stop, start), C):
        S = _advance(S, t0, stop, hv, hk, k_ptr, k_ptr, w_ptr, u_ptr, k_ptr, gcum_ptr, k_ptr,
                     kk, kmask, cols, cmask, cmask & (~is_a), 0.0, HK, HV, DK, DV, C, False,
                     DT, DOT_F32, EMULATE_RTNE, k_ptr, False)
    WIDTH: tl.constexpr = DV + DK
    dst = trans_ptr + (unit.to(tl.int64) * HV + hv) * DK * WIDTH
    tl.store(dst + kk[:, None] * WIDTH + (tl.where(is_a, DV, 0) + cols)[None, :], S,
             mask=kmask[:, None] & cmask[None, :] & needed)


@triton.jit
def _combine_kernel(
    cu_ptr, init_ptr, trans_ptr, starts_ptr, final_ptr,
    num_seqs, seg_tokens,
    HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, KB: tl.constexpr,
    HAS_INIT: tl.constexpr, EXACT: tl.constexpr,
):
    """Grid (sequences, HV, value blocks): start states S_0 = initial, S_{j+1} = A_j S_j + B_j of
    every segment, into starts[slot]. A sequence without tokens has no segment: its final state
    is its initial state, written here."""
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    kk, kmask, cols, vmask, smask, s_offs = _state_slice(DK, DV, BLOCK_K, BLOCK_V)
    i, bos_i, eos_i = _lengths(cu_ptr, num_seqs, BLOCK_N)
    pieces = tl.cdiv(eos_i - bos_i, seg_tokens)
    first = tl.sum(tl.where(i < seq, pieces, 0), 0)
    count = tl.sum(tl.where(i == seq, pieces, 0), 0)
    if HAS_INIT:
        S = tl.load(_state_at(init_ptr, seq, hv, HV, DK, DV) + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    WIDTH: tl.constexpr = DV + DK
    for j in range(0, count - 1):
        start_at = _state_at(starts_ptr, first + j, hv, HV, DK, DV)
        tl.store(start_at + s_offs, S, mask=smask)
        # A S reads S back in blocks of KB rows (keeps the A tile at [BLOCK_K, KB]): every
        # thread's store of S must land first.
        tl.debug_barrier()
        tr = trans_ptr + ((first + j).to(tl.int64) * HV + hv) * DK * WIDTH
        S = tl.load(tr + kk[:, None] * WIDTH + cols[None, :], mask=smask, other=0.0)
        for r0 in tl.static_range(0, BLOCK_K, KB):
            r = r0 + tl.arange(0, KB)
            rmask = r < DK
            A = tl.load(tr + kk[:, None] * WIDTH + DV + r[None, :], mask=kmask[:, None] & rmask[None, :], other=0.0)
            S_rows = tl.load(start_at + r[:, None] * DV + cols[None, :], mask=rmask[:, None] & vmask[None, :],
                             other=0.0, cache_modifier=".cg")
            S += _mm32(A, S_rows, EXACT)
    tl.store(_state_at(starts_ptr, first + count - 1, hv, HV, DK, DV) + s_offs, S, mask=smask & (count > 0))
    tl.store(_state_at(final_ptr, seq, hv, HV, DK, DV) + s_offs, S, mask=smask & (count == 0))


# -- host side --------------------------------------------------------------------------------------
def num_checkpoints(lengths: Sequence[int], every: int) -> int:
    """Rows of the checkpoint buffer: sequence i contributes lengths[i] // every states (after
    every, 2 * every, ... of its tokens), after those of sequences 0..i-1."""
    return sum(int(n) // every for n in lengths)


def prefill_block_v(head_v: int) -> int:
    """Value columns per walk program: ``WALK_BLOCK_V`` (16: a [128, 16] float32 state slice, 16
    registers a thread at 4 warps; batch 1 x 16 heads is 128 programs before any split), the
    measured fastest; whole heads in the interpreter (fewer programs)."""
    whole = max(16, next_pow2(head_v))
    return whole if interpreting() else min(WALK_BLOCK_V, whole)


def prefill_split(num_seqs: int, num_v_heads: int, v_blocks: int, tokens: int) -> int:
    """Chunks per segment for the sequence split, 0 for none: split only when the walk's programs
    (sequences x value heads x value blocks) are fewer than the SMs, into about enough segments
    for two programs per SM, each at least MIN_SEGMENT_CHUNKS long. A guess from the launch
    geometry; the benchmark's split sweep is what should tune it."""
    programs = num_seqs * num_v_heads * v_blocks
    sms = num_sms()
    if programs >= sms:
        return 0
    chunks = cdiv(tokens, CHUNK * num_seqs)  # per sequence, on average
    segments = min(cdiv(2 * sms, programs), chunks // MIN_SEGMENT_CHUNKS)
    return cdiv(chunks, segments) if segments >= 2 else 0


def use_single_chunk(lengths: Sequence[int] | None, num_seqs: int, num_v_heads: int, tokens: int) -> bool:
    """chunk_delta_rule's automatic choice of the single-chunk kernel: every sequence at most one
    chunk long and at most one program per SM (sequences x value heads <= ``num_sms()``, 132 on an
    H200: beyond that the multi-kernel path, whose programs are per chunk and shorter, fills the
    GPU better). ``lengths`` None (a CUDA graph being captured, no read-back): only when all the
    ``tokens`` together fit one chunk, which bounds every sequence."""
    short = tokens <= CHUNK if lengths is None else max(lengths, default=0) <= CHUNK
    return short and num_seqs * num_v_heads <= num_sms()


def _single_chunk(q, k, v, g, beta, initial_state, cu_seqlens, out, final_state, checkpoints, checkpoint_every,
                  N: int, block_v: int | None, warps: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """chunk_delta_rule through ``_single_chunk_kernel`` (inputs already checked): every sequence
    at most CHUNK tokens long."""
    B, T, Hk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    block_v = block_v or min(SINGLE_BLOCK_V, max(16, next_pow2(V)))
    if not isinstance(block_v, int) or block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"single_block_v must be a power of two >= 16, got {block_v!r}")
    warps = warps or SINGLE_WARPS
    if not isinstance(warps, int) or warps < 1 or warps & (warps - 1):
        raise ValueError(f"single_warps must be a power of two >= 1, got {warps!r}")
    total, device = B * T, q.device
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, total + 1, T, dtype=torch.int32, device=device)
    v_blocks = cdiv(V, block_v)
    # X and G of each program's chunk (its own rows: programs of other value blocks have their own)
    x = torch.empty(v_blocks, total, Hv, CHUNK, dtype=torch.float32, device=device)
    gcum = torch.empty(v_blocks, total, Hv, dtype=torch.float32, device=device)
    _single_chunk_kernel[(N, Hv, v_blocks)](
        q, k, v, g, beta, cu_seqlens, initial_state, out, final_state, checkpoints, x, gcum,
        N, total, checkpoint_every or CHUNK, 0 if checkpoints is None else checkpoints.shape[0], K**-0.5,
        HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=max(16, next_pow2(K)), BLOCK_V=block_v, BLOCK_N=next_pow2(N), SUB=SUB,
        HAS_INIT=initial_state is not None, CHECKPOINTS=checkpoints is not None, DT=TORCH_TO_TL[q.dtype],
        **interpreter_flags(q.dtype), num_warps=warps,
    )
    return out, final_state


def _units(total: int, B: int, T: int, N: int, span: int, varlen: bool) -> int:
    """Programs for the pieces of ``span`` tokens of every sequence: exact for B rows of T tokens;
    for packed sequences the bound sum_i cdiv(len_i, span) <= cdiv(total, span) + N - 1 (the
    programs past the last piece exit), which needs no read-back of cu_seqlens."""
    return cdiv(total, span) + N - 1 if varlen else B * cdiv(T, span)


def _host_lengths(cu_seqlens: torch.Tensor, tokens: int) -> list[int] | None:
    """Sequence lengths from cu_seqlens, after checking it; None while a CUDA graph is captured
    (a read-back would break the capture: the eager warm-up call checked the same buffer)."""
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != tokens or any(b < a for a, b in zip(cu, cu[1:])):
        shown = cu if len(cu) <= 12 else cu[:6] + ["..."] + cu[-3:]
        raise ValueError(
            f"cu_seqlens must rise from 0 to the number of tokens T = {tokens} without decreasing; got {shown}"
        )
    return [b - a for a, b in zip(cu, cu[1:])]


def chunk_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    final_state: torch.Tensor | None = None,
    checkpoints: torch.Tensor | None = None,
    checkpoint_every: int | None = None,
    split: int | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    prepare: str | None = None,
    prepare_warps: int | None = None,
    defer_outputs: bool | None = None,
    output_block_v: int | None = None,
    invert: str | None = None,
    products: str | None = None,
    products_warps: int | None = None,
    output_warps: int | None = None,
    recompute_p: bool | None = None,
    single_chunk: bool | None = None,
    single_block_v: int | None = None,
    single_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over whole sequences: returns (o [B, T, Hv, V] in q's dtype, the final
    state [N, Hv, K, V] float32), the function of :func:`labkit.ops.delta_rule.delta_rule_recurrent_ref`.

    q, k: [B, T, Hk, K] (L2-normalised; q is scaled by 1/sqrt(K) here); v: [B, T, Hv, V], Hv a
    multiple of Hk (value head h reads key head h // (Hv / Hk)); all three of one float dtype.
    g (log-decays, <= 0), beta: [B, T, Hv], any float dtype (used in float32).

    cu_seqlens: int32/int64 [N + 1] cumulative offsets of N sequences packed along T with B = 1
        (fla's and FlashInfer's convention); without it the N = B rows are the sequences.
        Lengths may be 0 (the final state is then the initial one).
    initial_state: float32 [N, Hv, K, V], or None for zeros.
    final_state: float32 [N, Hv, K, V] to write (may be ``initial_state`` itself: an in-place update).
    checkpoints, checkpoint_every: a float32 buffer [num_checkpoints(lengths, every), Hv, K, V] and
        ``every``, a multiple of the chunk size (64): the state after every ``every`` tokens of each
        sequence (see :func:`num_checkpoints` for the layout), counted from this call's first token.
    split: chunks per segment of the sequence split (module docstring); 0 never splits; None
        lets :func:`prefill_split` decide where ``SPLIT_BY_DEFAULT``, else no split.
    block_v, num_warps, num_stages: the walks' value columns per program (a power of two >= 16),
        warps and software-pipelining stages (default 2) (tuning knobs; the defaults compile for
        K = V = 128 without spills on sm_90: python -m labkit.lab.compile_check_prefill).
    prepare: "fused" (one kernel for the intra-chunk quantities), "split" (the triangular solve,
        then W, U0 and P by separate programs) or "merged" (the split's two kernels in one program
        per chunk: the "rows" inverse, then the "full" products); None: ``PREPARE``.
        prepare_warps: their warps.
    defer_outputs: the walk leaves the outputs to a parallel kernel (it stores each chunk's start
        state and deltas instead); None: ``DEFER_OUTPUTS``. output_block_v: that kernel's value
        columns per program (default ``OUTPUT_BLOCK_V``, at most the head's); output_warps: its warps
        (default 4).
    invert, products: with prepare="split", how X's diagonal blocks are inverted ("dots" or "rows")
        and how W and U0 are formed ("blocks" or "full"); None: ``INVERT``, ``PRODUCTS``.
        products_warps: the products kernel's warps (default: prepare_warps).
    recompute_p: with defer_outputs, the output kernel forms P itself (the prepare skips it);
        None: ``RECOMPUTE_P`` where the outputs are deferred.
    single_chunk: the whole call as one kernel, ``_single_chunk_kernel`` (one program per sequence,
        value head and block of ``single_block_v`` value columns, at ``single_warps`` warps), for
        calls whose sequences are all at most one chunk (64 tokens) long, such as a prefix-cache
        hit's tail. None (auto, see :func:`use_single_chunk`): taken when every sequence is at most
        64 tokens, sequences x value heads <= the GPU's SMs (``num_sms``, 132 on an H200; past
        that the multi-kernel path fills the GPU better) and none of the options above (split ...
        recompute_p) was given; True: always (ValueError if a sequence is longer than 64 tokens;
        while a CUDA graph is captured with cu_seqlens, whose lengths cannot be read, if all the
        tokens together are more than 64); False: never. single_block_v: a power of two >= 16, default the whole head up to
        ``SINGLE_BLOCK_V`` (128); single_warps: default ``SINGLE_WARPS`` (4).

    cu_seqlens is read back and checked, except while a CUDA graph is being captured.
    """
    check_tensor("q", q, dtype=FLOAT_DTYPES, shape=(None, None, None, None))
    B, T, Hk, K = q.shape
    dtype = q.dtype
    check_tensor("k", k, dtype=dtype, shape=(B, T, Hk, K))
    check_tensor("v", v, dtype=dtype, shape=(B, T, None, None))
    Hv, V = v.shape[2], v.shape[3]
    if Hk < 1 or Hv % Hk:
        raise ValueError(f"the value heads ({Hv}) must be a multiple of the key heads ({Hk})")
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"head dims must be in 1..{MAX_HEAD_DIM}, got K = {K}, V = {V}")
    if B * T == 0:
        raise ValueError(f"q must hold at least one token, got shape {list(q.shape)}")
    check_tensor("g", g, dtype=FLOAT_DTYPES, shape=(B, T, Hv), aligned=False)
    check_tensor("beta", beta, dtype=FLOAT_DTYPES, shape=(B, T, Hv), aligned=False)
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"with cu_seqlens the sequences are packed along T with batch size 1, got B = {B}")
        check_tensor("cu_seqlens", cu_seqlens, dtype=(torch.int32, torch.int64), shape=(None,), aligned=False)
        if cu_seqlens.numel() < 2:
            raise ValueError("cu_seqlens needs at least 2 entries (0 and the number of tokens)")
        N = cu_seqlens.numel() - 1
    else:
        N = B
    state_shape = (N, Hv, K, V)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, dtype=torch.float32, shape=state_shape)
    if final_state is None:
        final_state = torch.empty(state_shape, dtype=torch.float32, device=q.device)
    check_tensor("final_state", final_state, dtype=torch.float32, shape=state_shape)
    if out is None:
        out = torch.empty(B, T, Hv, V, dtype=dtype, device=q.device)
    check_tensor("out", out, dtype=dtype, shape=(B, T, Hv, V))
    if (checkpoints is None) != (checkpoint_every is None):
        raise ValueError("checkpoints and checkpoint_every go together: give both or neither")
    if checkpoints is not None:
        if not isinstance(checkpoint_every, int) or checkpoint_every <= 0 or checkpoint_every % CHUNK:
            raise ValueError(f"checkpoint_every must be a positive multiple of the chunk size {CHUNK}, got {checkpoint_every!r}")
        check_tensor("checkpoints", checkpoints, dtype=torch.float32, shape=(None, Hv, K, V))
    check_devices(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, initial_state=initial_state,
                  final_state=final_state, out=out, checkpoints=checkpoints)
    inputs = [("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("cu_seqlens", cu_seqlens)]
    outputs = [("out", out), ("final_state", final_state), ("checkpoints", checkpoints)]
    pairs = [(a, x, b, y) for a, x in inputs + [("initial_state", initial_state)] for b, y in outputs]
    pairs += [("out", out, "final_state", final_state), ("out", out, "checkpoints", checkpoints),
              ("final_state", final_state, "checkpoints", checkpoints)]
    in_place = initial_state is not None and final_state.data_ptr() == initial_state.data_ptr()
    check_no_overlap([p for p in pairs if not (in_place and {p[0], p[2]} == {"initial_state", "final_state"})])

    lengths = [T] * B if cu_seqlens is None else _host_lengths(cu_seqlens, T)
    if checkpoints is not None and lengths is not None:
        need = num_checkpoints(lengths, checkpoint_every)
        if checkpoints.shape[0] != need:
            raise ValueError(
                f"checkpoints must have shape [{need}, {Hv}, {K}, {V}] (num_checkpoints(lengths, "
                f"{checkpoint_every})), got {list(checkpoints.shape)}"
            )
    if single_chunk not in (None, True, False):
        raise ValueError(f"single_chunk must be True, False or None (auto), got {single_chunk!r}")
    chosen = (split, block_v, num_warps, num_stages, prepare, prepare_warps, defer_outputs, output_block_v,
              invert, products, products_warps, output_warps, recompute_p)
    if single_chunk is True and lengths is not None and max(lengths, default=0) > CHUNK:
        raise ValueError(
            f"single_chunk=True needs every sequence to be at most one chunk ({CHUNK} tokens) long; "
            f"the longest here has {max(lengths)} tokens"
        )
    if single_chunk is True and lengths is None and B * T > CHUNK:
        # cu_seqlens cannot be read while a graph is captured: only a total that fits one chunk
        # bounds every sequence (the kernel would read just the first 64 tokens of a longer one)
        raise ValueError(
            f"single_chunk=True with cu_seqlens under CUDA-graph capture needs at most {CHUNK} tokens in all "
            f"(the lengths cannot be read back to check them), got {B * T}; use single_chunk=None (auto) or "
            "capture dense [B, T] rows"
        )
    if single_chunk or (single_chunk is None and all(x is None for x in chosen)
                        and use_single_chunk(lengths, N, Hv, B * T)):
        return _single_chunk(q, k, v, g, beta, initial_state, cu_seqlens, out, final_state, checkpoints,
                             checkpoint_every, N, single_block_v, single_warps)
    num_stages = 2 if num_stages is None else num_stages
    output_warps = output_warps or 4
    block_v = block_v or prefill_block_v(V)
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v}")
    v_blocks = cdiv(V, block_v)
    total = B * T
    if prepare not in (None, *PREPARE_KINDS):
        raise ValueError(f"prepare must be one of {PREPARE_KINDS} or None, got {prepare!r}")
    if invert not in (None, *INVERT_KINDS):
        raise ValueError(f"invert must be one of {INVERT_KINDS} or None, got {invert!r}")
    if products not in (None, *PRODUCTS_KINDS):
        raise ValueError(f"products must be one of {PRODUCTS_KINDS} or None, got {products!r}")
    for name, warps in (("num_warps", num_warps), ("prepare_warps", prepare_warps),
                        ("products_warps", products_warps), ("output_warps", output_warps)):
        if warps is not None and (not isinstance(warps, int) or warps < 1 or warps & (warps - 1)):
            raise ValueError(f"{name} must be a power of two >= 1, got {warps!r}")
    if split is None:
        split = prefill_split(N, Hv, v_blocks, total) if SPLIT_BY_DEFAULT else 0
    if not isinstance(split, int) or split < 0:
        raise ValueError(f"split must be a number of chunks >= 0 (0: no split), got {split!r}")

    device = q.device
    varlen = cu_seqlens is not None
    if not varlen:
        cu_seqlens = torch.arange(0, total + 1, T, dtype=torch.int32, device=device)
    flags = interpreter_flags(dtype)
    tl_dtype = TORCH_TO_TL[dtype]
    block_k = max(16, next_pow2(K))
    block_n = next_pow2(N)
    if num_warps is None:  # a [128, 16] walk at 4 warps: ~100 registers, no spills (sm_90)
        num_warps = WALK_WARPS if block_k >= 128 else 4
    scale = K**-0.5

    # the intra-chunk quantities, stored like the inputs: [tokens, Hv, ...]
    w = torch.empty(total, Hv, K, dtype=dtype, device=device)
    u = torch.empty(total, Hv, V, dtype=dtype, device=device)
    p = torch.empty(total, Hv, CHUNK, dtype=dtype, device=device)
    gcum = torch.empty(total, Hv, dtype=torch.float32, device=device)
    chunk_slots = _units(total, B, T, N, CHUNK, varlen)
    block_dv = max(16, next_pow2(V))
    prepare = prepare or PREPARE
    defer = DEFER_OUTPUTS if defer_outputs is None else bool(defer_outputs)
    if recompute_p and not defer:
        raise ValueError("recompute_p needs defer_outputs: the walk that writes the outputs reads P")
    recompute_p = defer and (RECOMPUTE_P if recompute_p is None else bool(recompute_p))
    prepare_warps = prepare_warps or (PREPARE_WARPS[prepare] if block_k >= 128 else 4)
    if prepare == "fused":
        _prepare_kernel[(chunk_slots, Hv)](
            q, k, v, g, beta, cu_seqlens, w, u, p, gcum, N, scale,
            HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_DV=block_dv, KC=min(block_k, 64), VC=min(block_dv, 64),
            BLOCK_N=block_n, SUB=SUB, DT=tl_dtype, **flags, num_warps=prepare_warps,
        )
    elif prepare == "merged":
        x = torch.empty(total, Hv, CHUNK, dtype=torch.float32, device=device)
        _solve_products_kernel[(chunk_slots, Hv)](
            q, k, v, g, beta, cu_seqlens, x, gcum, w, u, p, N, scale,
            HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_DV=block_dv, KC=min(block_k, 64), VC=min(block_dv, 64),
            BLOCK_N=block_n, SUB=SUB, DT=tl_dtype, **flags, WITH_P=not recompute_p, num_warps=prepare_warps,
        )
    else:
        x = torch.empty(total, Hv, CHUNK, dtype=torch.float32, device=device)
        _solve_kernel[(chunk_slots, Hv)](
            k, g, beta, cu_seqlens, x, gcum, N, HK=Hk, HV=Hv, DK=K, BLOCK_K=block_k, BLOCK_N=block_n, SUB=SUB,
            DT=tl_dtype, **flags, INVERT_ROWS=(invert or INVERT) == "rows", num_warps=prepare_warps,
        )
        _products_kernel[(chunk_slots, Hv, 2 if recompute_p else 3)](
            q, k, v, beta, cu_seqlens, x, gcum, w, u, p, N, scale,
            HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_DV=block_dv, KC=min(block_k, 64), VC=min(block_dv, 64),
            BLOCK_N=block_n, SUB=SUB, DT=tl_dtype, **flags, FULL_X=(products or PRODUCTS) == "full",
            num_warps=products_warps or prepare_warps,
        )

    common = dict(HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_V=block_v, BLOCK_N=block_n)
    if split:
        seg_tokens = split * CHUNK
        units = _units(total, B, T, N, seg_tokens, varlen)
        trans = torch.empty(units, Hv, K, V + K, dtype=torch.float32, device=device)
        starts = torch.empty(units, Hv, K, V, dtype=torch.float32, device=device)
        _transition_kernel[(units, Hv, v_blocks + cdiv(K, block_v))](
            k, w, u, gcum, cu_seqlens, trans, N, seg_tokens, HK=Hk, C=CHUNK, DT=tl_dtype, **flags, **common,
            num_warps=num_warps, num_stages=num_stages,
        )
        _combine_kernel[(N, Hv, v_blocks)](
            cu_seqlens, initial_state, trans, starts, final_state, N, seg_tokens,
            KB=min(block_k, 64), HAS_INIT=initial_state is not None, EXACT=flags["DOT_F32"], **common,
            num_warps=num_warps,
        )
        start, grid0 = starts, units
    else:
        seg_tokens, start, grid0 = total, initial_state, N
    ckpt_rows = 0 if checkpoints is None else checkpoints.shape[0]
    unew = states = None
    if defer:
        unew = torch.empty(total, Hv, V, dtype=dtype, device=device)
        states = torch.empty(chunk_slots, Hv, K, V, dtype=dtype, device=device)
    _walk_kernel[(grid0, Hv, v_blocks)](
        q, k, w, u, p, gcum, cu_seqlens, start, out, final_state, checkpoints, unew, states, N, seg_tokens,
        checkpoint_every or CHUNK, ckpt_rows, scale, HK=Hk, C=CHUNK, SEGMENTED=bool(split),
        HAS_START=start is not None, CHECKPOINTS=checkpoints is not None, DEFER_OUTPUTS=defer, DT=tl_dtype,
        **flags, **common, num_warps=num_warps, num_stages=num_stages,
    )
    if defer:
        out_block_v = output_block_v or min(OUTPUT_BLOCK_V, max(16, next_pow2(V)))
        if out_block_v < 16 or out_block_v & (out_block_v - 1):
            raise ValueError(f"output_block_v must be a power of two >= 16, got {out_block_v}")
        _output_kernel[(chunk_slots, Hv, cdiv(V, out_block_v))](
            q, k, p, gcum, unew, states, cu_seqlens, out, N, scale, HK=Hk, C=CHUNK, DT=tl_dtype, **flags,
            RECOMPUTE_P=recompute_p,
            **{**common, "BLOCK_V": out_block_v}, num_warps=output_warps,
        )
    return out, final_state
