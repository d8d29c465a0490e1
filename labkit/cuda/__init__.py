"""The CUDA C++ kernels of ``kernels/``, built just in time, and their Python entry points.

    y = labkit.cuda.tma_linear(x, weight, residual=None)   # x [B, K] @ W[N, K]^T (+ residual), B <= 16

Build: every ``kernels/*.cu`` plus the binding ``kernels/torch_binding.cpp`` go through
:func:`torch.utils.cpp_extension.load` (ninja) into one extension per GPU architecture and source
hash (:func:`build_dir`): a new GPU or an edited source builds afresh (~10-60 s), anything else
imports the cached module. The kernel files are plain CUDA C++ with an ``extern "C"`` launcher and
no torch headers, so CI compiles each one with nvcc alone and checks ptxas's report
(:func:`ptxas_report`; tests/test_cuda_kernels.py). The binding takes raw pointers and a stream:
this module checks the tensors (dtype, device, shape, 16-byte alignment) before anything is built.

Kernels (the maths and the pipeline are stated at the top of each source):

- ``tma_gemv.cu``: the decode projection as a weight stream through the tensor memory accelerator
  (TMA): ``y[b, n] = sum_k x[b, k] W[n, k]`` (+ ``r[b, n]``), bf16 in, float32 accumulation, bf16
  out, batch 1-16. The reference is :func:`labkit.ops.linear.linear_ref`. Fused as in
  :mod:`labkit.ops.linear`: the RMSNorm prologue, the residual and the SwiGLU epilogues (not
  ported yet: the short-conv and greedy-argmax epilogues).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import resources, tuning
from ..ops.features import features
from ..ops.launch import cdiv, check_eps, check_no_overlap, check_tensor

KERNELS_DIR = resources.kernels_dir()
BINDING = "torch_binding.cpp"
MAX_BATCH = 16
ARCHS = ("90a", "100a")  # what CI compiles every kernel for


def kernel_sources() -> list[Path]:
    """Every kernel translation unit (``kernels/*.cu``), sorted."""
    return sorted(KERNELS_DIR.glob("*.cu"))


def nvcc_flags(arch: str) -> list[str]:
    """nvcc flags for one target, e.g. ``"90a"``: the arch-specific target Hopper's TMA and
    Blackwell's features are compiled for (``-gencode`` form: see the device notes)."""
    return ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def find_nvcc() -> str | None:
    """The CUDA compiler: CUDA_HOME's, else the one on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def require_nvcc() -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError(
            "labkit.cuda builds kernels/*.cu just in time and needs the CUDA toolkit's nvcc, which is not "
            "installed here (not on PATH, no CUDA_HOME); install the CUDA toolkit or set CUDA_HOME"
        )
    return nvcc


# -- architecture, hash, build ------------------------------------------------------------------------
def arch_of(device: torch.device | str | int | None = None) -> str:
    """The nvcc target of a CUDA device: ``"90a"`` for Hopper, ``"100a"`` for B200. The kernels use
    TMA (:mod:`labkit.ops.features`): an older GPU is a clear error (MissingFeature)."""
    have = features(device)
    if have.kind != "cuda":
        raise RuntimeError("labkit.cuda kernels need a CUDA GPU, and torch sees none here")
    have.require("tma", "labkit.cuda's kernels (tma_linear)",
                 "Use labkit.ops.linear.linear, the Triton GEMV that every rung runs on any GPU.")
    major, minor = have.capability
    return f"{major}{minor}a"


def source_hash() -> str:
    """Hash of every file the extension is built from (and of this module's flags)."""
    h = hashlib.sha256()
    for path in [*kernel_sources(), *sorted(KERNELS_DIR.glob("*.cuh")), KERNELS_DIR / BINDING]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(" ".join(nvcc_flags("ARCH")).encode())
    return h.hexdigest()[:12]


def build_dir(arch: str, digest: str | None = None) -> Path:
    """``$LABKIT_CUDA_CACHE`` (default ``~/.cache/labkit/cuda``) ``/sm_<arch>-<source hash>``."""
    root = Path(os.environ.get("LABKIT_CUDA_CACHE", Path.home() / ".cache" / "labkit" / "cuda"))
    return root / f"sm_{arch}-{digest or source_hash()}"


@functools.lru_cache(maxsize=None)
def _load(arch: str, digest: str, verbose: bool):
    from torch.utils import cpp_extension

    out = build_dir(arch, digest)
    out.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=f"labkit_cuda_sm{arch}_{digest}",
        sources=[str(KERNELS_DIR / BINDING), *map(str, kernel_sources())],
        extra_cflags=["-O2"],
        extra_cuda_cflags=nvcc_flags(arch),
        build_directory=str(out),
        verbose=verbose,
    )


_modules: dict[int, object] = {}


def load(device: torch.device | str | int | None = None, verbose: bool = False):
    """The built extension for ``device``'s architecture (built on first use, then cached on disk
    and in this process: a call after the first costs a dictionary look-up)."""
    if isinstance(device, int):
        index = device
    elif device is None or torch.device(device).index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else -1
    else:
        index = torch.device(device).index
    if index not in _modules:
        arch = arch_of(device)
        require_nvcc()
        _modules[index] = _load(arch, source_hash(), verbose)
    return _modules[index]


# -- the compile check (CI) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxasEntry:
    """ptxas's ``-v`` report for one kernel."""

    kernel: str
    arch: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(text: str) -> list[PtxasEntry]:
    """The per-kernel entries of ``nvcc -Xptxas -v`` output (device functions are not entries)."""
    entries, current, frame = [], None, None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current, frame = (m.group(1), m.group(2)), None
        elif current and (m := _FRAME.search(line)):
            frame = tuple(int(v) for v in m.groups())
        elif current and frame and (m := _REGS.search(line)):
            entries.append(PtxasEntry(current[0], current[1], int(m.group(1)), *frame))
            current, frame = None, None
    return entries


def ptxas_report(source: Path, arch: str, timeout: float = 120) -> list[PtxasEntry]:
    """Compile ``source`` to an object for ``arch`` with ``-Xptxas -v`` (plain nvcc, no torch) and
    return ptxas's report per kernel; a compile error raises with nvcc's message."""
    nvcc = require_nvcc()
    obj = Path(os.environ.get("TMPDIR", "/tmp")) / f"labkit-check-{os.getpid()}-{source.stem}-{arch}.o"
    try:
        done = subprocess.run([nvcc, "-c", str(source), "-o", str(obj), *nvcc_flags(arch), "-Xptxas", "-v"],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        obj.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name} for sm_{arch}:\n{done.stderr[-4000:]}")
    return parse_ptxas(done.stdout + done.stderr)


# -- TMA GEMV -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TmaConfig:
    """Blocking of :func:`tma_linear`: a [block_n, block_k] box of W per pipeline stage, ``stages``
    boxes in flight per block, K split over ``split_k`` blocks (0: enough to give every SM ``fill``
    work items), at most ``max_blocks`` blocks (0: as many as fit on the GPU at once)."""

    block_n: int = 16
    block_k: int = 256
    stages: int = 2
    split_k: int = 0
    max_blocks: int = 0
    fill: int = 1

    def __post_init__(self) -> None:
        if self.block_n not in (16, 32, 64):
            raise ValueError(f"TmaConfig.block_n must be 16, 32 or 64, got {self.block_n}")
        if self.block_k not in (64, 128, 256):
            raise ValueError(f"TmaConfig.block_k must be 64, 128 or 256, got {self.block_k}")
        if self.block_k * self.block_n // 64 < 32:
            raise ValueError("TmaConfig: block_k * block_n / 64 must be >= 32 (each of the 4 consumer warps "
                             f"takes >= 32 columns of a box), got block_n={self.block_n}, block_k={self.block_k}")
        if not 1 <= self.stages <= 32:
            raise ValueError(f"TmaConfig.stages must be 1..32, got {self.stages}")
        if self.split_k < 0 or self.max_blocks < 0:
            raise ValueError("TmaConfig.split_k and max_blocks must be >= 0 (0: automatic)")
        if self.fill < 1:
            raise ValueError(f"TmaConfig.fill must be >= 1, got {self.fill}")

    def splits(self, n: int, k: int, sms: int) -> int:
        """The K split for an [n, k] weight: ``split_k``, or the smallest whose work items
        (row tiles x splits) cover ``fill * sms``; always one whose splits all get K tiles."""
        k_tiles = cdiv(k, self.block_k)
        split = self.split_k or 1
        if not self.split_k:
            while cdiv(n, self.block_n) * split < self.fill * sms and split < k_tiles:
                split += 1
        split = min(split, k_tiles)
        while split > 1 and (split - 1) * cdiv(k_tiles, split) >= k_tiles:
            split -= 1  # e.g. 4 tiles in 3 splits of 2: the third would be empty
        return split


# The config with the best geometric mean over every projection shape of both presets at batch 1
# and at batch 16 in the H200 sweep (data/bench/nvidia-h200/tma-sweep.json): 0.97 and 0.99 of each
# shape's fastest. Deeper pipelines measured slower: two 8 KB stages per block leave shared memory
# for more resident blocks, and those keep as many bytes in flight.
# It is the heuristic: the configs tuned per shape are data, the ``tma`` section of the GPU's tuning
# file (data/tuning/<gpu-slug>.json), which labkit.tuning.tma_config reads.
DEFAULT_TMA_CONFIG = TmaConfig(block_n=16, block_k=256, stages=2)


def config_from_repr(text: str) -> TmaConfig:
    """``TmaConfig(block_n=16, ...)`` as the benchmark rows record it, back into a TmaConfig."""
    fields = dict(re.findall(r"(\w+)=(-?\d+)", text))
    if not text.startswith("TmaConfig(") or not fields:
        raise ValueError(f"not a TmaConfig repr: {text!r}")
    return TmaConfig(**{k: int(v) for k, v in fields.items()})


@functools.lru_cache(maxsize=None)
def _sms(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, partials: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K scratch, one per (device, size), kept for the process: a CUDA graph that captured a
    launch keeps pointing at it. The counters are zero between launches (the kernel resets them)."""
    key = (device, partials, counters)
    if key not in _workspaces:
        _workspaces[key] = (torch.empty(partials, dtype=torch.float32, device=device),
                            torch.zeros(counters, dtype=torch.int32, device=device))
    return _workspaces[key]


def check_tma_args(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                   out: torch.Tensor | None, swiglu: bool = False, norm_weight: torch.Tensor | None = None) -> int:
    """Everything :func:`tma_linear` needs of its tensors, checked before any build or launch;
    returns N, the outputs per row."""
    check_tensor("weight", weight, dtype=torch.bfloat16, contiguous=False, aligned=False)
    check_tensor("x", x, dtype=torch.bfloat16, contiguous=False, aligned=False)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {list(weight.shape)}")
    rows, k = weight.shape
    if swiglu and (rows % 2 or residual is not None):
        raise ValueError(f"swiglu takes a weight that stacks gate over up (an even row count, got {rows}) "
                         "and no residual")
    n = rows // 2 if swiglu else rows
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must have shape [B, {k}] for a weight of shape {list(weight.shape)}, got {list(x.shape)}")
    batch = x.shape[0]
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"tma_linear takes a batch of 1..{MAX_BATCH} rows (decode), got {batch}")
    if rows < 1 or k < 1:
        raise ValueError(f"weight must have at least one row and column, got {list(weight.shape)}")
    if k % 8:
        raise ValueError(f"K must be a multiple of 8 for TMA (its row stride must be a multiple of 16 bytes), got K={k}")
    for name, t in (("weight", weight), ("x", x)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must have unit column stride, got strides {t.stride()}")
        if t.shape[0] > 1 and (t.stride(0) % 8 or t.stride(0) < k):
            raise ValueError(f"{name}'s row stride must be a multiple of 16 bytes (8 bf16 elements) and >= K for "
                             f"TMA, got {t.stride(0)} elements")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address for TMA (it is a view at an odd "
                             f"offset: {t.data_ptr() % 16} bytes past 16)")
    for name, t in (("residual", residual), ("out", out)):
        if t is not None:
            check_tensor(name, t, dtype=torch.bfloat16, shape=(batch, n))
    if norm_weight is not None:
        check_tensor("norm_weight", norm_weight, dtype=torch.bfloat16, shape=(k,))
    device = weight.device
    for name, t in (("x", x), ("residual", residual), ("out", out), ("norm_weight", norm_weight)):
        if t is not None and t.device != device:
            raise ValueError(f"all tensors must be on one device; weight on {device}, {name} on {t.device}")
    if device.type != "cuda":
        raise ValueError(f"tma_linear runs on a CUDA GPU; the tensors are on {device}")
    check_no_overlap([("x", x, "out", out), ("weight", weight, "out", out)])
    if residual is not None and out is not None and out.data_ptr() != residual.data_ptr():
        check_no_overlap([("residual", residual, "out", out)])
    return n


def fits(config: TmaConfig, batch: int, device: torch.device | str | int | None = None, swiglu: bool = False) -> bool:
    """Whether a block of ``config`` fits in one SM's shared memory on ``device`` (builds the extension)."""
    need = load(device).tma_gemv_smem_bytes(config.block_n, config.block_k, config.stages, batch, int(swiglu))
    return need <= torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def tma_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    swiglu: bool = False,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    config: TmaConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``x @ weight^T`` (``+ residual``) for x [B, K] (B = 1..16), weight [N, K], bf16, through the
    TMA weight stream of ``kernels/tma_gemv.cu``; with ``swiglu``, ``silu(x W_g^T) * (x W_u^T)``
    for ``weight = [W_g; W_u]`` [2N, K]; with ``norm_weight`` [K], x is RMS-normalised first
    (``norm_unit_offset``: weight ``1 + w``). Same function as :func:`labkit.ops.linear.linear_ref`
    with those arguments (the residual is added before the one rounding to bf16).
    ``out`` [B, N] may be ``residual`` itself (in place); ``pdl``: launch with programmatic
    dependent launch (the weight stream starts before the previous kernel ends; the kernel reads x
    and the residual only after it)."""
    n = check_tma_args(x, weight, residual, out, swiglu, norm_weight)
    if norm_weight is not None:
        norm_eps = check_eps("norm_eps", norm_eps)
    k, batch = weight.shape[1], x.shape[0]
    cfg = config or tuning.tma_config(batch, weight.shape[0], k, weight.device)  # tuned per streamed [rows, K]
    if not isinstance(cfg, TmaConfig):
        raise TypeError(f"config must be a TmaConfig, got {type(cfg).__name__}")
    ext = load(weight.device)
    if out is None:
        out = torch.empty(batch, n, dtype=weight.dtype, device=weight.device)
    split = cfg.splits(n, k, _sms(weight.device.index))
    partials = counters = None
    if split > 1:
        partials, counters = _workspace(weight.device, split * batch * n * (2 if swiglu else 1), cdiv(n, cfg.block_n))
    stream = torch.cuda.current_stream(weight.device).cuda_stream
    ext.tma_gemv(  # a single row's stride is never used: K stands in for whatever it is
        x.data_ptr(), x.stride(0) if batch > 1 else k,
        weight.data_ptr(), weight.stride(0) if weight.shape[0] > 1 else k,
        residual.data_ptr() if residual is not None else 0, out.data_ptr(),
        partials.data_ptr() if partials is not None else 0, counters.data_ptr() if counters is not None else 0,
        batch, n, k, bool(swiglu), norm_weight.data_ptr() if norm_weight is not None else 0, float(norm_eps),
        1.0 if norm_unit_offset else 0.0, cfg.block_n, cfg.block_k, cfg.stages, split, cfg.max_blocks, bool(pdl), stream,
    )
    return out
