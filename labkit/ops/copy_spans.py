"""Many copies in one launch: spans of bytes, each from anywhere to anywhere on one device.

A prefix-cache snapshot is a few hundred pieces scattered over the cache's buffers (a block of
keys per attention head, every conv window, every recurrent state). Storing a prompt's snapshots
or restoring one means copying all of them; as one ``copy_`` each that is hundreds of launches, and
torch's multi-tensor copy splits a few hundred tensors into several launches of its own (and
needs a list of tensor views made on the host, ~1 us each). Here a copy is a row of a table:

    table[i] = (source address, destination address, length in words)      int64, on the device

and one launch runs every row: program (i, p) copies words ``p * BLOCK .. (p + 1) * BLOCK`` of
span ``i`` (``BLOCK`` words, 16 KiB), programs past a span's end return at once. A word is the
largest power of two up to 8 bytes that divides every address and length of the table, so a
table of 16-byte aligned pieces (the real models' caches) moves 16 bytes per load and store
(the addresses are declared multiples of ``align``: 16 where they all are).

The addresses are raw pointers: whoever builds a table promises that every span lies inside
memory it owns and that no destination overlaps a source or another destination of the same
table (programs run in any order).

Tables are built from tensors' addresses, and run, through :class:`labkit.ops.spans.Spans` (which imports this module, and
so Triton, only when a table runs on a GPU); a table of host memory runs as one ``memmove`` per
span there (the same copies, for the prefix cache's CPU runs). The kernel itself runs on the CPU in
Triton's interpreter, where its tests call :func:`launch_copy_spans` directly.
``labkit.ops.spans.copy_spans_ref`` is the plain-torch reference: one ``copy_`` per (source,
destination) tensor pair.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import check_devices, check_tensor

BLOCK_BYTES = 16384  # bytes per program: enough work to hide a load's latency, small enough to spread a span
_WORD_TYPES = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}


@triton.jit
def _copy_spans_kernel(table_ptr, WORD: tl.constexpr, WORD_BYTES: tl.constexpr, ALIGN: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Grid (spans, pieces): span i's words [p * BLOCK, min((p + 1) * BLOCK, n_i)), src -> dst."""
    row = table_ptr + tl.program_id(0).to(tl.int64) * 3
    n = tl.load(row + 2)
    start = tl.program_id(1) * BLOCK
    if start < n:
        # the alignment the host checked: lets the compiler move 16 bytes per access
        src = tl.multiple_of(tl.load(row), ALIGN).to(tl.pointer_type(WORD))
        dst = tl.multiple_of(tl.load(row + 1), ALIGN).to(tl.pointer_type(WORD))
        n = tl.multiple_of(n, ALIGN // WORD_BYTES)
        offs = start + tl.arange(0, BLOCK)
        live = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=live), mask=live)


def launch_copy_spans(table: torch.Tensor, word: int, align: int, longest: int) -> None:
    """Run the copies of ``table`` (int64 [n, 3]: source address, destination address, length in
    ``word``-byte words), every address and length a multiple of ``align`` bytes, the longest span
    ``longest`` words: one launch. Graph-capturable (nothing is read back)."""
    check_tensor("table", table, dtype=torch.int64, shape=(None, 3))
    check_devices(table=table)
    if word not in _WORD_TYPES:
        raise ValueError(f"word must be 1, 2, 4 or 8 bytes, got {word!r}")
    if align not in (1, 2, 4, 8, 16) or align < word:
        raise ValueError(f"align must be a power of two from word ({word}) to 16 bytes, got {align!r}")
    if table.shape[0] == 0 or longest <= 0:
        return
    block = BLOCK_BYTES // word
    grid = (table.shape[0], triton.cdiv(longest, block))
    if grid[1] > 65535:
        raise ValueError(f"a span of {longest} words is longer than this kernel's grid reaches ({65535 * block})")
    _copy_spans_kernel[grid](table, WORD=_WORD_TYPES[word], WORD_BYTES=word, ALIGN=align, BLOCK=block, num_warps=4)
