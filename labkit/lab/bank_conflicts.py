"""Shared-memory bank conflicts, predicted from the bank arithmetic and read from the counters.

    python -m labkit bench bank-conflicts --name bank-conflicts     # time, counters, prediction
    python -m labkit.lab.bank_conflicts --check                     # the three transposes against x.t()
    python -m labkit.lab.bank_conflicts --run                       # each once, for ncu to profile

Shared memory on Hopper and on Blackwell alike is 32 banks, each 4 bytes wide: the 4-byte word at
byte address ``a`` sits in bank ``(a / 4) mod 32``. A bank serves one word per cycle, so a warp's
access needs as many passes ("wavefronts") as the most distinct words any one bank holds among its
32 addresses (threads reading the same word share it: a broadcast). Every wavefront past the first
is a bank conflict, which is what Nsight Compute's ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared``
counters count (wavefronts beyond the fewest the access needs).

The demo transposes a float32 matrix through a 32 x 32 tile per block of 32 x 8 threads: each warp
stores rows of the tile as it reads rows of the input (coalesced), and after a barrier reads columns
of the tile to write rows of the output (coalesced too). Three layouts of the same tile:

- ``naive``, ``float tile[32][32]``: word ``32 r + c``; a column's 32 words are all in bank ``c``,
  so every column read is a 32-way conflict (32 wavefronts, 31 conflicts);
- ``padded``, ``float tile[32][33]``: word ``33 r + c``, bank ``(r + c) mod 32``: a column spans all
  32 banks, at the cost of 32 unused words;
- ``swizzled``, ``float tile[32][32]`` at word ``32 r + (c xor r)``: bank ``c xor r``, a permutation
  of the banks along a row and along a column, with no wasted word.

:func:`predict` counts the wavefronts of every warp access of a whole transpose from that
arithmetic alone (:func:`wavefronts`); ``bench bank-conflicts`` sets them beside the counters. The
CUDA source is :data:`KERNEL_SOURCE` (plain CUDA, no torch headers, so CI compiles it with nvcc for
sm_90a and sm_100a without a GPU); :func:`extension` builds it once per process with
``torch.utils.cpp_extension.load_inline`` (tens of seconds the first time on a machine).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

import torch

BANKS = 32  # banks of shared memory (Hopper, Blackwell)
BANK_BYTES = 4  # bytes per bank per cycle
TILE = 32  # the tile is TILE x TILE floats
BLOCK_ROWS = 8  # a block is TILE x BLOCK_ROWS threads: one warp per thread row, 4 tile rows each
LAYOUTS = ("naive", "padded", "swizzled")
KERNEL_PREFIX = "labkit_transpose_"  # the kernels' names: labkit_transpose_<layout>

KERNEL_SOURCE = r"""
// out[c][r] = in[r][c] for a float32 in[rows][cols], through a TILE x TILE shared tile per block of
// TILE x BLOCK_ROWS threads; LAYOUT places tile element (r, c): 0 naive [32][32], 1 padded [32][33],
// 2 swizzled [32][32] at column c ^ r.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {
constexpr int TILE = 32;
constexpr int BLOCK_ROWS = 8;

template <int LAYOUT> struct Tile;
template <> struct Tile<0> { static constexpr int words = TILE * TILE;
  __device__ static int at(int r, int c) { return r * TILE + c; } };
template <> struct Tile<1> { static constexpr int words = TILE * (TILE + 1);
  __device__ static int at(int r, int c) { return r * (TILE + 1) + c; } };
template <> struct Tile<2> { static constexpr int words = TILE * TILE;
  __device__ static int at(int r, int c) { return r * TILE + (c ^ r); } };

template <int LAYOUT>
__device__ __forceinline__ void transpose_tile(const float* __restrict__ in, float* __restrict__ out,
                                               int rows, int cols) {
  __shared__ float tile[Tile<LAYOUT>::words];
  const int col0 = blockIdx.x * TILE, row0 = blockIdx.y * TILE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  // rows of the input block into rows of the tile: lane tx takes column col0 + tx
#pragma unroll
  for (int k = 0; k < TILE / BLOCK_ROWS; ++k) {
    const int j = ty + k * BLOCK_ROWS;
    const int r = row0 + j, c = col0 + tx;
    if (r < rows && c < cols) tile[Tile<LAYOUT>::at(j, tx)] = in[(size_t)r * cols + c];
  }
  __syncthreads();
  // columns of the tile into rows of the output: out row col0 + j, lane tx takes out column row0 + tx
#pragma unroll
  for (int k = 0; k < TILE / BLOCK_ROWS; ++k) {
    const int j = ty + k * BLOCK_ROWS;
    const int orow = col0 + j, ocol = row0 + tx;
    if (orow < cols && ocol < rows) out[(size_t)orow * rows + ocol] = tile[Tile<LAYOUT>::at(tx, j)];
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(TILE * BLOCK_ROWS)
labkit_transpose_naive(const float* in, float* out, int rows, int cols) { transpose_tile<0>(in, out, rows, cols); }
extern "C" __global__ void __launch_bounds__(TILE * BLOCK_ROWS)
labkit_transpose_padded(const float* in, float* out, int rows, int cols) { transpose_tile<1>(in, out, rows, cols); }
extern "C" __global__ void __launch_bounds__(TILE * BLOCK_ROWS)
labkit_transpose_swizzled(const float* in, float* out, int rows, int cols) { transpose_tile<2>(in, out, rows, cols); }

// Launch one layout on a stream; nullptr on success, else the CUDA error's text.
extern "C" const char* labkit_transpose_launch(const float* in, float* out, int rows, int cols, int layout,
                                               void* stream) {
  if (rows < 1 || cols < 1 || layout < 0 || layout > 2) return "labkit_transpose_launch: bad arguments";
  const dim3 grid((cols + TILE - 1) / TILE, (rows + TILE - 1) / TILE), block(TILE, BLOCK_ROWS);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (layout == 0) labkit_transpose_naive<<<grid, block, 0, s>>>(in, out, rows, cols);
  else if (layout == 1) labkit_transpose_padded<<<grid, block, 0, s>>>(in, out, rows, cols);
  else labkit_transpose_swizzled<<<grid, block, 0, s>>>(in, out, rows, cols);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}
"""

# The Python binding: pybind11 only (the tensors are checked in Python), so it builds in seconds
# where torch's headers would take tens of them.
BINDING_SOURCE = r"""
#include <pybind11/pybind11.h>
#include <cstdint>
#include <stdexcept>

extern "C" const char* labkit_transpose_launch(const float* in, float* out, int rows, int cols, int layout,
                                               void* stream);

static void transpose(std::uintptr_t in, std::uintptr_t out, int rows, int cols, int layout, std::uintptr_t stream) {
  const char* err = labkit_transpose_launch(reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out),
                                            rows, cols, layout, reinterpret_cast<void*>(stream));
  if (err != nullptr) throw std::runtime_error(err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("transpose", &transpose, "out[cols, rows] = in[rows, cols].T through a shared tile (raw pointers)");
}
"""


# -- the bank arithmetic ----------------------------------------------------------------------------
def tile_word(layout: str, r: int, c: int) -> int:
    """The 4-byte word of tile element (r, c) in ``layout`` (the kernel's ``Tile<LAYOUT>::at``)."""
    if layout == "naive":
        return r * TILE + c
    if layout == "padded":
        return r * (TILE + 1) + c
    if layout == "swizzled":
        return r * TILE + (c ^ r)
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def bank_of(byte_address: int) -> int:
    return (byte_address // BANK_BYTES) % BANKS


def wavefronts(words: Iterable[int | None]) -> int:
    """Wavefronts one warp-wide access of 4-byte words needs (None: an inactive lane): the most
    distinct words any one bank must serve; lanes on the same word share one. 0 with no lane."""
    per_bank: dict[int, set[int]] = defaultdict(set)
    for w in words:
        if w is not None:
            per_bank[bank_of(w * BANK_BYTES)].add(w)
    return max((len(s) for s in per_bank.values()), default=0)


def tile_accesses(layout: str, height: int = TILE, width: int = TILE) -> Iterator[tuple[str, list[int | None]]]:
    """("st" or "ld", the word of each of 32 lanes or None) for every warp access of one block whose
    tile covers ``height`` input rows and ``width`` input columns (fewer than 32 at the matrix's edge).
    An access whose lanes are all out of the matrix is not issued (the warp branches past it)."""
    lanes = range(TILE)
    for warp in range(BLOCK_ROWS):  # threadIdx.y; lanes are threadIdx.x
        for j in range(warp, TILE, BLOCK_ROWS):
            words = [tile_word(layout, j, tx) if j < height and tx < width else None for tx in lanes]
            if any(w is not None for w in words):
                yield "st", words
        for j in range(warp, TILE, BLOCK_ROWS):
            words = [tile_word(layout, tx, j) if j < width and tx < height else None for tx in lanes]
            if any(w is not None for w in words):
                yield "ld", words


@dataclass(frozen=True)
class Prediction:
    """Warp-level shared-memory accesses of one transpose and the wavefronts they need."""

    layout: str
    rows: int
    cols: int
    ld_requests: int
    st_requests: int
    ld_wavefronts: int
    st_wavefronts: int

    @property
    def ld_conflicts(self) -> int:
        return self.ld_wavefronts - self.ld_requests

    @property
    def st_conflicts(self) -> int:
        return self.st_wavefronts - self.st_requests

    def to_dict(self) -> dict:
        return {**asdict(self), "ld_conflicts": self.ld_conflicts, "st_conflicts": self.st_conflicts}


@functools.lru_cache(maxsize=64)
def _tile_counts(layout: str, height: int, width: int) -> tuple[int, int, int, int]:
    counts = {"ld": [0, 0], "st": [0, 0]}
    for phase, words in tile_accesses(layout, height, width):
        counts[phase][0] += 1
        counts[phase][1] += wavefronts(words)
    return counts["ld"][0], counts["st"][0], counts["ld"][1], counts["st"][1]


def predict(layout: str, rows: int, cols: int) -> Prediction:
    """The shared-memory requests and wavefronts of transposing a [rows, cols] matrix in ``layout``,
    from the bank arithmetic: full tiles, then the partial ones of the right and bottom edges."""
    if rows < 1 or cols < 1:
        raise ValueError(f"need rows, cols >= 1, got {rows}, {cols}")
    full_r, edge_r = divmod(rows, TILE)
    full_c, edge_c = divmod(cols, TILE)
    kinds = [(TILE, TILE, full_r * full_c), (TILE, edge_c, full_r * (edge_c > 0)),
             (edge_r, TILE, (edge_r > 0) * full_c), (edge_r, edge_c, (edge_r > 0) * (edge_c > 0))]
    total = [0, 0, 0, 0]
    for height, width, count in kinds:
        if count and height and width:
            for i, v in enumerate(_tile_counts(layout, height, width)):
                total[i] += count * v
    return Prediction(layout, rows, cols, *total)


# -- the kernels ------------------------------------------------------------------------------------
def source_digest() -> str:
    return hashlib.sha256((KERNEL_SOURCE + BINDING_SOURCE).encode()).hexdigest()[:12]


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}" + ("a" if major >= 9 else "")  # the arch-specific target, as labkit.cuda builds


@functools.lru_cache(maxsize=None)
def _build(arch: str, verbose: bool):
    from torch.utils.cpp_extension import load_inline

    from .. import cuda

    digest = source_digest()
    out = cuda.build_dir(arch, f"bank-conflicts-{digest}")
    out.mkdir(parents=True, exist_ok=True)
    options = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        options["no_implicit_headers"] = True  # the sources need no torch header (a much faster build)
    return load_inline(name=f"labkit_bank_conflicts_sm{arch}_{digest}", cpp_sources=[BINDING_SOURCE],
                       cuda_sources=[KERNEL_SOURCE], extra_cflags=["-O2"], extra_cuda_cflags=cuda.nvcc_flags(arch),
                       build_directory=str(out), verbose=verbose, **options)


def extension(device: torch.device | str | None = None, verbose: bool = False):
    """The built extension for ``device``'s architecture (built on first use, cached on disk under
    ``labkit.cuda.build_dir`` and in this process)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the bank-conflict transposes are CUDA kernels: they need a CUDA GPU, and torch sees none")
    from .. import cuda

    cuda.require_nvcc()
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    return _build(_arch(device), verbose)


def transpose(x: torch.Tensor, layout: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x.t()`` of a contiguous float32 CUDA matrix through the shared tile laid out as ``layout``,
    into ``out`` (a new [cols, rows] tensor when None)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cuda" or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous float32 CUDA matrix, got {x.dtype} {tuple(x.shape)} on {x.device}")
    rows, cols = x.shape
    if rows < 1 or cols < 1 or (rows + TILE - 1) // TILE > 65535 or rows * cols >= 2**31:
        raise ValueError(f"x must have 1..{65535 * TILE} rows, at least one column and < 2**31 elements, "
                         f"got {tuple(x.shape)}")
    if out is None:
        out = torch.empty(cols, rows, dtype=x.dtype, device=x.device)
    elif out.shape != (cols, rows) or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{cols}, {rows}] tensor on {x.device}")
    ext = extension(x.device)
    with torch.cuda.device(x.device):
        stream = torch.cuda.current_stream().cuda_stream
        ext.transpose(x.data_ptr(), out.data_ptr(), rows, cols, LAYOUTS.index(layout), stream)
    return out


CHECK_SHAPES = ((4099, 2051), (2051, 4099), (31, 33), (1, 1), (1, 70), (64, 96))


def check(shapes=CHECK_SHAPES, device: str = "cuda") -> list[str]:
    """Every layout on every shape against ``x.t()``, exactly (a transpose moves bits), into an
    output poisoned with NaN first; returns the failures (empty when all match)."""
    failures = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for rows, cols in shapes:
        x = torch.randn(rows, cols, generator=gen).to(device)
        for layout in LAYOUTS:
            out = torch.full((cols, rows), float("nan"), device=device)
            transpose(x, layout, out)
            if not torch.equal(out, x.t()):
                bad = (out != x.t()).sum().item()  # NaN != anything: a position never written counts
                failures.append(f"{layout} {rows}x{cols}: {bad} of {out.numel()} elements differ from x.t()")
    return failures


@dataclass
class Timed:
    layout: str
    rows: int
    cols: int
    ms: float
    gb_per_s: float  # bytes read + written per second
    runs_ms: list


def time_layouts(rows: int = 8192, cols: int = 8192, warmup: int = 3, repeats: int = 20, calls: int = 5,
                 device: str = "cuda") -> list[Timed]:
    """Each layout's transpose timed by :func:`labkit.lab.timing.measure`: ``calls`` launches back to
    back in one CUDA graph, CUDA events around each replay, the median over ``repeats`` after
    ``warmup``; bandwidth counts the matrix read once and written once (both far larger than the L2)."""
    from .timing import measure

    x = torch.randn(rows, cols, device=device)
    out = torch.empty(cols, rows, device=device)
    timed = []
    for layout in LAYOUTS:
        t = measure([functools.partial(transpose, x, layout, out)] * calls, device=device, graph=True,
                    warmup=warmup, repeats=repeats)
        timed.append(Timed(layout, rows, cols, t.ms, 2 * x.numel() * x.element_size() / (t.ms * 1e-3) / 1e9,
                           t.runs_ms))
    return timed


# -- under ncu --------------------------------------------------------------------------------------
def bank_metrics():
    """The counters :func:`profile_layouts` reads (labkit.lab.counters.Metric)."""
    from .counters import DECODE_METRICS, Metric

    # the time and the conflict counters as the decode step's runner names them
    shared = {m.key: m for m in DECODE_METRICS}
    return (
        *(shared[key] for key in ("time", "bank_conflicts_ld", "bank_conflicts_st")),
        Metric("wavefronts_ld", ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",), "shared-load wavefronts"),
        Metric("wavefronts_st", ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",), "shared-store wavefronts"),
        Metric("requests_ld", ("smsp__sass_inst_executed_op_shared_ld.sum", "sass__inst_executed_shared_loads"),
               "warp-level shared-load instructions executed", family="sass_shared"),
        Metric("requests_st", ("smsp__sass_inst_executed_op_shared_st.sum", "sass__inst_executed_shared_stores"),
               "warp-level shared-store instructions executed", family="sass_shared"),
    )


def run_layouts(rows: int, cols: int, warmup: int = 2) -> None:
    """Each layout ``warmup`` times, then once each between cudaProfilerStart and Stop (what ncu
    profiles with ``--profile-from-start off``)."""
    x = torch.randn(rows, cols, device="cuda")
    out = torch.empty(cols, rows, device="cuda")
    for layout in LAYOUTS:
        for _ in range(warmup):
            transpose(x, layout, out)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        for layout in LAYOUTS:
            transpose(x, layout, out)
        torch.cuda.synchronize()
    finally:
        torch.cuda.profiler.stop()


def profile_layouts(rows: int = 4096, cols: int = 4096, *, rejected=(), timeout_s: float = 240):
    """The three launches of :func:`run_layouts` under ncu: (layout -> {metric key: value}, the
    :class:`labkit.lab.counters.Profile`). Each layout's kernel is found by its name."""
    from .counters import profile, short_kernel_name

    argv = [sys.executable, "-m", "labkit.lab.bank_conflicts", "--run", "--rows", str(rows), "--cols", str(cols)]
    prof = profile(argv, bank_metrics(), kernel_regex=f"^{KERNEL_PREFIX}", profile_from_start=False,
                   rejected=rejected, timeout_s=timeout_s)
    found = {}
    for row in prof.rows:
        layout = short_kernel_name(row.kernel).removeprefix(KERNEL_PREFIX)
        if layout in LAYOUTS:
            found[layout] = {m.key: prof.value(row, m.key) for m in bank_metrics()}
    missing = [layout for layout in LAYOUTS if layout not in found]
    if missing:
        from .counters import NcuError

        raise NcuError(f"ncu's rows have no kernel for {missing}: {[r.kernel for r in prof.rows]}")
    return found, prof


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.lab.bank_conflicts", description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="the three transposes against x.t() on irregular sizes")
    what.add_argument("--run", action="store_true", help="each layout once after warm-up, for ncu")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("the transposes are CUDA kernels, and torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    if args.check:
        failures = check()
        print("\n".join(failures) or f"all {len(LAYOUTS)} layouts match x.t() on {len(CHECK_SHAPES)} shapes",
              file=sys.stderr)
        return 1 if failures else 0
    run_layouts(args.rows, args.cols)
    return 0


if __name__ == "__main__":
    sys.exit(main())
