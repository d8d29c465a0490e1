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

Only the last three lines depend on S0, so only they are sequential over the chunks. Four
kernels (fla's chunk path has the same shape):

- ``_solve_kernel``, one program per (chunk, value head), all in parallel: G, and X. L is formed
  whole (one [C, K] x [K, C] product) and parked in a float32 scratch buffer, so that no key tile
  stays live through the solve. X is formed in 16 x 16 blocks: the four diagonal blocks together
  by forward substitution a row at a time (broadcast products and in-warp sums, no tl.dot rounds),
  then X_ij = -X_ii sum_{j<=m<i} L_im X_mj below the diagonal. That is the usual stable triangular
  inverse; power-series shortcuts ((I - L)(I + L^2)(I + L^4)...) cancel catastrophically when
  keys repeat, so none is used. X is stored in the input dtype, in its own buffer
  (``x_in_input_dtype``; float32 over L for float32 inputs).
- ``_products_kernel``, per (chunk, value head, part): W (part 0) or U0 (part 1) from the stored X
  and G, one 64-row product of X whole per column block (stored like the inputs, [tokens, Hv, ...]);
  with ``products_together``, per (chunk, value head): both, from one read of X.
- ``_walk_kernel``, per (sequence, value head, block of BLOCK_V value columns): walks the chunks in
  order carrying S[:, block] in registers, with only the two products the recurrence needs
  (U = U0 - W S and the state update); stores each chunk's start state S0 and deltas U in the
  input dtype (the rounding the output products apply anyway), the checkpoints and the final
  state. Value columns are independent, so the blocks need no coordination. Where sequences x
  heads x blocks are more programs than the GPU holds at once (many packed sequences), the
  blocks widen (:func:`walk_block_v`; below).
- ``_output_kernel``, per (chunk, value head, value block), all in parallel: P from Q and K, and O.

A call whose sequences are all at most one chunk long (a prefix-cache hit's tail: the restored
state is S0 and the new tokens fit one chunk) would run four dependent kernels of a few
microseconds each. ``_single_chunk_kernel`` does the same sums in one launch, one program per
(sequence, value head, block of value columns): the solve (``_solve_chunk``, through the program's
own scratch rows), then U = U0 - W S0, O and S_C as above, in registers. It is chunk_delta_rule's
default where every sequence fits a chunk and sequences x value heads is at most the SM count
(:func:`use_single_chunk`). Measured on the H200 (64-token tail after 4,096 restored tokens, 16
heads, K = V = 128; data/bench/nvidia-h200/hit-timeline.json, and as committed in 158eaee for the
four kernels): 22.4 us of kernel time a layer against 18.3 us for the four kernels, yet the tail's
graph replay 2.27 ms against 2.30 (the four kernels' gaps) and 54 launches fewer for an eager tail.
One program per head held a whole [64, 128] chunk; at 32 value columns per program (four programs
a head, each repeating the solve) a layer takes 16.5 us against 21.4 on an H100 (``SINGLE_BLOCK_V``).

The forms this module no longer keeps, each timed slower on the H200 (B = 1, 16 heads,
K = V = 128, bf16; notebook 02 tells the kernel): the fused prepare (X, W, U0 and P in one program:
it spills on sm_90) with the walk that writes the outputs took 0.330 / 1.266 ms at T = 4,096 /
16,384 against 0.212 / 0.796 for these kernels (data/bench/nvidia-h200/gdn-prefill.json, variant
fused-prepare+walk-outputs); the sequence split (segment maps S -> A S + B and their scan, for
parallelism at batch 1) was never faster beyond noise: 0.394 / 1.440 / 5.730 ms against 0.372 /
1.439 / 5.765 unsplit at T = 4,096 / 16,384 / 65,536 (gdn-prefill.json as committed in ca705f1,
before the faster walk). The dots inverse with block products took the whole call to 0.433 /
1.773 ms against 0.246 / 0.922 for the row inverse with X-whole products; P stored by the prepare
0.239 / 0.913 against 0.234 / 0.888 with P formed by the output kernel; the merged solve +
products and the walk that writes the outputs (0.262 / 1.004) were slower too. Those were timed
by tools/gpu_experiments/gdn-speed.sh (commits 07ca99c, 0585f64) and not committed as a results
file: the bench variants ``merged-prepare``, ``stored-p``, ``split-prepare+deferred+dots+blocks``
and ``split-prepare+walk-outputs`` of commit e70164b time them (labkit/bench/gdn_prefill.py there).
The solve with L in registers (its ten 16 x 16 blocks summed over the keys, rows taken from the
tiles, no L round trip and no barrier), which let X be stored in bf16 as fla stores it, was slower
on an H100 (2026-12-06, data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-registers-loop.json): its
solve 50.8 / 202.5 / 208.9 us at 2 warps (83.0 / 327 / 342 at 4) against 39.1 / 153.9 / 158.4
parked, at T = 4,096 / 16,384 / 8 x 2,048, while bf16 X saved the products 9 / 22 / 23 us. Taking
a row out of a register tile is a reduction across the tile's threads; fla's kkt + solve does it
at 1 warp (27.9 / 109.0 / 109.4 us), where this form spills 784 bytes for sm_90. Commit 61db211
has it (``solve_in_registers``, ``x_in_input_dtype``) and the bench variants ``tuned+registers*``.
Nor is the solve faster split in two kernels, L formed and parked by one, X from the parked L by
another with no key tile live (commit 4cf9cbe, ``split_solve``): the inverse alone still compiles to
255 registers at 2 warps and 215 at 4 (its own pressure, not the key tile's; at 1 warp it spills
840 bytes), and on an H100 (2026-12-06, data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-split-solve.json)
it took 112 us at 2 warps plus 48 for L against 162 for the one kernel at 8 x 2,048 packed, the
call 0.605 ms either way (0.625 at 4 warps; fla 0.561). What fla's 1-warp solve does faster is the
inverse itself, not the occupancy around it.
Nor was Gated DeltaNet's output norm (rms norm x weight x silu(z), the model's next step) worth
forming in the output kernel (commit bf5c594, ``gated_norm``: whole heads per output program, o
never stored): in Qwen3.5-0.8B's 4,096-token prefill on an H100 (2026-12-06,
data/bench/nvidia-h100-80gb-hbm3/prefill-profile.json and its ablation row) it saved 18 kernels and
0.066 ms of wall time (12.519 against 12.585 ms) but cost 0.035 ms of device time (the output
kernel 0.972 ms against 0.713 + 0.304 for the two kernels), and its bf16 operator test failed on
that GPU (relative error 1.2 against the two-step form, z a strided view at an unaligned offset;
float32, and the model at its own layout, passed; the cause was not found before the session's GPU
time ran out).

Precision, as in fla's chunk kernels: the state, gates, cumulative decays, accumulators and the
triangular inverse are float32 (the diagonal blocks' substitution in float32 FMAs; the six
off-diagonal block products in TF32 on tensor cores for 16-bit inputs, as fla's solve takes them,
and in full float32 for float32 inputs: ``inverse_tf32``). Every other product
takes its operands in the input dtype (bf16 tensor-core products on a GPU), so the state and the
deltas are rounded to bf16 where they enter a product, never where they are kept; X, W, U0 and
the chunk start states are stored in the input dtype (X, as fla stores its inverse, then scaled
by the gates in float32 and rounded again where it enters the products). With bf16 inputs the
error is then of the order of the output's own bf16 rounding (the tests bound it by 1e-2).
Float32 inputs get float32 products throughout.

Variable-length batches come packed along T with batch 1 and cumulative offsets ``cu_seqlens``
(as in fla and FlashInfer). Programs find their sequence and chunk by a vector search over
``cu_seqlens`` on the GPU, so nothing is read back to the host and a call can be captured in a
CUDA graph; grids are sized by an upper bound, and programs past the last chunk exit.

The walk of many sequences. 8 packed sequences of 2,048 tokens took about as long as one of
16,384 on the H200, although their 8 x 16 recurrences are 32 chunks long instead of 256: 0.698 /
0.681 ms (64 / 128 output columns) against 0.796 / 0.775, where fla took 0.466 against 0.701; and
the walk that also wrote the outputs (a heavier walk, since deleted) was slower packed, 1.486
against 1.266 (data/bench/nvidia-h200/gdn-prefill.json, 2026-12-01). The parallel kernels cannot
be the difference: they launch 263 chunk slots x 16 heads against 256 x 16 (cdiv(T, 64) + N - 1,
the slots past the last chunk exiting at once), and each program's search over cu_seqlens is one
vector of 8 lanes, no loop. The walk is: one program per (sequence, head, 16 columns) gives 1,024
programs against 128, and at 16 columns two fit an SM (111 KB of shared memory at 3 stages, 76 KB
at 2: three), so they run in three or four waves of 32 chunks instead of one; the grid's order
(sequences, heads, then blocks) puts the 8 blocks of a head in different waves, each of which
fetches that head's W and K tiles again (at 16 KB each per chunk, the bulk of the walk's bytes).
That is read from the code and the compiler's resource counts (python -m
labkit.lab.compile_check_prefill), and the timing agreed: so the blocks widen, doubling from ``block_v``,
while the walk's programs exceed ``walk_programs_per_sm`` x SMs (``WALK_PROGRAMS_PER_SM`` = 2: 64
columns for 8 x 16 heads, 256 programs, two per SM at 4 warps and 2 stages, one wave, each tile
fetched by 2 programs instead of 8), at their own warps and stages (``wide_warps``,
``wide_stages``: at 3 stages the 64-column walk spills). A single sequence (16 x 8 programs) keeps
its narrow walk. ``walk_blocks_first`` orders the narrow walk's grid with a head's blocks together
instead, so that the 8 programs that read a head's tiles run in one wave and one fetch from
memory serves them all. Measured on the H200 (2026-12-03, data/bench/nvidia-h200/gdn-prefill-varlen.json,
at 8 x 2,048 packed): the narrow walk 0.820 ms, its blocks first 0.588, the widened walk (the
default) 0.523, at one stage 0.559, whole heads at 8 warps 0.524; fla 0.466 in the same run, so
labkit is still 12% behind for packed prompts, and level with fla for single sequences (0.172 / 0.638 ms
at 4,096 / 16,384 tokens against fla's 0.172 / 0.632). On an H100 with the products together (the
default since 2026-12-06; data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-registers-loop.json, the
same settings): 0.186 / 0.712 / 0.613 ms at 4,096 / 16,384 / 8 x 2,048 against fla's 0.182 / 0.708 /
0.554, the solve (39 / 154 / 158 us against fla's 28 / 109 / 109) and the products (35 / 140 / 142
against 24 / 108 / 109) behind, the walk and the outputs ahead. With X stored in bf16 (the default
since 2026-12-06, ``X_IN_INPUT_DTYPE``; H100, the GPU's own settings file, fla in the same run:
data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-x-bf16.json) the products took 28.7 / 121.0 / 120.5
us against 33.6 / 136.6 / 137.8 with float32 X, the solve 40.3 / 158.8 / 160.7 against 39.7 /
154.2 / 155.0, and the call 0.181 / 0.673 / 0.602 ms against 0.184 / 0.684 / 0.611: level with
fla at 4,096 tokens (0.181), ahead at 16,384 (0.689), 7% behind packed (0.562), where fla's
solve (108 us) is what we lack. That was the precision, not the form: fla takes the inverse's
block products in TF32. With them in TF32 too (``INVERSE_TF32``, the default since 2026-12-06) the
solve compiles to 108 registers at 4 warps instead of 217 and took 99.0 / 101.8 us at 16,384 /
8 x 2,048 tokens against 159.7 / 161.5 in full float32 (fla 109.3 / 108.4), and the call 0.175 /
0.631 / 0.547 ms at 4,096 / 16,384 / 8 x 2,048 against 0.199 / 0.691 / 0.600 (fla 0.187 / 0.708 /
0.565): ahead of fla at every length and packed (H100, fla in the same run: python -m labkit
bench gdn-prefill --lengths 4096 16384 --packed 8 2048 --reps 10 --profile 3 --variants file
tuned+inverse-ieee, data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-chunk.json). The
error against fla was 4.4e-3 with either inverse, and Qwen3.5-0.8B's 4,096-token prefill stayed
as close to float32 (0.0980 against 0.0988 before; prefill-profile.json's check).
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
# The launch settings, the defaults of chunk_delta_rule's keyword arguments (block_v, num_warps,
# num_stages of the walk; prepare_warps; output_block_v, output_warps; single_block_v, single_warps:
# the heuristic a GPU without a tuning file runs). Measured on the H200 (2026-12-01,
# tools/gpu_experiments/gdn-speed.sh, B = 1, 16 heads, K = V = 128, beside fla 0.6.0 at 0.172 / 0.632
# ms): [128, 16] walk slices at 4 warps with P formed by the output kernel took 0.210 / 0.788 ms at
# T = 4,096 / 16,384, against 0.239 / 0.913 for [128, 32] slices at 8 warps with P stored; 64
# columns were slower. The solve and products were faster at 4 warps than at 8 (two or more
# programs per SM).
WALK_BLOCK_V = 16  # value columns per walk program (a [128, 16] float32 state slice)
WALK_WARPS = 4
WALK_STAGES = 2  # software-pipelining stages of the walk's loop
# The walk of many sequences (the module docstring): its value blocks widen from block_v until
# sequences x heads x blocks is at most WALK_PROGRAMS_PER_SM x SMs (walk_block_v; 0: never). At
# 64 columns, 4 warps and 2 stages it compiles to 242 registers and 98.5 KB of shared memory for
# sm_90 (two programs per SM; at 3 stages it spills), hence its own warps and stages. Timed by
# labkit.bench.gdn_prefill's variants against the narrow walk: 0.523 against 0.820 ms at 8 x 2,048.
WALK_PROGRAMS_PER_SM = 2
WIDE_WARPS = 4
WIDE_STAGES = 2
WALK_BLOCKS_FIRST = False  # the walk's grid order (see _walk_kernel): helps the narrow walk only (0.588 ms)
PREPARE_WARPS = 4
# W and U0 of a chunk by one program that reads X once, instead of one program each: X is read from
# memory once, not twice (64 MB less at 16,384 tokens x 16 heads, where X no longer fits L2 between
# the two parts' programs). Measured on an H100 beside fla 0.6.0 in the same run (2026-12-06,
# python -m labkit bench gdn-prefill --lengths 4096 16384 --packed 8 2048 --profile 3, on the H200
# file's settings: data/bench/nvidia-h100-80gb-hbm3/gdn-prefill-registers.json): the products 34.4 /
# 142.8 / 144.1 us against 34.6 / 152.2 / 152.6 at T = 4,096 / 16,384 / 8 x 2,048 packed, the call
# 0.185 / 0.688 / 0.617 ms against 0.185 / 0.700 / 0.630 (fla 0.183 / 0.693 / 0.559).
PRODUCTS_TOGETHER = True
# X stored by the solve in the inputs' dtype (bf16: what the products round it to anyway, as fla
# stores its inverse), into its own buffer; L stays parked in float32. Half of X's bytes for the
# solve to write and the products to read. Measured: see the module docstring's last paragraph.
X_IN_INPUT_DTYPE = True
# The inverse's six off-diagonal block products ((I + L)^-1 by blocks: X_ij = -X_ii sum L_im X_mj)
# in TF32 on tensor cores for 16-bit inputs, as fla's solve takes them, instead of full-float32
# FMAs. The diagonal blocks' substitution stays float32 either way. Measured: the module docstring.
INVERSE_TF32 = True
OUTPUT_BLOCK_V = 64  # value columns per program of the outputs (each re-forms its chunk's P)
OUTPUT_WARPS = 4
# The single-chunk kernel's value columns per program and warps. 32 columns (4 programs a head, each
# repeating the chunk's solve) against whole heads: 16.5 against 21.4 us a layer for a 64-token tail
# of 16 heads x 128 on an H100, 18.6 at 64 columns, 29.8 at 32 columns and 2 warps, 23.8 for the four
# kernels (data/bench/nvidia-h100-80gb-hbm3/gdn-single-sweep.json, 2026-12-05): the tail is latency,
# and the solve, repeated, is cheaper than a whole head's products in one program.
SINGLE_BLOCK_V = 32
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
def _tf32_truncated(x):
    """float32 x with its mantissa cut to TF32's 10 bits (toward zero): the interpreter's stand-in
    for a TF32 operand, at most as exact as the GPU's rounding of it."""
    return (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)


@device_function
def _mm32(a, b, TF32: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b of float32 operands, for the triangular inverse: in full float32 ("ieee", CUDA-core
    FMAs), or with TF32 on tensor cores (operands with 10 mantissa bits, as fla's solve takes
    them; float32 accumulation). The interpreter multiplies in float32 whatever the precision asked,
    so there (EMULATE) the TF32 operands are cut to 10 bits first."""
    if TF32 and EMULATE:
        return tl.dot(_tf32_truncated(a), _tf32_truncated(b), input_precision="ieee")
    elif TF32:
        return tl.dot(a, b, input_precision="tf32")
    else:
        return tl.dot(a, b, input_precision="ieee")


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
def _invert4_by_rows(l_at, l_stride, n, SUB: tl.constexpr):
    """(I + L_bb)^-1 of the chunk's four diagonal 16 x 16 blocks b, L stored float32 at
    l_at[row * l_stride + column] (strictly lower: zeros on and above the diagonal).

    Forward substitution one row at a time, the four blocks in the same loop (four independent
    chains the compiler can interleave): row i of X = e_i - sum_{m<i} L[i, m] X[m, :], with X's
    rows m >= i still e_m, which L[i, m] = 0 leaves out. Each step is a broadcast product and a
    sum of a 16 x 16 tile, no tl.dot: a dot form (X <- I - L X, 15 rounds) pays an operand
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
def _solve_rows_full(out_at, out_stride, x_at, x_stride, D, BLOCK_D: tl.constexpr, CB: tl.constexpr, rm, Y,
                     DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """out = Y x over the chunk's rows (mask rm), Y = X diag(c) whole [C, C]; CB columns at a time."""
    r = tl.arange(0, Y.shape[0])
    for col0 in tl.static_range(0, BLOCK_D, CB):
        cols = col0 + tl.arange(0, CB)
        cm = cols < D
        _store_tile(out_at, r, rm, out_stride, cols, cm,
                    _mm(Y, _tile(x_at, r, rm, x_stride, cols, cm), DT, DOT_F32, EMULATE_RTNE), DT, EMULATE_RTNE)


# -- the intra-chunk quantities: the triangular solve, then the products ---------------------------
@device_function
def _solve_chunk(k_ptr, g_ptr, beta_ptr, x_ptr, xo_ptr, gcum_ptr, t0, n, hv,
                 HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr,
                 SUB: tl.constexpr, XDT: tl.constexpr, INV_TF32: tl.constexpr, DOT_F32: tl.constexpr,
                 EMULATE_RTNE: tl.constexpr):
    """G (stored) and X = (I + L)^-1 of the chunk of n tokens from t0, value head hv, stored in XDT
    as xo[t0 + row, hv, column] (rows past n are not written; nor are X's zero blocks above the
    diagonal, unless xo is x, where they are L's own zeros: a reader of a separate xo masks them).

    L is formed whole, by one [C, K] x [K, C] product, and parked in x (float32, this program's
    own rows): the solve then reads it back one 16 x 16 block at a time, so that no key tile stays
    live through the solve (register pressure). The diagonal blocks are inverted by row
    substitution, all four at once (:func:`_invert4_by_rows`), then every off-diagonal block from
    registers, and all of X is stored at the end, once every thread has read L (a barrier: the
    same program's threads; ``xo`` may be ``x`` itself, X then stored over L)."""
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
    X00, X11, X22, X33 = _invert4_by_rows(x_at, HV * C, n, SUB)
    L10 = _tile(x_at, r1, m1, HV * C, r0, full)
    L20 = _tile(x_at, r2, m2, HV * C, r0, full)
    L21 = _tile(x_at, r2, m2, HV * C, r1, full)
    L30 = _tile(x_at, r3, m3, HV * C, r0, full)
    L31 = _tile(x_at, r3, m3, HV * C, r1, full)
    L32 = _tile(x_at, r3, m3, HV * C, r2, full)
    TF: tl.constexpr = INV_TF32
    EM: tl.constexpr = EMULATE_RTNE  # the interpreter
    X10 = -_mm32(X11, _mm32(L10, X00, TF, EM), TF, EM)
    X21 = -_mm32(X22, _mm32(L21, X11, TF, EM), TF, EM)
    X32 = -_mm32(X33, _mm32(L32, X22, TF, EM), TF, EM)
    X20 = -_mm32(X22, _mm32(L20, X00, TF, EM) + _mm32(L21, X10, TF, EM), TF, EM)
    X31 = -_mm32(X33, _mm32(L31, X11, TF, EM) + _mm32(L32, X21, TF, EM), TF, EM)
    X30 = -_mm32(X33, _mm32(L30, X00, TF, EM) + _mm32(L31, X10, TF, EM) + _mm32(L32, X20, TF, EM), TF, EM)
    tl.debug_barrier()
    xo_at = _at(xo_ptr, t0, HV, hv, C)
    _store_tile(xo_at, r0, m0, HV * C, r0, full, X00, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r1, m1, HV * C, r0, full, X10, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r1, m1, HV * C, r1, full, X11, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r2, m2, HV * C, r0, full, X20, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r2, m2, HV * C, r1, full, X21, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r2, m2, HV * C, r2, full, X22, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r3, m3, HV * C, r0, full, X30, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r3, m3, HV * C, r1, full, X31, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r3, m3, HV * C, r2, full, X32, XDT, EMULATE_RTNE)
    _store_tile(xo_at, r3, m3, HV * C, r3, full, X33, XDT, EMULATE_RTNE)


@triton.jit
def _solve_kernel(
    k_ptr, g_ptr, beta_ptr, cu_ptr, x_ptr, xo_ptr, gcum_ptr, num_seqs,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, XDT: tl.constexpr, INV_TF32: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (chunk slots, HV): G and X of one chunk of one value head (L parked in x, X stored in
    XDT to xo)."""
    C: tl.constexpr = 4 * SUB
    seq, c, bos, eos = _locate(cu_ptr, tl.program_id(0), num_seqs, C, BLOCK_N)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)  # tokens in this chunk; <= 0 for slots past the last chunk
    if n > 0:
        _solve_chunk(k_ptr, g_ptr, beta_ptr, x_ptr, xo_ptr, gcum_ptr, t0, n, tl.program_id(1),
                     HK, HV, DK, BLOCK_K, SUB, XDT, INV_TF32, DOT_F32, EMULATE_RTNE)


@device_function
def _w_rows(w_ptr, k_ptr, gcum_ptr, t0, hv, hk, X, beta, rm, HK, HV, DK, BLOCK_K: tl.constexpr, KC: tl.constexpr,
            DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """W = X diag(beta exp(G)) K of the chunk from t0 (rows rm), value head hv, stored at w[t0 + row, hv, :]."""
    r = tl.arange(0, X.shape[0])
    cs = beta * tl.exp(tl.load(_at(gcum_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0))
    _solve_rows_full(_at(w_ptr, t0, HV, hv, DK), HV * DK, _at(k_ptr, t0, HK, hk, DK), HK * DK, DK, BLOCK_K, KC, rm,
                     X * cs[None, :], DT, DOT_F32, EMULATE_RTNE)


@device_function
def _u_rows(u_ptr, v_ptr, t0, hv, X, beta, rm, HV, DV, BLOCK_DV: tl.constexpr, VC: tl.constexpr,
            DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """U0 = X diag(beta) V of the chunk from t0 (rows rm), value head hv, stored at u[t0 + row, hv, :]."""
    _solve_rows_full(_at(u_ptr, t0, HV, hv, DV), HV * DV, _at(v_ptr, t0, HV, hv, DV), HV * DV, DV, BLOCK_DV, VC, rm,
                     X * beta[None, :], DT, DOT_F32, EMULATE_RTNE)


@triton.jit
def _products_kernel(
    k_ptr, v_ptr, beta_ptr, cu_ptr, x_ptr, gcum_ptr, w_ptr, u_ptr, num_seqs,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, KC: tl.constexpr, VC: tl.constexpr, BLOCK_N: tl.constexpr,
    SUB: tl.constexpr, TOGETHER: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (chunk slots, HV, 2): from the stored X and G, W = X diag(beta e^G) K (part 0) or
    U0 = X diag(beta) V (part 1), each by its own program, as one [C, C] x [C, cols] product per
    column block (X whole, its zero upper blocks included: one tensor-core tile of 64 rows, as
    fla's recompute of w and u does). With TOGETHER, grid (chunk slots, HV, 1): one program forms
    both from one read of X (as fla's does), the same sums in the same order."""
    C: tl.constexpr = 4 * SUB
    seq, c, bos, eos = _locate(cu_ptr, tl.program_id(0), num_seqs, C, BLOCK_N)
    hv = tl.program_id(1)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        hk = hv // (HV // HK)
        r = tl.arange(0, C)
        rm = r < n
        # X's rows past n are another chunk's and its blocks above the diagonal were never stored
        # (unit lower-triangular X): both masked to 0
        below = (r[None, :] // SUB) <= (r[:, None] // SUB)
        X = tl.load(_at(x_ptr, t0, HV, hv, C) + r[:, None] * (HV * C) + r[None, :], mask=rm[:, None] & below, other=0.0)
        beta = tl.load(_at(beta_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0).to(tl.float32)
        if TOGETHER:
            _w_rows(w_ptr, k_ptr, gcum_ptr, t0, hv, hk, X, beta, rm, HK, HV, DK, BLOCK_K, KC, DT, DOT_F32, EMULATE_RTNE)
            _u_rows(u_ptr, v_ptr, t0, hv, X, beta, rm, HV, DV, BLOCK_DV, VC, DT, DOT_F32, EMULATE_RTNE)
        elif tl.program_id(2) == 0:
            _w_rows(w_ptr, k_ptr, gcum_ptr, t0, hv, hk, X, beta, rm, HK, HV, DK, BLOCK_K, KC, DT, DOT_F32, EMULATE_RTNE)
        else:
            _u_rows(u_ptr, v_ptr, t0, hv, X, beta, rm, HV, DV, BLOCK_DV, VC, DT, DOT_F32, EMULATE_RTNE)


# -- the state walk ---------------------------------------------------------------------------------
@device_function
def _advance(S, t0, end, hv, hk, k_ptr, w_ptr, u_ptr, gcum_ptr, unew_ptr, kk, kmask, cols, vmask,
             HK, HV, DK, DV, C: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """The state columns S [BLOCK_K, BLOCK_V] after the chunk [t0, min(t0 + C, end)); writes the
    chunk's deltas U = U0 - W S (in DT, to ``unew_ptr``, laid out like u).

    The decays go on the small side of each product (rows of U), so that K and W enter the
    products as loaded, in the input dtype: no float32 copy of a [C, K] tile.
    """
    r = tl.arange(0, C)
    n = tl.minimum(end - t0, C)
    rm = r < n
    gcum_at = _at(gcum_ptr, t0, HV, hv, 1)
    G = tl.load(gcum_at + r * HV, mask=rm, other=0.0)
    G_end = tl.load(gcum_at + (n - 1) * HV)
    W = _tile(_at(w_ptr, t0, HV, hv, DK), r, rm, HV * DK, kk, kmask)
    U = _tile(_at(u_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask).to(tl.float32)
    U = U - _mm(W, S, DT, DOT_F32, EMULATE_RTNE)
    _store_tile(_at(unew_ptr, t0, HV, hv, DV), r, rm, HV * DV, cols, vmask, U, DT, EMULATE_RTNE)
    k = _tile(_at(k_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
    return S * tl.exp(G_end) + _mm(tl.trans(k), U * tl.exp(G_end - G)[:, None], DT, DOT_F32, EMULATE_RTNE)


@device_function
def _state_slice(block, DK, DV, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """The state columns of value block ``block`` (of BLOCK_V columns): rows kk, columns cols, their
    masks, and their offsets within one [DK, DV] state."""
    kk = tl.arange(0, BLOCK_K)
    kmask = kk < DK
    cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = cols < DV
    return kk, kmask, cols, vmask, kmask[:, None] & vmask[None, :], kk[:, None] * DV + cols[None, :]


@device_function
def _state_at(ptr, row, hv, HV, DK, DV):
    """&x[row, hv, 0, 0] of a [rows, HV, DK, DV] state tensor."""
    return ptr + (tl.cast(row, tl.int64) * HV + hv) * DK * DV


@triton.jit
def _walk_kernel(
    k_ptr, w_ptr, u_ptr, gcum_ptr, cu_ptr, init_ptr, final_ptr, ckpt_ptr, unew_ptr, states_ptr,
    num_seqs, ckpt_every, ckpt_rows,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr,
    HAS_INIT: tl.constexpr, CHECKPOINTS: tl.constexpr, BLOCKS_FIRST: tl.constexpr,
    DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (sequences, HV, value blocks), or (value blocks x sequences, HV, 1) with BLOCKS_FIRST:
    from the initial state (or zero), every chunk's start state (in DT, states_ptr, one row per
    chunk slot) and deltas (unew_ptr), for ``_output_kernel``; the checkpoints; the final state.

    BLOCKS_FIRST gives the value blocks of one (sequence, head) consecutive program ids, so that
    they are scheduled together and read each chunk's W and K tiles from L2 once fetched: with more
    programs than fit the GPU at once, the default order runs them in different waves, each of
    which fetches those tiles again."""
    if BLOCKS_FIRST:
        blocks = tl.cdiv(DV, BLOCK_V)
        seq = tl.program_id(0) // blocks
        block = tl.program_id(0) % blocks
    else:
        seq = tl.program_id(0)
        block = tl.program_id(2)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    kk, kmask, cols, vmask, smask, s_offs = _state_slice(block, DK, DV, BLOCK_K, BLOCK_V)
    bos = tl.load(cu_ptr + seq).to(tl.int32)
    eos = tl.maximum(tl.load(cu_ptr + seq + 1).to(tl.int32), bos)
    if HAS_INIT:
        S = tl.load(_state_at(init_ptr, seq, hv, HV, DK, DV) + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    if CHECKPOINTS:
        # checkpoints of earlier sequences come first in the buffer
        i, bos_i, eos_i = _lengths(cu_ptr, num_seqs, BLOCK_N)
        base = tl.sum(tl.where(i < seq, (eos_i - bos_i) // ckpt_every, 0), 0)
    # chunk slots of earlier sequences come first (the order _locate counts them in)
    i2, bos2, eos2 = _lengths(cu_ptr, num_seqs, BLOCK_N)
    first_chunk = tl.sum(tl.where(i2 < seq, tl.cdiv(eos2 - bos2, C), 0), 0)
    for t0 in range(bos, eos, C):
        slot = first_chunk + (t0 - bos) // C
        tl.store(_state_at(states_ptr, slot, hv, HV, DK, DV) + s_offs, cast(S, DT, EMULATE_RTNE), mask=smask)
        S = _advance(S, t0, eos, hv, hk, k_ptr, w_ptr, u_ptr, gcum_ptr, unew_ptr, kk, kmask, cols, vmask,
                     HK, HV, DK, DV, C, DT, DOT_F32, EMULATE_RTNE)
        if CHECKPOINTS:
            done = t0 + C - bos  # tokens of the sequence behind this state (a whole chunk: N % C == 0)
            row = base + done // ckpt_every - 1
            keep = (done % ckpt_every == 0) & (t0 + C <= eos) & (row < ckpt_rows)
            tl.store(_state_at(ckpt_ptr, row, hv, HV, DK, DV) + s_offs, S, mask=smask & keep)
    tl.store(_state_at(final_ptr, seq, hv, HV, DK, DV) + s_offs, S, mask=smask)


@triton.jit
def _output_kernel(
    q_ptr, k_ptr, gcum_ptr, unew_ptr, states_ptr, cu_ptr, o_ptr, num_seqs, scale,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr, C: tl.constexpr,
    DT: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (chunk slots, HV, value blocks), all in parallel after the walk:
    O = diag(exp(G)) Q S0 / sqrt(K) + P U of one chunk, from its start state S0 and deltas U, with
    P = M o (Q K^T) / sqrt(K) formed here from the key tile (one [C, K] x [K, C] product per value
    block: cheaper than the 2 x C bytes per token and value head of storing it)."""
    unit = tl.program_id(0)
    hv = tl.program_id(1)
    seq, c, bos, eos = _locate(cu_ptr, unit, num_seqs, C, BLOCK_N)
    t0 = bos + c * C
    n = tl.minimum(eos - t0, C)
    if n > 0:
        hk = hv // (HV // HK)
        kk, kmask, cols, vmask, smask, s_offs = _state_slice(tl.program_id(2), DK, DV, BLOCK_K, BLOCK_V)
        S = tl.load(_state_at(states_ptr, unit, hv, HV, DK, DV) + s_offs, mask=smask, other=0.0)
        r = tl.arange(0, C)
        rm = r < n
        G = tl.load(_at(gcum_ptr, t0, HV, hv, 1) + r * HV, mask=rm, other=0.0)
        q = _tile(_at(q_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask)
        P = _decayed(q, _tile(_at(k_ptr, t0, HK, hk, DK), r, rm, HK * DK, kk, kmask), G, G, 2, DOT_F32) * scale
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
    HAS_INIT: tl.constexpr, CHECKPOINTS: tl.constexpr, DT: tl.constexpr, INV_TF32: tl.constexpr,
    DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (sequences, HV, value blocks), every sequence at most one chunk (n <= C = 64 tokens):
    the prepare, the walk and the outputs of the module docstring in one program, for value
    columns ``cols`` of one head, from the start state S0 (``init_ptr``, or zero):

        G = cumsum(g),  X = (I + L)^-1        (``_solve_chunk``, as ``_solve_kernel``)
        U = X diag(beta) (V - diag(exp(G)) K S0)                      = U0 - W S0
        O = diag(exp(G)) Q S0 / sqrt(K) + P U,  P = M o (Q K^T) / sqrt(K)
        S = exp(G_n) S0 + (diag(exp(G_n - G)) K)^T U                  the final state

    (W S0 = X diag(beta exp(G)) K S0 is formed as X diag(beta) (diag(exp(G)) K S0): one [C, K] x
    [K, BLOCK_V] product instead of W's [C, C] x [C, K].) X and G go through this program's own
    scratch rows (x_ptr, gcum_ptr: [value blocks, tokens, HV, ...], so that programs of other value
    blocks never touch them): the solve parks L there and inverts it in place. The state after the chunk is also checkpoint row ``base`` when the sequence is exactly
    ``ckpt_every`` (= 64) tokens long, ``base`` counting the checkpoints of earlier sequences
    (``_walk_kernel``'s layout). A sequence without tokens gets its start state as final state."""
    C: tl.constexpr = 4 * SUB
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // (HV // HK)
    kk, kmask, cols, vmask, smask, s_offs = _state_slice(tl.program_id(2), DK, DV, BLOCK_K, BLOCK_V)
    bos = tl.load(cu_ptr + seq).to(tl.int32)
    n = tl.minimum(tl.maximum(tl.load(cu_ptr + seq + 1).to(tl.int32), bos) - bos, C)
    scratch = tl.program_id(2).to(tl.int64) * tokens * HV
    x_at = x_ptr + scratch * C
    gcum_at = gcum_ptr + scratch
    if n > 0:
        _solve_chunk(k_ptr, g_ptr, beta_ptr, x_at, x_at, gcum_at, bos, n, hv, HK, HV, DK, BLOCK_K, SUB,
                     tl.float32, INV_TF32, DOT_F32, EMULATE_RTNE)
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


# -- host side --------------------------------------------------------------------------------------
_DENSE_OFFSETS: dict[tuple, torch.Tensor] = {}  # (B, T, device) -> dense_offsets' tensor, never dropped
DENSE_OFFSETS_KEPT = 4096  # shapes kept (B + 1 int32 each); past them, each call makes its own


def dense_offsets(B: int, T: int, device: torch.device) -> torch.Tensor:
    """``cu_seqlens`` of B dense rows of T tokens, [0, T, 2T, ..., BT] int32 on ``device``: made once
    per (B, T, device) and kept (the kernels only read it), so that a prefill's GDN layers do not
    each launch an arange (18 kernels in a Qwen3.5-0.8B prefill or prefix-cache hit). A kept one is
    never dropped: a CUDA graph captured with it reads its memory at every replay. So past
    ``DENSE_OFFSETS_KEPT`` shapes nothing more is kept. One made during a capture is not kept
    either: its values are written when the graph replays, not before."""
    key = (B, T, device)
    offsets = _DENSE_OFFSETS.get(key)
    if offsets is None:
        offsets = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=device)
        capturing = offsets.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing and len(_DENSE_OFFSETS) < DENSE_OFFSETS_KEPT:
            _DENSE_OFFSETS[key] = offsets
    return offsets


def num_checkpoints(lengths: Sequence[int], every: int) -> int:
    """Rows of the checkpoint buffer: sequence i contributes lengths[i] // every states (after
    every, 2 * every, ... of its tokens), after those of sequences 0..i-1."""
    return sum(int(n) // every for n in lengths)


def prefill_block_v(head_v: int) -> int:
    """Value columns per walk program where none is given: ``WALK_BLOCK_V`` (16: a [128, 16] float32
    state slice, 16 registers a thread at 4 warps; batch 1 x 16 heads is 128 programs), the measured
    fastest, at most the head (rounded up to a power of two); whole heads in the interpreter (fewer
    programs)."""
    whole = max(16, next_pow2(head_v))
    return whole if interpreting() else min(WALK_BLOCK_V, whole)


def walk_block_v(num_seqs: int, num_v_heads: int, head_v: int, block_v: int, programs_per_sm: int) -> int:
    """The walk's value columns per program: ``block_v`` (already checked, at most the head's
    width), doubled while the walk's programs, ``num_seqs * num_v_heads * cdiv(head_v, width)``,
    are more than ``programs_per_sm * num_sms()``, up to the whole head (rounded up to a power of
    two); ``programs_per_sm`` 0: ``block_v`` always. Needs only the number of sequences (no
    read-back of cu_seqlens)."""
    whole = max(16, next_pow2(head_v))
    width = block_v
    if programs_per_sm:
        limit = programs_per_sm * num_sms()
        while width < whole and num_seqs * num_v_heads * cdiv(head_v, width) > limit:
            width *= 2
    return width


def _checked_block_v(name: str, block_v: int | None, default: int, head_v: int) -> int:
    """``block_v`` as given (a power of two >= 16), or ``default``, capped at the head's width (a
    tuned value made for wide heads stays valid for narrow ones: no program of masked columns only)."""
    if block_v is None:
        block_v = default
    elif not isinstance(block_v, int) or isinstance(block_v, bool) or block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {block_v!r}")
    return min(block_v, max(16, next_pow2(head_v)))


def _check_warps(**warps: int) -> None:
    for name, w in warps.items():
        if not isinstance(w, int) or isinstance(w, bool) or w < 1 or w & (w - 1):
            raise ValueError(f"{name} must be a power of two >= 1, got {w!r}")


def use_single_chunk(lengths: Sequence[int] | None, num_seqs: int, num_v_heads: int, tokens: int) -> bool:
    """chunk_delta_rule's automatic choice of the single-chunk kernel: every sequence at most one
    chunk long and at most one program per SM (sequences x value heads <= ``num_sms()``, 132 on an
    H200: beyond that the multi-kernel path, whose programs are per chunk and shorter, fills the
    GPU better). ``lengths`` None (a CUDA graph being captured, no read-back): only when all the
    ``tokens`` together fit one chunk, which bounds every sequence."""
    short = tokens <= CHUNK if lengths is None else max(lengths, default=0) <= CHUNK
    return short and num_seqs * num_v_heads <= num_sms()


def _single_chunk(q, k, v, g, beta, initial_state, cu_seqlens, out, final_state, checkpoints, checkpoint_every,
                  N: int, block_v: int, warps: int, inv_tf32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """chunk_delta_rule through ``_single_chunk_kernel`` (inputs and settings already checked):
    every sequence at most CHUNK tokens long."""
    B, T, Hk, K = q.shape
    Hv, V = v.shape[2], v.shape[3]
    total, device = B * T, q.device
    if cu_seqlens is None:
        cu_seqlens = dense_offsets(B, T, device)
    v_blocks = cdiv(V, block_v)
    # X and G of each program's chunk (its own rows: programs of other value blocks have their own)
    x = torch.empty(v_blocks, total, Hv, CHUNK, dtype=torch.float32, device=device)
    gcum = torch.empty(v_blocks, total, Hv, dtype=torch.float32, device=device)
    _single_chunk_kernel[(N, Hv, v_blocks)](
        q, k, v, g, beta, cu_seqlens, initial_state, out, final_state, checkpoints, x, gcum,
        N, total, checkpoint_every or CHUNK, 0 if checkpoints is None else checkpoints.shape[0], K**-0.5,
        HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=max(16, next_pow2(K)), BLOCK_V=block_v, BLOCK_N=next_pow2(N), SUB=SUB,
        HAS_INIT=initial_state is not None, CHECKPOINTS=checkpoints is not None, DT=TORCH_TO_TL[q.dtype],
        INV_TF32=inv_tf32, **interpreter_flags(q.dtype), num_warps=warps,
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
    single_chunk: bool | None = None,
    block_v: int | None = None,
    num_warps: int = WALK_WARPS,
    num_stages: int = WALK_STAGES,
    prepare_warps: int = PREPARE_WARPS,
    products_warps: int | None = None,
    output_block_v: int | None = None,
    output_warps: int = OUTPUT_WARPS,
    single_block_v: int | None = None,
    single_warps: int = SINGLE_WARPS,
    walk_programs_per_sm: int = WALK_PROGRAMS_PER_SM,
    wide_warps: int = WIDE_WARPS,
    wide_stages: int = WIDE_STAGES,
    walk_blocks_first: bool = WALK_BLOCKS_FIRST,
    products_together: bool = PRODUCTS_TOGETHER,
    x_in_input_dtype: bool = X_IN_INPUT_DTYPE,
    inverse_tf32: bool = INVERSE_TF32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over whole sequences: returns (o [B, T, Hv, V] in q's dtype, the final
    state [N, Hv, K, V] float32), the function of :func:`labkit.ops.delta_rule.delta_rule_recurrent_ref`,
    in the chunked WY form of the module docstring.

    q, k: [B, T, Hk, K] (L2-normalised; q is scaled by 1/sqrt(K) here); v: [B, T, Hv, V], Hv a
    multiple of Hk (value head h reads key head h // (Hv / Hk)); all three of one float dtype.
    g (log-decays, <= 0), beta: [B, T, Hv], any float dtype (used in float32).

    cu_seqlens: int32/int64 [N + 1] cumulative offsets of N sequences packed along T with B = 1
        (fla's and FlashInfer's convention); without it the N = B rows are the sequences.
        Lengths may be 0 (the final state is then the initial one).
    initial_state: float32 [N, Hv, K, V], or None for zeros.
    out: [B, T, Hv, V] in q's dtype to write (default: a new tensor).
    final_state: float32 [N, Hv, K, V] to write (may be ``initial_state`` itself: an in-place update).
    checkpoints, checkpoint_every: a float32 buffer [num_checkpoints(lengths, every), Hv, K, V] and
        ``every``, a multiple of the chunk size (64): the state after every ``every`` tokens of each
        sequence (see :func:`num_checkpoints` for the layout), counted from this call's first token.
    single_chunk: the whole call as one kernel, ``_single_chunk_kernel``, for calls whose sequences
        are all at most one chunk (64 tokens) long, such as a prefix-cache hit's tail. None (auto,
        :func:`use_single_chunk`): taken when every sequence is at most 64 tokens and sequences x
        value heads <= the GPU's SMs (``num_sms``, 132 on an H200; past that the four kernels fill
        the GPU better); True: always (ValueError if a sequence is longer than 64 tokens; while a
        CUDA graph is captured with cu_seqlens, whose lengths cannot be read, if all the tokens
        together are more than 64); False: never.

    Launch settings (what a per-GPU tuning file chooses; the defaults are the module's constants,
    measured on the H200; none changes the result beyond rounding order). Block widths are value
    columns per program, a power of two >= 16; None: the constant, capped at the head's width
    (rounded up to a power of two). Warps are powers of two.
        block_v (``WALK_BLOCK_V``; whole heads in the interpreter: :func:`prefill_block_v`),
        num_warps, num_stages (software-pipelining stages): the sequential walk;
        prepare_warps: the triangular solve and the W / U0 products (products_warps, None: the
        same, for the products alone);
        output_block_v (``OUTPUT_BLOCK_V``), output_warps: the parallel outputs;
        single_block_v (``SINGLE_BLOCK_V``), single_warps: the single-chunk kernel;
        walk_programs_per_sm (``WALK_PROGRAMS_PER_SM``; 0: never), wide_warps, wide_stages: the
        walk's blocks widen from block_v while sequences x value heads x blocks exceed
        walk_programs_per_sm x SMs (:func:`walk_block_v`), and a widened walk runs at wide_warps
        and wide_stages instead of num_warps and num_stages;
        walk_blocks_first: the walk's programs ordered with the value blocks of a (sequence, head)
        together (``_walk_kernel``);
        products_together (``PRODUCTS_TOGETHER``): W and U0 of a chunk by one program, which reads
        X once, instead of one program each (``_products_kernel``);
        x_in_input_dtype (``X_IN_INPUT_DTYPE``): the solve stores X in the inputs' dtype (bf16 or
        fp16: half the bytes for the products to read; X is rounded there, as fla rounds its
        inverse) instead of float32 over L; float32 inputs keep float32 X either way.
        inverse_tf32 (``INVERSE_TF32``): the triangular inverse's block products on tensor cores in
        TF32 (as fla's solve) instead of full float32, for bf16 or fp16 inputs (X is then rounded
        to their dtype anyway); float32 inputs keep full float32.
    The defaults compile for K = V = 128 without spills on sm_90 (python -m
    labkit.lab.compile_check_prefill).

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
    products_warps = prepare_warps if products_warps is None else products_warps
    _check_warps(num_warps=num_warps, prepare_warps=prepare_warps, products_warps=products_warps,
                 output_warps=output_warps, single_warps=single_warps, wide_warps=wide_warps)
    for name, stages in (("num_stages", num_stages), ("wide_stages", wide_stages)):
        if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
            raise ValueError(f"{name} must be a number of stages >= 1, got {stages!r}")
    if not isinstance(walk_programs_per_sm, int) or isinstance(walk_programs_per_sm, bool) or walk_programs_per_sm < 0:
        raise ValueError(f"walk_programs_per_sm must be an integer >= 0 (0: never widen), got {walk_programs_per_sm!r}")
    for name, flag in (("walk_blocks_first", walk_blocks_first), ("products_together", products_together),
                       ("x_in_input_dtype", x_in_input_dtype), ("inverse_tf32", inverse_tf32)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    block_v = _checked_block_v("block_v", block_v, prefill_block_v(V), V)
    output_block_v = _checked_block_v("output_block_v", output_block_v, OUTPUT_BLOCK_V, V)
    single_block_v = _checked_block_v("single_block_v", single_block_v, SINGLE_BLOCK_V, V)
    inv_tf32 = inverse_tf32 and dtype != torch.float32
    if single_chunk or (single_chunk is None and use_single_chunk(lengths, N, Hv, B * T)):
        return _single_chunk(q, k, v, g, beta, initial_state, cu_seqlens, out, final_state, checkpoints,
                             checkpoint_every, N, single_block_v, single_warps, inv_tf32)

    device = q.device
    total = B * T
    varlen = cu_seqlens is not None
    if not varlen:
        cu_seqlens = dense_offsets(B, T, device)
    flags = interpreter_flags(dtype)
    tl_dtype = TORCH_TO_TL[dtype]
    block_k = max(16, next_pow2(K))
    block_dv = max(16, next_pow2(V))
    block_n = next_pow2(N)
    chunk_slots = _units(total, B, T, N, CHUNK, varlen)

    # G and X, then W and U0, stored like the inputs: [tokens, Hv, ...]; L parked in x (float32),
    # X stored over it, or with x_in_input_dtype into xo in the inputs' dtype
    gcum = torch.empty(total, Hv, dtype=torch.float32, device=device)
    x = torch.empty(total, Hv, CHUNK, dtype=torch.float32, device=device)
    xo = torch.empty(total, Hv, CHUNK, dtype=dtype, device=device) if x_in_input_dtype and dtype != torch.float32 else x
    _solve_kernel[(chunk_slots, Hv)](
        k, g, beta, cu_seqlens, x, xo, gcum, N, HK=Hk, HV=Hv, DK=K, BLOCK_K=block_k, BLOCK_N=block_n, SUB=SUB,
        XDT=TORCH_TO_TL[xo.dtype], INV_TF32=inv_tf32, **flags, num_warps=prepare_warps,
    )
    w = torch.empty(total, Hv, K, dtype=dtype, device=device)
    u = torch.empty(total, Hv, V, dtype=dtype, device=device)
    _products_kernel[(chunk_slots, Hv, 1 if products_together else 2)](
        k, v, beta, cu_seqlens, xo, gcum, w, u, N,
        HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_DV=block_dv, KC=min(block_k, 64), VC=min(block_dv, 64),
        BLOCK_N=block_n, SUB=SUB, TOGETHER=products_together, DT=tl_dtype, **flags, num_warps=products_warps,
    )
    # the walk: chunk start states and deltas, checkpoints, final states
    unew = torch.empty(total, Hv, V, dtype=dtype, device=device)
    states = torch.empty(chunk_slots, Hv, K, V, dtype=dtype, device=device)
    common = dict(HK=Hk, HV=Hv, DK=K, DV=V, BLOCK_K=block_k, BLOCK_N=block_n, C=CHUNK, DT=tl_dtype, **flags)
    walk_v = walk_block_v(N, Hv, V, block_v, walk_programs_per_sm)
    if walk_v > block_v:
        num_warps, num_stages = wide_warps, wide_stages
    v_blocks = cdiv(V, walk_v)
    _walk_kernel[(v_blocks * N, Hv, 1) if walk_blocks_first else (N, Hv, v_blocks)](
        k, w, u, gcum, cu_seqlens, initial_state, final_state, checkpoints, unew, states, N,
        checkpoint_every or CHUNK, 0 if checkpoints is None else checkpoints.shape[0],
        HAS_INIT=initial_state is not None, CHECKPOINTS=checkpoints is not None, BLOCKS_FIRST=walk_blocks_first,
        BLOCK_V=walk_v, **common, num_warps=num_warps, num_stages=num_stages,
    )
    _output_kernel[(chunk_slots, Hv, cdiv(V, output_block_v))](
        q, k, gcum, unew, states, cu_seqlens, out, N, K**-0.5, BLOCK_V=output_block_v, **common,
        num_warps=output_warps,
    )
    return out, final_state
