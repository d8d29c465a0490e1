"""One decode step in one kernel: resident programs walk a list of tiled instructions.

A fused decode step is 74 (LFM2-350M) to 97 (Qwen3.5-0.8B) kernels, and chained in a CUDA graph
each pays about 2 µs beyond its bytes (``python -m labkit bench chain``): a fixed cost that PDL
and faster kernels cannot remove, since it comes with every kernel boundary. Here the whole step
is one launch of G programs, all resident at once (a few per SM), that walk the same list of
instructions. Instruction i is T_i tiles; with the list's counters ``c``:

    tile t of instruction i runs on program (first_i + t) mod G     first_i = (T_0 + .. + T_{i-1}) mod G
    before its first tile of i, a program waits until c[wait_i] >= T_{wait_i}
    after its tiles of i, it adds how many it ran to c[i]

so the tiles of consecutive instructions are dealt round the programs as one stream, and a
program goes on to its next instruction as soon as its own tiles are done. The tiles are the
fused step's kernels' own programs, called as functions (:func:`labkit.ops.linear.linear_tile`,
:func:`labkit.ops.attention_decode.attention_tile`, :func:`labkit.ops.gated_delta_decode.gdn_tile`):
the maths of each is its module's and is tested there. A tile waits where a PDL launch would, after
it has requested its first weights, so the next instruction's weights stream while other programs
still compute its input; and each program asks L2 for its next tile's weights (Hopper's bulk
prefetch) before it starts the current one. The program that completes the last instruction
reduces the greedy head's per-tile winners, advances ``lengths`` (when asked) and puts every
counter back to zero, so the next launch (or graph replay) starts clean.

Waiting on other programs of the same grid is only safe if they are all resident: the launcher
sizes the grid from the compiled kernel's registers and shared memory and refuses a grid that
would not fit. In Triton's interpreter programs run one after another, so there the grid is one
program, which runs every tile in order (every wait is then already met): the CPU tests check the
instruction list and the tiles' arguments, the GPU tests check the concurrency.

Which instructions a step has, what each reads and writes, and why each wait is enough, is
:mod:`labkit.decode.step_program`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import triton
import triton.language as tl

from .attention_decode import attention_tile
from .features import features
from .gated_delta_decode import gdn_tile
from .greedy_head import argmax_row
from .launch import (
    TORCH_TO_TL, device_function, globaltimer, interpreter_flags, interpreting, load_acquire, next_pow2, num_sms,
    prefetch_l2, wait_until,
)
from .linear import linear_tile

# Opcodes, and the tensors each instruction names (in this order after the fixed fields).
OPCODES = {"embed": 0, "conv_in": 1, "proj_in": 2, "residual": 3, "gate_up": 4, "head_argmax": 5,
           "head_logits": 6, "attention": 7, "gdn": 8}
LINEAR_ARGS = ("x", "w", "norm", "out", "conv_state", "conv_w")
LINEAR_OPS = ("conv_in", "proj_in", "residual", "gate_up", "head_argmax", "head_logits")
ARGS = {
    "embed": ("w", "out"),
    **{op: LINEAR_ARGS for op in LINEAR_OPS},
    "attention": ("proj", "q_norm", "k_norm", "inv_freq", "keys", "values", "out"),
    "gdn": ("proj", "conv_state", "conv_w", "A_log", "dt_bias", "norm", "state", "out"),
}
# fields of a table row: op, tiles, first, wait (an instruction index), wait target, n, k, then the args
FIXED = 7
FIELDS = FIXED + max(len(a) for a in ARGS.values())

OP_EMBED: tl.constexpr = tl.constexpr(0)
OP_CONV_IN: tl.constexpr = tl.constexpr(1)
OP_PROJ_IN: tl.constexpr = tl.constexpr(2)
OP_RESIDUAL: tl.constexpr = tl.constexpr(3)
OP_GATE_UP: tl.constexpr = tl.constexpr(4)
OP_HEAD_ARGMAX: tl.constexpr = tl.constexpr(5)
OP_HEAD_LOGITS: tl.constexpr = tl.constexpr(6)
OP_ATTENTION: tl.constexpr = tl.constexpr(7)
OP_GDN: tl.constexpr = tl.constexpr(8)
N_FIELDS: tl.constexpr = tl.constexpr(FIELDS)
# one 128-byte line per instruction's counter: the programs polling one counter and those adding to
# the next are then served by different L2 lines (and, as the lines hash, usually different slices)
COUNTER_STRIDE = 32
COUNTER_STRIDE_C: tl.constexpr = tl.constexpr(COUNTER_STRIDE)


@dataclass(frozen=True)
class Instruction:
    """One instruction: ``tiles`` tiles of ``op``, after every tile of instruction ``wait`` (-1: none).

    ``args`` are the tensors :data:`ARGS` names for the op (None where the op's tile reads none);
    ``n``, ``k``: a projection's outputs and reduction length."""

    op: str
    tiles: int
    wait: int
    args: tuple[torch.Tensor | None, ...]
    n: int = 0
    k: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPCODES:
            raise ValueError(f"unknown op {self.op!r}; known: {', '.join(OPCODES)}")
        if len(self.args) != len(ARGS[self.op]):
            raise ValueError(f"{self.op} takes {ARGS[self.op]}, got {len(self.args)} tensors")
        if self.tiles < 1:
            raise ValueError(f"an instruction needs at least one tile, got {self.tiles}")


FLOAT32_ARGS = {("attention", "inv_freq"), ("gdn", "state")}  # the rest are the model's dtype


def encode(instructions: Sequence[Instruction], programs: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The instruction table [len, FIELDS] (int64) that the kernel walks, for a grid of ``programs``
    over a model of ``dtype``. The kernel reads each address as a pointer of the type the op
    expects, so every tensor is checked here: device, layout, alignment and dtype."""
    rows, first = [], 0
    for i, ins in enumerate(instructions):
        if not -1 <= ins.wait < i:
            raise ValueError(f"instruction {i} ({ins.op}) waits for {ins.wait}: only an earlier one can be waited for")
        wait, target = (0, 0) if ins.wait < 0 else (ins.wait, instructions[ins.wait].tiles)
        ptrs = [0 if t is None else t.data_ptr() for t in ins.args]
        for name, t in zip(ARGS[ins.op], ins.args):
            if t is None:
                continue
            if t.device != device or not t.is_contiguous() or t.data_ptr() % 16:
                raise ValueError(f"instruction {i} ({ins.op}): {name} must be a contiguous, 16-byte aligned tensor "
                                 f"on {device}")
            want = torch.float32 if (ins.op, name) in FLOAT32_ARGS else dtype
            if t.dtype != want:
                raise TypeError(f"instruction {i} ({ins.op}): {name} must have dtype {want}, got {t.dtype}")
        if ins.op in LINEAR_OPS and (ins.k % 16 or (ins.op in ("conv_in", "gate_up") and ins.n % 16)):
            raise ValueError(f"instruction {i} ({ins.op}): the persistent step needs K (and N of stacked row "
                             f"blocks) to be multiples of 16, got N={ins.n}, K={ins.k}")
        row = [OPCODES[ins.op], ins.tiles, first, wait, target, ins.n, ins.k, *ptrs]
        rows.append(row + [0] * (FIELDS - len(row)))
        first = (first + ins.tiles) % programs
    return torch.tensor(rows, dtype=torch.int64, device=device)


@dataclass
class StepShapes:
    """The kernel's sizes and switches: what every instruction of one model's step shares."""

    batch: int
    hidden: int
    dtype: torch.dtype
    eps: float
    unit_offset: bool
    conv_kernel: int = 1  # LFM2's short conv taps (1: no conv layers)
    head_tiles: int = 0
    block_n: dict[str, int] = field(default_factory=dict)  # per linear op
    block_k: int = 512
    even_k: bool = False
    # per mixer (empty: the model has none): its runtime sizes, and "sizes", its tile's constexprs
    attention: dict[str, Any] = field(default_factory=dict)
    gdn: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepBuffers:
    """What the kernel reads and writes besides the instructions' own tensors."""

    tokens: torch.Tensor  # int64 [B]
    lengths: torch.Tensor  # int32 [B]
    next_tokens: torch.Tensor  # int64 [B]
    best_val: torch.Tensor  # float32 [B, head_tiles]
    best_idx: torch.Tensor  # int32 [B, head_tiles]
    # int32 [instructions * COUNTER_STRIDE]: counter i at i * COUNTER_STRIDE, zero between launches
    counters: torch.Tensor
    attn_ws: Any = None  # AttentionWorkspace
    gdn_ws: Any = None  # GdnWorkspace


@device_function
def _arg(row, j: tl.constexpr, DT: tl.constexpr):
    """The instruction's j-th tensor as a pointer to DT. The host checked its 16-byte alignment; the
    hint must be on the pointer (on the integer it is lost in the cast, and loads stay scalar)."""
    return tl.multiple_of(tl.load(row + 7 + j).to(tl.pointer_type(DT)), 16)


@device_function
def _size16(row, j: tl.constexpr):
    """Field j of the instruction, a multiple of 16 (the host checked). Sizes read from the table
    carry none of the divisibility Triton infers for kernel arguments; without the hint a row of W
    is not known to start 16-byte aligned and its loads stay scalar. (The hint must be made where
    the value is made: on a function's argument it is lost.)"""
    return tl.multiple_of(tl.load(row + j).to(tl.int32), 16)


@device_function
def _embed_tile(b, row, tokens_ptr, H, DT: tl.constexpr, H_PAD: tl.constexpr):
    d = tl.arange(0, H_PAD)
    token = tl.load(tokens_ptr + b)
    emb = _arg(row, 0, DT)
    h = _arg(row, 1, DT)
    tl.store(h + b * H + d, tl.load(emb + token * H + d, mask=d < H), mask=d < H)


@device_function
def _linear_op(t, need, wait_ptr, row, n, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr, head_tiles,
               DT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               ROW_BLOCKS: tl.constexpr, KW: tl.constexpr, NORM: tl.constexpr, UNIT_OFFSET: tl.constexpr,
               RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, SHORT_CONV: tl.constexpr, STORE_OUT: tl.constexpr,
               ARGMAX: tl.constexpr, EVEN_K: tl.constexpr, WHOLE_ROW: tl.constexpr,
               DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """Tile t (a block of BLOCK_N outputs, all batch rows, all of K) of a projection instruction."""
    x = _arg(row, 0, DT)
    w = _arg(row, 1, DT)
    norm = _arg(row, 2, DT)
    out = _arg(row, 3, DT)
    conv_state = _arg(row, 4, DT)
    conv_w = _arg(row, 5, DT)
    linear_tile(
        t, 0, 0, head_tiles, wait_ptr, need,
        x, w, norm, out, out, counters_ptr, counters_ptr, best_val_ptr, best_idx_ptr, conv_state, conv_w,
        B, n, k, k, eps,
        DT, BLOCK_M, BLOCK_N, BLOCK_K, 1, ROW_BLOCKS, KW, NORM, UNIT_OFFSET,
        RESIDUAL, SWIGLU, SHORT_CONV, STORE_OUT, ARGMAX, EVEN_K, DOT_F32, EMULATE_RTNE, False,
        True, 0, WHOLE_ROW, True,
    )


@device_function
def _prefetch_tile(row, op, t, ES: tl.constexpr, BN_CONV: tl.constexpr, BN_IN: tl.constexpr, BN_OUT: tl.constexpr,
                   BN_UP: tl.constexpr, BN_HEAD: tl.constexpr):
    """Ask L2 for the weights of tile t of instruction ``row`` (nothing for an op without weights).
    A projection's W is [R * N, K] row-major (R stacked blocks: 3 for the short conv's B, C, x; 2
    for gate and up; else 1), and tile t reads rows [t * bn, t * bn + bn) of each block: R runs of
    ``rows * K`` contiguous elements. K is a multiple of 16 and W 16-byte aligned (the table
    checked), as the bulk prefetch needs."""
    if (op >= OP_CONV_IN) & (op <= OP_HEAD_LOGITS):
        n = tl.load(row + 5)
        k = tl.load(row + 6)
        w = tl.load(row + 8)  # the op's second tensor, W
        bn = tl.where(op == OP_CONV_IN, BN_CONV, tl.where(op == OP_PROJ_IN, BN_IN, tl.where(
            op == OP_RESIDUAL, BN_OUT, tl.where(op == OP_GATE_UP, BN_UP, BN_HEAD)))).to(tl.int64)
        blocks = tl.where(op == OP_CONV_IN, 3, tl.where(op == OP_GATE_UP, 2, 1))
        rows = tl.minimum(bn, n - t * bn)
        for r in range(blocks):
            prefetch_l2(w + (r * n + t * bn) * k * ES, (rows * k * ES).to(tl.int32))


# Sizes that differ between caches and batches are not specialised on (Triton would compile a new
# variant for a max_len that is, or is not, a multiple of 16): one compile per model and settings.
@triton.jit(do_not_specialize=["n_instr", "B", "max_len", "n_splits", "head_tiles", "advance"])
def _persistent_step_kernel(
    prog_ptr, counters_ptr, n_instr, tokens_ptr, lengths_ptr, next_ptr, best_val_ptr, best_idx_ptr,
    attn_count_ptr, attn_part_ptr, attn_ml_ptr, gdn_qk_ptr, gdn_o_ptr, gdn_part_ptr, stamps_ptr,
    advance, B, H, max_len, eps, attn_scale, q_scale, P_ATTN, P_GDN, GDN_C, n_splits, n_vb, head_tiles,
    DT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, WHOLE_ROW: tl.constexpr,
    BN_CONV: tl.constexpr, BN_IN: tl.constexpr, BN_OUT: tl.constexpr, BN_UP: tl.constexpr, BN_HEAD: tl.constexpr,
    UNIT_OFFSET: tl.constexpr, CONV_KW: tl.constexpr, H_PAD: tl.constexpr, HEAD_BLOCK: tl.constexpr,
    NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, ROT: tl.constexpr, GATE: tl.constexpr,
    G_PAD: tl.constexpr, HD_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
    NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr, KW_PAD: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_V: tl.constexpr, SHARED_QK: tl.constexpr,
    SPLIT_V: tl.constexpr,
    HAS_CONV: tl.constexpr, HAS_ATTN: tl.constexpr, HAS_GDN: tl.constexpr, GREEDY: tl.constexpr,
    PREFETCH: tl.constexpr, ES: tl.constexpr, STAMPS: tl.constexpr, DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr,
):
    """Grid (G,), every program resident; see the module docstring for the schedule. STAMPS: each
    program also writes (start, end) global-timer nanoseconds of its part of every instruction at
    stamps[pid, i] (its first tile's wait included; untouched where it had no tile). ``advance``
    (non-zero): the last program also adds one to every sequence's length.

    PREFETCH (tiles ahead, 0: none): before each tile of a projection, the program asks L2 for the
    weights of its tile PREFETCH turns later in the same instruction (``t + PREFETCH * G``; at its
    first tile, for every turn up to that) and, at its last tile, for its first tile of the next
    instruction (:func:`_prefetch_tile`). A request waits on nothing, so HBM streams the next
    weights while the program waits on a counter or reduces; its own loads then find them in L2.
    ES: the weights' bytes per element."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    for i in range(n_instr):
        row = prog_ptr + i * N_FIELDS
        op = tl.load(row).to(tl.int32)
        tiles = tl.load(row + 1).to(tl.int32)
        first = tl.load(row + 2).to(tl.int32)
        t0 = (pid + G - first) % G  # this program's first tile of the instruction
        if t0 < tiles:
            if STAMPS:
                t_start = globaltimer()
            wait_ptr = counters_ptr + tl.load(row + 3) * COUNTER_STRIDE_C
            target = tl.load(row + 4).to(tl.int32)
            n = tl.load(row + 5).to(tl.int32)
            n16 = _size16(row, 5)  # only where the host checked it: the stacked row blocks' N
            k = _size16(row, 6)
            for t in range(t0, tiles, G):
                if PREFETCH > 0:
                    for j in range(tl.where(t == t0, 1, PREFETCH), PREFETCH + 1):
                        if t + j * G < tiles:
                            _prefetch_tile(row, op, t + j * G, ES, BN_CONV, BN_IN, BN_OUT, BN_UP, BN_HEAD)
                    if (t + G >= tiles) & (i + 1 < n_instr):  # this program's first tile of the next one
                        after = row + N_FIELDS
                        t1 = (pid + G - tl.load(after + 2).to(tl.int32)) % G
                        if t1 < tl.load(after + 1).to(tl.int32):
                            _prefetch_tile(after, tl.load(after).to(tl.int32), t1, ES, BN_CONV, BN_IN, BN_OUT, BN_UP,
                                           BN_HEAD)
                need = target * (t == t0).to(tl.int32)  # only the first tile waits: the rest find it done
                if op == OP_EMBED:
                    wait_until(wait_ptr, need)
                    _embed_tile(t, row, tokens_ptr, H, DT, H_PAD)
                elif op == OP_CONV_IN:
                    if HAS_CONV:
                        _linear_op(t, need, wait_ptr, row, n16, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                                   head_tiles, DT, BLOCK_M, BN_CONV, BLOCK_K, 3, CONV_KW, True, UNIT_OFFSET,
                                   False, False, True, True, False, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_PROJ_IN:
                    _linear_op(t, need, wait_ptr, row, n, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                               head_tiles, DT, BLOCK_M, BN_IN, BLOCK_K, 1, 1, True, UNIT_OFFSET,
                               False, False, False, True, False, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_RESIDUAL:
                    _linear_op(t, need, wait_ptr, row, n, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                               head_tiles, DT, BLOCK_M, BN_OUT, BLOCK_K, 1, 1, False, UNIT_OFFSET,
                               True, False, False, True, False, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_GATE_UP:
                    _linear_op(t, need, wait_ptr, row, n16, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                               head_tiles, DT, BLOCK_M, BN_UP, BLOCK_K, 2, 1, True, UNIT_OFFSET,
                               False, True, False, True, False, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_HEAD_ARGMAX:
                    if GREEDY:
                        _linear_op(t, need, wait_ptr, row, n, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                                   head_tiles, DT, BLOCK_M, BN_HEAD, BLOCK_K, 1, 1, True, UNIT_OFFSET,
                                   False, False, False, False, True, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_HEAD_LOGITS:
                    if not GREEDY:
                        _linear_op(t, need, wait_ptr, row, n, k, B, eps, best_val_ptr, best_idx_ptr, counters_ptr,
                                   head_tiles, DT, BLOCK_M, BN_HEAD, BLOCK_K, 1, 1, True, UNIT_OFFSET,
                                   False, False, False, True, False, EVEN_K, WHOLE_ROW, DOT_F32, EMULATE_RTNE)
                elif op == OP_ATTENTION:
                    if HAS_ATTN:
                        attention_tile(
                            t // n_splits, t % n_splits, n_splits, wait_ptr, need,
                            _arg(row, 0, DT), _arg(row, 1, DT), _arg(row, 2, DT), _arg(row, 3, tl.float32),
                            _arg(row, 4, DT), _arg(row, 5, DT), lengths_ptr, _arg(row, 6, DT),
                            attn_count_ptr, attn_part_ptr, attn_ml_ptr, P_ATTN, max_len, eps, attn_scale,
                            NH, NKV, HD, ROT, GATE, UNIT_OFFSET, G_PAD, HD_PAD, CHUNK, BLOCK_S,
                            DT, DOT_F32, EMULATE_RTNE, False, False, True,
                        )
                elif op == OP_GDN:
                    if HAS_GDN:
                        gdn_tile(
                            t // n_vb, t % n_vb, n_vb, wait_ptr, need,
                            _arg(row, 0, DT), _arg(row, 1, DT), _arg(row, 2, DT), _arg(row, 3, DT),
                            _arg(row, 4, DT), _arg(row, 5, DT), _arg(row, 6, tl.float32), _arg(row, 7, DT),
                            gdn_qk_ptr, gdn_o_ptr, gdn_part_ptr, P_GDN, GDN_C, eps, q_scale,
                            NK, NV, DK, DV, KW, KW_PAD, BLOCK_DK, BLOCK_DV, BLOCK_V, SHARED_QK, SPLIT_V,
                            DT, DOT_F32, EMULATE_RTNE, False, False, True,
                        )
            done = (tiles - t0 + G - 1) // G
            if STAMPS:  # the end is taken before the count: no tile that waits for these can end earlier
                stamp = stamps_ptr + (pid * n_instr + i) * 2
                tl.store(stamp, t_start)
                tl.store(stamp + 1, globaltimer())
            tl.debug_barrier()  # every thread's stores of these tiles come before the count
            count = counters_ptr + i * COUNTER_STRIDE_C
            if i < n_instr - 1:
                tl.atomic_add(count, done, sem="release", scope="gpu")
            else:
                seen = tl.atomic_add(count, done, sem="acq_rel", scope="gpu")
                if seen + done == tiles:
                    # The last tile of the step: every other tile is done and nobody waits any more.
                    load_acquire(count)  # every thread, before it reads the others' winners
                    tl.debug_barrier()
                    if GREEDY:
                        for b in range(B):
                            argmax_row(b, best_val_ptr, best_idx_ptr, next_ptr, head_tiles, HEAD_BLOCK)
                    if advance != 0:
                        for b in range(B):
                            tl.atomic_add(lengths_ptr + b, 1, sem="relaxed", scope="gpu")
                    for j0 in range(0, n_instr, 128):
                        j = j0 + tl.arange(0, 128)
                        tl.store(counters_ptr + j * COUNTER_STRIDE_C, tl.zeros([128], dtype=tl.int32),
                                 mask=j < n_instr)


# placeholders for a model without that mixer (its branch is compiled out: HAS_ATTN / HAS_GDN)
NO_ATTENTION = dict(NH=1, NKV=1, HD=1, ROT=2, GATE=False, G_PAD=16, HD_PAD=16, CHUNK=16, BLOCK_S=16)
NO_GDN = dict(NK=1, NV=1, DK=1, DV=1, KW=2, KW_PAD=2, BLOCK_DK=16, BLOCK_DV=16, BLOCK_V=16, SHARED_QK=False,
              SPLIT_V=False)


def _launch_args(table: torch.Tensor, buffers: StepBuffers, shapes: StepShapes, *, greedy: bool, advance: bool,
                 num_warps: int, max_registers: int = 0, num_stages: int = 2, prefetch_tiles: int = 0,
                 stamps: torch.Tensor | None = None) -> tuple[tuple, dict]:
    if prefetch_tiles:  # before sm_90 ptxas has no cp.async.bulk.prefetch: refused here, not there
        features(table.device).require("bulk_prefetch", f"prefetch_tiles={prefetch_tiles}", "Use prefetch_tiles=0.")
    attn, gdn = shapes.attention, shapes.gdn
    aws, gws, dummy = buffers.attn_ws, buffers.gdn_ws, buffers.counters
    B = shapes.batch
    bn = {op: shapes.block_n.get(op, 16) for op in ("conv_in", "proj_in", "residual", "gate_up", "head")}
    args = (
        table, buffers.counters, table.shape[0], buffers.tokens, buffers.lengths, buffers.next_tokens,
        buffers.best_val, buffers.best_idx,
        aws.counters if aws is not None else dummy, aws.partials if aws is not None else dummy,
        aws.max_sum if aws is not None else dummy,
        gws.qk_counters if gws is not None else dummy, gws.o_counters if gws is not None else dummy,
        gws.o_partials if gws is not None else dummy, dummy if stamps is None else stamps,
        int(advance),
        B, shapes.hidden, attn.get("max_len", 1), shapes.eps, attn.get("scale", 1.0), gdn.get("q_scale", 1.0),
        attn.get("proj_dim", 1), gdn.get("proj_dim", 1), gdn.get("conv_dim", 1), attn.get("n_splits", 1),
        gdn.get("n_vb", 1), shapes.head_tiles,
    )
    kwargs = dict(
        DT=TORCH_TO_TL[shapes.dtype], BLOCK_M=1 if B == 1 else 16, BLOCK_K=shapes.block_k, EVEN_K=shapes.even_k,
        WHOLE_ROW=shapes.hidden <= shapes.block_k,
        BN_CONV=bn["conv_in"], BN_IN=bn["proj_in"], BN_OUT=bn["residual"], BN_UP=bn["gate_up"], BN_HEAD=bn["head"],
        UNIT_OFFSET=shapes.unit_offset, CONV_KW=shapes.conv_kernel, H_PAD=next_pow2(shapes.hidden),
        HEAD_BLOCK=min(4096, next_pow2(max(shapes.head_tiles, 1))),
        **attn.get("sizes", NO_ATTENTION), **gdn.get("sizes", NO_GDN),
        HAS_CONV=shapes.conv_kernel > 1, HAS_ATTN=bool(attn), HAS_GDN=bool(gdn), GREEDY=bool(greedy),
        PREFETCH=prefetch_tiles, ES=torch.finfo(shapes.dtype).bits // 8, STAMPS=stamps is not None,
        **interpreter_flags(shapes.dtype), num_warps=num_warps, num_stages=num_stages,
    )
    if max_registers and not interpreting():
        kwargs["maxnreg"] = max_registers  # ptxas's cap: the heaviest tile (attention) sets the whole kernel's
    return args, kwargs


def launch_persistent_step(table: torch.Tensor, buffers: StepBuffers, shapes: StepShapes, *, programs: int,
                           greedy: bool, advance: bool, num_warps: int = 4, max_registers: int = 0,
                           num_stages: int = 2, prefetch_tiles: int = 0, stamps: torch.Tensor | None = None) -> None:
    """One launch of the step over ``programs`` programs (one in the interpreter, which runs
    programs one after another: a wait on a later program would never end). ``stamps``: an int64
    [programs, instructions, 2] tensor for the per-instruction timeline (CUDA only).
    ``prefetch_tiles``: how many of its tiles ahead each program asks L2 for (0: none)."""
    if prefetch_tiles < 0:
        raise ValueError(f"prefetch_tiles must be >= 0, got {prefetch_tiles}")
    if stamps is not None:
        if interpreting():
            raise RuntimeError("the persistent step's timeline reads the GPU's global timer: it needs a CUDA GPU")
        if stamps.dtype != torch.int64 or tuple(stamps.shape) != (programs, table.shape[0], 2):
            raise ValueError(f"stamps must be int64 [{programs}, {table.shape[0]}, 2], got {stamps.dtype} "
                             f"{list(stamps.shape)}")
    args, kwargs = _launch_args(table, buffers, shapes, greedy=greedy, advance=advance, num_warps=num_warps,
                                max_registers=max_registers, num_stages=num_stages, prefetch_tiles=prefetch_tiles,
                                stamps=stamps)
    _persistent_step_kernel[(1 if interpreting() else programs,)](*args, **kwargs)


def precompile(table: torch.Tensor, buffers: StepBuffers, shapes: StepShapes, *, greedy: bool,
               num_warps: int = 4, max_registers: int = 0, num_stages: int = 2, prefetch_tiles: int = 0) -> Any:
    """Compile (and load onto the GPU) the kernel a launch with these arguments runs, launching
    nothing: so that no compile or module load happens inside a CUDA graph capture, and so that
    its resources can be read (:func:`resident_per_sm`). (Advancing the lengths or not is an
    argument of the same compiled kernel.)"""
    args, kwargs = _launch_args(table, buffers, shapes, greedy=greedy, advance=False, num_warps=num_warps,
                                max_registers=max_registers, num_stages=num_stages, prefetch_tiles=prefetch_tiles)
    kernel = _persistent_step_kernel.warmup(*args, grid=(1,), **kwargs)
    kernel._init_handles()  # Triton 3.6: loads the module, which gives its register count
    return kernel


def resident_per_sm(kernel: Any, device: torch.device) -> int:
    """How many programs of a compiled kernel (:func:`precompile`'s) fit on one SM at once
    (registers, shared memory, threads). A grid that waits on itself must not exceed this times
    the SM count, or the programs left out wait for ever on those that wait for them."""
    num_warps = kernel.metadata.num_warps
    props = torch.cuda.get_device_properties(device)
    threads = 32 * num_warps
    fits = [props.max_threads_per_multi_processor // threads, 32]
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    if kernel.n_regs:
        fits.append(regs_per_sm // (kernel.n_regs * threads))
    shared = kernel.metadata.shared
    if shared:
        fits.append(getattr(props, "shared_memory_per_multiprocessor", 233472) // shared)
    return max(0, min(fits))


def resident_programs(per_sm: int) -> int:
    """The grid: ``per_sm`` programs on every SM of the current GPU."""
    if per_sm < 1:
        raise ValueError(f"programs_per_sm must be at least 1, got {per_sm}")
    return per_sm * num_sms()

