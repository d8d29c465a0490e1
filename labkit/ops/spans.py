"""Tables of byte spans to copy, built from addresses on the host and run in one launch (the kernel:
:mod:`labkit.ops.copy_spans`), without importing Triton until a table runs on a GPU: importing labkit
must not import it (a notebook picks Triton's interpreter after importing labkit, on a CPU)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch


def _word_and_align(addresses: np.ndarray, nbytes: np.ndarray) -> tuple[int, int]:
    """(word, align): the largest power of two <= 8 (word) and <= 16 (align) dividing every address
    and every length in bytes."""
    common = int(np.gcd.reduce(np.concatenate([addresses, nbytes]))) if nbytes.size else 16
    align = 1
    while align < 16 and common % (2 * align) == 0:
        align *= 2
    return min(align, 8), align


@dataclass(eq=False)
class Spans:
    """Copies of ``nbytes[i]`` bytes from address ``src[i]`` to ``dst[i]`` on ``device`` (numpy int64
    arrays on the host), run together by :meth:`run`. Concatenate with :meth:`join`; the device
    table is made once, on the first run, and reused by later runs."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    device: torch.device
    _table: torch.Tensor | None = None
    _shape: tuple[int, int, int] | None = None  # (word, align, longest), computed once

    @classmethod
    def empty(cls, device: torch.device) -> "Spans":
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, torch.device(device))

    @classmethod
    def of(cls, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> "Spans":
        """The copies ``dst.copy_(src)`` of contiguous tensors of one shape and dtype (for tests)."""
        if not pairs:
            raise ValueError("Spans.of needs at least one (source, destination) pair")
        for src, dst in pairs:
            if src.shape != dst.shape or src.dtype != dst.dtype or not (src.is_contiguous() and dst.is_contiguous()):
                raise ValueError("Spans.of copies contiguous tensors of one shape and dtype")
        as_array = lambda xs: np.array(xs, dtype=np.int64)  # noqa: E731
        return cls(as_array([s.data_ptr() for s, _ in pairs]), as_array([d.data_ptr() for _, d in pairs]),
                   as_array([s.numel() * s.element_size() for s, _ in pairs]), pairs[0][0].device)

    @staticmethod
    def join(parts: list["Spans"], device: torch.device) -> "Spans":
        if not parts:
            return Spans.empty(device)
        return Spans(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("src", "dst", "nbytes")),
                     torch.device(device))

    def __len__(self) -> int:
        return int(self.nbytes.size)

    @property
    def total_bytes(self) -> int:
        return int(self.nbytes.sum())

    def word_and_align(self) -> tuple[int, int]:
        return self._shape_once()[:2]

    def _shape_once(self) -> tuple[int, int, int]:
        """(word, align, the longest span in words), computed on first use: a hit asks on every call."""
        if self._shape is None:
            word, align = _word_and_align(np.concatenate([self.src, self.dst]), self.nbytes)
            self._shape = (word, align, int(self.nbytes.max()) // word if len(self) else 0)
        return self._shape

    def table(self) -> tuple[torch.Tensor, int, int, int]:
        """(device table [n, 3] int64 of source, destination and words; word bytes; align; the
        longest span in words), made on the first call: uploaded from pinned memory without a sync
        (the device may still be running what these spans read)."""
        word, align, longest = self._shape_once()
        if self._table is None:
            host = torch.from_numpy(np.stack([self.src, self.dst, self.nbytes // word], axis=1).astype(np.int64))
            if self.device.type == "cuda":
                host = host.pin_memory()  # torch keeps the pinned block until the copy has run
            self._table = host.to(self.device, non_blocking=True)
        return self._table, word, align, longest

    def run(self) -> None:
        """Every copy: one kernel launch on a GPU, one memmove per span on a CPU."""
        if not len(self):
            return
        if self.device.type == "cpu":  # host memory: the copies as they are (the kernel's tests run it there)
            for s, d, n in zip(self.src.tolist(), self.dst.tolist(), self.nbytes.tolist()):
                ctypes.memmove(d, s, n)
            return
        run_table(*self.table())


def run_table(table: torch.Tensor, word: int, align: int, longest: int) -> None:
    """The copies of a table as :meth:`Spans.table` makes it (or a copy of one): one launch of the
    kernel on a GPU, one memmove per row for a table of host memory."""
    if table.device.type == "cpu":
        for s, d, n in table.tolist():
            ctypes.memmove(d, s, n * word)
        return
    from .copy_spans import launch_copy_spans  # imports Triton: only where a table runs on a GPU

    launch_copy_spans(table, word, align, longest)




def copy_spans_ref(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The reference: ``dst.copy_(src)`` for every pair, one at a time."""
    for src, dst in pairs:
        dst.copy_(src)
