"""The article's pitfalls, reproduced on the GPU and caught (notebook 06).

1. **Shared memory past 48 KB.** The article says a kernel that asks for more than 48 KB of shared
   memory quietly falls back to the CPU. Nothing falls back: a CUDA launch with more than 48 KB of
   *dynamic* shared memory fails (``cudaErrorInvalidValue``, "invalid argument") unless the kernel
   opted in with ``cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)``,
   which works up to the device's opt-in limit (227 KB per block on H100/H200) and fails beyond it.
   Triton opts in for you when it loads a kernel, and raises
   ``triton.runtime.errors.OutOfResources`` at the first launch of one that needs more than the limit.
   :func:`cuda_smem_demo` launches a tiny CUDA kernel (:data:`CUDA_SOURCE`, one ``load_inline``
   build per process) at each side of both limits; :func:`triton_smem_demo` launches a Triton
   matmul whose pipelined tiles need 96 KB, then one that needs 256 KB; :func:`smem_verdict` says
   which side of the limits a byte count lies.
2. **Silent host work in a decode step.** What does run on the CPU without anyone asking is host
   work inside the step: a tensor kept on the host and copied in every step, or a read-back
   (``.item()``, ``.tolist()``, ``.cpu()``, printing a CUDA tensor) that makes the host wait for the
   GPU. :func:`find_host_work` runs a step under ``torch.profiler`` and names each such event and
   the op and scope it came from; :func:`decode_host_work` shows it on a real decode step, clean and
   wrapped two wrong ways.
3. **TF32 measured.** The article says TF32 tensor cores "need a layout" or run at a quarter speed.
   :func:`tf32_table` times fp32 matmuls with TF32 off and on (and bf16 for scale) at aligned and
   unaligned sizes, with each one's error against float64.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import re
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import triton
import triton.language as tl
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity

from ..decode.registry import make_decoder
from ..model import HybridLM
from .compile_check import NOMINAL_TARGET, compile_only
from .profile import _module_scopes, _profiling
from .timing import measure

KB = 1024

# -- 1. shared memory past 48 KB ---------------------------------------------------------------------


@dataclass(frozen=True)
class SmemLimits:
    """Shared memory (bytes) a block may use: ``per_block`` with no opt-in, ``per_block_optin`` at most
    after ``cudaFuncSetAttribute``, and ``per_sm``, an SM's whole shared memory."""

    per_block: int
    per_block_optin: int
    per_sm: int

    def __post_init__(self) -> None:
        if not 0 < self.per_block <= self.per_block_optin <= self.per_sm:
            raise ValueError(f"shared memory limits must satisfy 0 < per_block <= per_block_optin <= per_sm, got {self}")


# H100 / H200 (sm_90): 48 KB, 227 KB (the figure compile-check's stand-in driver gives Triton), 228 KB
HOPPER = SmemLimits(48 * KB, NOMINAL_TARGET["max_shared_mem"], 228 * KB)

VERDICTS = {
    "fits": "within the 48 KB any launch may use: it launches as it is",
    "opt-in": "above 48 KB: a CUDA launch fails with cudaErrorInvalidValue ('invalid argument') unless the kernel "
              "opted in with cudaFuncSetAttribute(MaxDynamicSharedMemorySize); Triton opts in for you",
    "too-large": "above the opt-in limit: no launch can run it (CUDA: 'invalid argument'; Triton: OutOfResources); "
                 "smaller tiles or fewer pipeline stages",
}


def smem_verdict(shared_bytes: int, limits: SmemLimits = HOPPER) -> str:
    """Which side of the limits a block's ``shared_bytes`` (static + dynamic) lies: a key of
    :data:`VERDICTS`. None of them is "runs on the CPU": a kernel either launches or fails to."""
    if not isinstance(shared_bytes, int) or shared_bytes < 0:
        raise ValueError(f"shared_bytes must be a whole number of bytes >= 0, got {shared_bytes!r}")
    if shared_bytes <= limits.per_block:
        return "fits"
    return "opt-in" if shared_bytes <= limits.per_block_optin else "too-large"


@dataclass
class SmemLaunch:
    """One launch of a demo kernel with ``shared_bytes`` of shared memory per block."""

    api: str  # "cuda" or "triton"
    case: str
    shared_bytes: int
    opted_in: bool  # cudaFuncSetAttribute was called first (Triton: it calls it itself)
    verdict: str = ""  # smem_verdict on this device's limits
    launched: bool = False
    error: str | None = None  # the runtime's own words (CUDA error name and text; OutOfResources)
    opt_in_error: str | None = None  # cudaFuncSetAttribute's, where that call failed
    correct: bool | None = None  # the output equals the torch reference (None: nothing ran)
    context_ok: bool | None = None  # afterwards no CUDA error is pending and a torch op still runs


def expected_to_launch(row: SmemLaunch) -> bool:
    """What the verdict predicts for ``row``: fits, or needs opt-in and has it."""
    return row.verdict == "fits" or (row.verdict == "opt-in" and row.opted_in)


def smem_surprises(rows: Iterable[SmemLaunch]) -> list[str]:
    """Each way the launches disagree with :func:`smem_verdict` (or computed a wrong result, or left
    the CUDA context broken); empty when the demo shows what the module's docstring states."""
    out = []
    for r in rows:
        what = f"{r.api} {r.case} ({r.shared_bytes} B, {r.verdict})"
        if r.launched != expected_to_launch(r):
            out.append(f"{what}: {'launched' if r.launched else 'failed'}, expected the opposite ({r.error})")
        if r.launched and r.correct is not True:
            out.append(f"{what}: launched but its output differs from the torch reference")
        if r.context_ok is False:
            out.append(f"{what}: the CUDA context was left with an error")
    return out


# A block copies its m = smem_bytes / 4 floats into dynamic shared memory, then writes them back
# reversed: out[b, j] = x[b, m - 1 - j], which reads what other threads wrote, so the whole buffer
# is used. Two instantiations, so that one kernel is never opted in however the other is set.
CUDA_SOURCE = r"""
#include <cuda_runtime.h>
#include <cstdint>
#include <string>

template <int OPTED_IN>
__global__ void labkit_smem_reverse(const float* __restrict__ x, float* __restrict__ out, int m) {
  extern __shared__ float tile[];
  const float* src = x + (size_t)blockIdx.x * m;
  float* dst = out + (size_t)blockIdx.x * m;
  for (int j = threadIdx.x; j < m; j += blockDim.x) tile[j] = src[j];
  __syncthreads();
  for (int j = threadIdx.x; j < m; j += blockDim.x) dst[j] = tile[m - 1 - j];
}

static std::string error_text(cudaError_t e) {
  if (e == cudaSuccess) return "";
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// Launch on `stream`; "" or the launch's error. A launch-configuration error is not sticky:
// cudaGetLastError reads it and clears it, and the context stays usable.
std::string smem_reverse(int64_t x, int64_t out, int64_t blocks, int64_t smem_bytes, bool opted_in, int64_t stream) {
  cudaError_t pending = cudaPeekAtLastError();
  if (pending != cudaSuccess) return "an error was pending before the launch: " + error_text(pending);
  auto kernel = opted_in ? labkit_smem_reverse<1> : labkit_smem_reverse<0>;
  kernel<<<(unsigned)blocks, 256, (size_t)smem_bytes, (cudaStream_t)stream>>>(
      (const float*)x, (float*)out, (int)(smem_bytes / 4));
  return error_text(cudaGetLastError());
}

// Raise the opted-in kernel's dynamic shared memory limit; "" or the error (then cleared).
std::string smem_opt_in(int64_t bytes) {
  cudaError_t e = cudaFuncSetAttribute(labkit_smem_reverse<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
  if (e != cudaSuccess) cudaGetLastError();
  return error_text(e);
}

std::string cuda_peek_error() { return error_text(cudaPeekAtLastError()); }

// A device's shared memory limit by name (bytes), or -1 for an unknown name or a failed query.
int64_t smem_attribute(std::string name, int64_t device) {
  cudaDeviceAttr attr;
  if (name == "per_block") attr = cudaDevAttrMaxSharedMemoryPerBlock;
  else if (name == "per_block_optin") attr = cudaDevAttrMaxSharedMemoryPerBlockOptin;
  else if (name == "per_sm") attr = cudaDevAttrMaxSharedMemoryPerMultiprocessor;
  else if (name == "reserved_per_block") attr = cudaDevAttrReservedSharedMemoryPerBlock;
  else return -1;
  int value = -1;
  if (cudaDeviceGetAttribute(&value, attr, (int)device) != cudaSuccess) { cudaGetLastError(); return -1; }
  return value;
}
"""

CPP_SOURCE = """
#include <cstdint>
#include <string>
std::string smem_reverse(int64_t x, int64_t out, int64_t blocks, int64_t smem_bytes, bool opted_in, int64_t stream);
std::string smem_opt_in(int64_t bytes);
std::string cuda_peek_error();
int64_t smem_attribute(std::string name, int64_t device);
"""
_FUNCTIONS = ["smem_reverse", "smem_opt_in", "cuda_peek_error", "smem_attribute"]
RUNTIME_LIMITS = ("per_block", "per_block_optin", "per_sm", "reserved_per_block")
TORCH_LIMITS = ("shared_memory_per_block", "shared_memory_per_block_optin", "shared_memory_per_multiprocessor")


def smem_flags() -> list[str]:
    """nvcc flags for this process's GPU: :func:`labkit.cuda.nvcc_flags` at its own capability, less
    the C++ standard: ``load_inline`` puts torch's headers at the top of the CUDA source, and torch
    picks the standard its headers need when none is given."""
    from ..cuda import nvcc_flags

    major, minor = torch.cuda.get_device_capability()
    return [f for f in nvcc_flags(f"{major}{minor}") if not f.startswith("-std=")]


@functools.lru_cache(maxsize=1)
def smem_extension():
    """The demo's CUDA extension, built once per process with ``load_inline`` (~30-60 s the first
    time on a machine; later processes load torch's cached build). Needs nvcc."""
    from torch.utils.cpp_extension import load_inline

    from ..cuda import require_nvcc

    if not torch.cuda.is_available():
        raise RuntimeError("the shared-memory demo launches a CUDA kernel: it needs a CUDA GPU")
    require_nvcc()
    flags = smem_flags()
    digest = hashlib.sha256("\0".join([CUDA_SOURCE, CPP_SOURCE, *flags]).encode()).hexdigest()[:10]
    return load_inline(name=f"labkit_pitfalls_smem_{digest}", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                       functions=_FUNCTIONS, extra_cuda_cflags=flags, verbose=False)


def _index(device: torch.device | str | int | None) -> int:
    if device is None or isinstance(device, int):
        return torch.cuda.current_device() if device is None else device
    device = torch.device(device)
    return torch.cuda.current_device() if device.index is None else device.index


def device_smem_limits(device: torch.device | str | int | None = None) -> tuple[SmemLimits, dict]:
    """The device's limits as the CUDA runtime gives them (``cudaDeviceGetAttribute``), and a
    report of both views: the runtime's, and what ``torch.cuda.get_device_properties`` holds of
    :data:`TORCH_LIMITS` (None for a field this torch does not have)."""
    index = _index(device)
    props = torch.cuda.get_device_properties(index)
    seen = {name: getattr(props, name, None) for name in TORCH_LIMITS}
    try:
        runtime = {name: smem_extension().smem_attribute(name, index) for name in RUNTIME_LIMITS}
    except Exception as exc:  # noqa: BLE001 - no nvcc, a failed build: torch's view still serves Triton's demo
        if seen["shared_memory_per_block_optin"] is None:
            raise
        report = {"cudaDeviceGetAttribute": {"error": f"{type(exc).__name__}: {exc}"[:2000]}, "torch": seen}
        return SmemLimits(*(seen[name] for name in TORCH_LIMITS)), report
    report = {"cudaDeviceGetAttribute": runtime, "torch": seen}
    return SmemLimits(runtime["per_block"], runtime["per_block_optin"], runtime["per_sm"]), report


def _context_ok(ext) -> bool:
    """No CUDA error pending, and a torch kernel still runs and reads back."""
    if ext is not None and ext.cuda_peek_error():
        return False
    try:
        return torch.ones(4, device="cuda").add_(1).sum().item() == 8.0
    except RuntimeError:
        return False


def cuda_smem_demo(limits: SmemLimits | None = None, blocks: int = 8) -> list[SmemLaunch]:
    """The CUDA kernel launched at 48 KB and 64 KB without opting in, then after
    ``cudaFuncSetAttribute`` at 64 KB, at the device's opt-in limit and 1 KB past it. Each launch
    is checked against ``x.view(blocks, m).flip(1)`` where it ran."""
    ext = smem_extension()
    limits = limits or device_smem_limits()[0]
    optin = limits.per_block_optin
    cases = [("48 KB, no opt-in", 48 * KB, None), ("64 KB, no opt-in", 64 * KB, None),
             ("64 KB after cudaFuncSetAttribute(64 KB)", 64 * KB, 64 * KB),
             ("the opt-in limit after cudaFuncSetAttribute(limit)", optin, optin),
             ("opt-in limit + 1 KB after cudaFuncSetAttribute(limit + 1 KB)", optin + KB, optin + KB)]
    rows = []
    for case, nbytes, opt_in in cases:
        m = nbytes // 4
        x = torch.randn(blocks * m, device="cuda")
        out = torch.full_like(x, float("nan"))
        row = SmemLaunch("cuda", case, nbytes, opted_in=opt_in is not None, verdict=smem_verdict(nbytes, limits))
        if opt_in is not None:
            row.opt_in_error = ext.smem_opt_in(opt_in) or None
        row.error = ext.smem_reverse(x.data_ptr(), out.data_ptr(), blocks, nbytes, opt_in is not None,
                                     torch.cuda.current_stream().cuda_stream) or None
        row.launched = row.error is None
        if row.launched:
            row.correct = torch.equal(out.view(blocks, m), x.view(blocks, m).flip(1))
        row.context_ok = _context_ok(ext)
        rows.append(row)
    return rows


@triton.jit
def _tile_matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c[M, N] = a[M, K] @ b[K, N], one [BM, BN] tile per program, float32 accumulation. Each
    loop step stages a [BM, BK] and a [BK, BN] tile in shared memory, and the pipeliner keeps
    num_stages of them in flight: its shared memory is chosen by the tile."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


# two tilings of the demo matmul: 3 stages x (128x64 + 64x128) fp16 = 96 KB; 4 x (128x128 + 128x128) = 256 KB
TRITON_TILES = {
    "128x128x64 tiles, 3 stages": {"BM": 128, "BN": 128, "BK": 64, "num_warps": 4, "num_stages": 3},
    "128x128x128 tiles, 4 stages": {"BM": 128, "BN": 128, "BK": 128, "num_warps": 4, "num_stages": 4},
}
# M is irregular; N and K are multiples of 16 elements: with rows not 16-byte aligned Triton cannot
# stage tiles with cp.async, does not pipeline, and both tilings would need one 32 KB stage only
DEMO_SHAPE = (300, 256, 192)


def tile_shared_estimate(tile: dict, element_bytes: int = 2) -> int:
    """num_stages x (BM x BK + BK x BN) x element bytes: the staged operand tiles."""
    return tile["num_stages"] * (tile["BM"] * tile["BK"] + tile["BK"] * tile["BN"]) * element_bytes


def tile_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, *, BM: int, BN: int, BK: int,
                num_warps: int, num_stages: int):
    """``out = a @ b`` through :func:`_tile_matmul_kernel` at one tiling; returns what Triton's launch
    returns (the compiled kernel, whose ``metadata.shared`` is its shared memory per block)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or tuple(out.shape) != (a.shape[0], b.shape[1]):
        raise ValueError(f"tile_matmul needs a [M, K], b [K, N], out [M, N]; got {list(a.shape)}, {list(b.shape)}, "
                         f"{list(out.shape)}")
    if not a.dtype == b.dtype == out.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"tile_matmul takes float16 or bfloat16 tensors of one dtype, got {a.dtype}, {b.dtype}, {out.dtype}")
    (M, K), N = a.shape, b.shape[1]
    grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))
    return _tile_matmul_kernel[grid](a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(), BM=BM, BN=BN, BK=BK,
                                     num_warps=num_warps, num_stages=num_stages)


def triton_smem_demo(limits: SmemLimits | None = None) -> list[SmemLaunch]:
    """Each tiling of :data:`TRITON_TILES` launched on :data:`DEMO_SHAPE` fp16 operands: the 96 KB
    one runs (Triton opted in) and is checked against float64; the 256 KB one raises OutOfResources."""
    from triton.runtime.errors import OutOfResources

    from ..bench.ops import rel_err

    limits = limits or device_smem_limits()[0]
    M, N, K = DEMO_SHAPE
    g = torch.Generator("cuda").manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g)
    rows = []
    for case, tile in TRITON_TILES.items():
        out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        row = SmemLaunch("triton", case, tile_shared_estimate(tile), opted_in=True)
        try:
            kernel = tile_matmul(a, b, out, **tile)
            row.shared_bytes, row.launched = kernel.metadata.shared, True
            row.correct = rel_err(out, a.double() @ b.double()) < 2e-3  # fp16 output rounding: ~5e-4
        except OutOfResources as exc:
            row.shared_bytes, row.error = exc.required, str(exc)
        row.verdict = smem_verdict(row.shared_bytes, limits)
        row.context_ok = _context_ok(None)
        rows.append(row)
    return rows


def compiled_tile_shared(arch: int = 90) -> dict[str, int]:
    """Each tiling's shared memory as Triton compiles it for ``sm_<arch>``, on a machine without a
    GPU: :func:`labkit.lab.compile_check.compile_only` (a fresh process that has not imported
    Triton's interpreter; it replaces Triton's driver for the whole process). The tiling past the
    opt-in limit compiles: only its load on a GPU would fail, which is the pitfall shown."""
    if not compile_only(arch, refuse_too_large=False):
        raise RuntimeError("compiling for a GPU without one needs a process that does not run Triton's interpreter")
    M, N, K = DEMO_SHAPE
    a, b, c = (torch.empty(shape, dtype=torch.float16) for shape in ((M, K), (K, N), (M, N)))
    return {case: tile_matmul(a, b, c, **tile).metadata.shared for case, tile in TRITON_TILES.items()}


# -- 2. silent host work in a decode step -----------------------------------------------------------

STEP_SCOPE = "pitfalls::step"
# host-side events by which the host waits for the device (kineto names CUDA runtime calls as the API does)
SYNC_EVENTS = ("aten::item", "aten::_local_scalar_dense", "aten::tolist", "cudaStreamSynchronize",
               "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D")
DTOH, HTOD = "Memcpy DtoH", "Memcpy HtoD"  # device-side copies, e.g. "Memcpy HtoD (Pageable -> Device)"


def _base_name(name: str) -> str:
    """An API call's name without a version or per-thread-stream suffix (cudaMemcpy_v3020,
    cudaStreamSynchronize_ptsz), as CUPTI may report it."""
    return re.sub(r"(_v\d+|_ptsz|_ptds)+$", "", name)


def _is_api_call(name: str) -> bool:
    """A CUDA runtime or driver call (cudaMemcpyAsync, cuLaunchKernelEx), not an op or a scope."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


@dataclass
class HostWork:
    """One kind of host work a step does: ``per_step`` times the event ``name``, which came from the
    aten op ``op`` (the outermost one inside ``scope``; "" where the profiler links it to none) in
    the ``record_function`` scope ``scope``."""

    kind: str  # "sync": the host waits for the device; "h2d": a copy from host memory to the device
    name: str
    op: str
    scope: str
    per_step: float

    def __str__(self) -> str:
        origin = f"from {self.op or 'an unlinked launch'}" + (f" in {self.scope}" if self.scope else "")
        return f"{self.kind:4s} {self.name:40s} x{self.per_step:g} per step, {origin}"


class HostWorkReport(list):
    """The :class:`HostWork` of a step, a list that prints as a table."""

    def __str__(self) -> str:
        if not self:
            return "no host work in the step: nothing read back to the host, nothing copied from it"
        return "\n".join(str(w) for w in self)


def _chain(event, ops: list) -> list[str]:
    """The names of the ops and scopes around ``event``, innermost first: its parents, or for an
    event the profiler gave no parent (a CUDA API call) those of the innermost op that encloses it
    in time."""
    node = event.cpu_parent
    if node is None:
        start, end = event.time_range.start, event.time_range.end
        around = [o for o in ops if o is not event and not _is_api_call(o.name)
                  and o.time_range.start <= start and end <= o.time_range.end]
        node = max(around, key=lambda o: (o.time_range.start, -o.time_range.end), default=None)
    names = []
    while node is not None:
        names.append(node.name)
        node = node.cpu_parent
    return names


def _origin(names: list[str]) -> tuple[str, str]:
    """(op, scope) from a chain of names, innermost first: the innermost scope (neither an aten op
    nor an API call) and the outermost aten op inside it."""
    op = ""
    for name in names:
        if name.startswith("aten::"):
            op = name
        elif not _is_api_call(name):
            return op, name
    return op, ""


def host_work(events, steps: int) -> HostWorkReport:
    """The host work in a profile's events (``prof.events()``) of ``steps`` calls, each inside a
    :data:`STEP_SCOPE` scope: :data:`SYNC_EVENTS` on the host, and device-to-host / host-to-device
    copies on the device, each linked to the op that launched it (as
    :func:`labkit.lab.profile._attribute_kernels` links kernels: by name and duration among the ops'
    ``kernels``). Events outside every step scope are left out (the caller's own synchronize)."""
    cpu = torch.autograd.DeviceType.CPU
    ops = [e for e in events if e.device_type == cpu]
    counts: Counter = Counter()
    for e in ops:
        if _base_name(e.name) in SYNC_EVENTS:
            names = [e.name, *_chain(e, ops)]
            if STEP_SCOPE in names:
                counts[("sync", e.name, *_origin(names))] += 1
    launched_by: dict[tuple[str, float], list] = {}
    for op in ops:
        for k in getattr(op, "kernels", []):
            if k.name.startswith((DTOH, HTOD)):
                launched_by.setdefault((k.name, round(k.duration, 3)), []).append(op)
    for e in events:
        if e.device_type == cpu or not e.name.startswith((DTOH, HTOD)):
            continue
        owners = launched_by.get((e.name, round(e.time_range.end - e.time_range.start, 3)))
        owner = owners.pop(0) if owners else None
        names = [owner.name, *_chain(owner, ops)] if owner is not None else []
        if owner is not None and STEP_SCOPE not in names:
            continue
        counts[("sync" if e.name.startswith(DTOH) else "h2d", e.name, *_origin(names))] += 1
    found = [HostWork(kind, name, op, scope, n / steps) for (kind, name, op, scope), n in counts.items()]
    return HostWorkReport(sorted(found, key=lambda w: (w.kind, w.op, w.name)))


def find_host_work(step: Callable[[], object], *, warmup: int = 1, steps: int = 3,
                   model: HybridLM | None = None) -> HostWorkReport:
    """Run ``step()`` ``warmup`` times (compiles, first allocations), then ``steps`` times under
    ``torch.profiler`` (CPU and, where CUDA exists, CUDA activity), each call in a
    :data:`STEP_SCOPE` scope, and report its host work (:func:`host_work`). With ``model``, its
    norms, mixers and MLPs get scopes too (as :func:`labkit.lab.profile.profile_decode` gives them),
    so a finding inside one names it. On a CPU the same read-backs show up (``aten::item``), though
    there they cost nothing."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got {warmup} and {steps}")
    for _ in range(warmup):
        step()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with _module_scopes(model) if model is not None else nullcontext(), _profiling(activities) as prof:
        for _ in range(steps):
            with record_function(STEP_SCOPE):
                step()
        if cuda:
            torch.cuda.synchronize()  # outside the step scopes: not counted
    return host_work(prof.events(), steps)


STOP_TOKEN = 0


def _clean_step(decoder, state: dict) -> Callable[[], None]:
    def step() -> None:
        state["tokens"] = decoder.step(state["tokens"]).argmax(-1)

    return step


def _host_positions_step(decoder, state: dict) -> Callable[[], None]:
    """The same step, but the positions are rebuilt on the host each step and copied in (the
    values it writes are the ones the device already holds: only the traffic is wrong)."""
    clean = _clean_step(decoder, state)

    def step() -> None:
        positions = torch.tensor(decoder.cache.host_lengths, dtype=torch.int32)  # a host tensor
        decoder.cache.lengths.copy_(positions)
        clean()

    return step


def _item_step(decoder, state: dict) -> Callable[[], None]:
    """The same step with a stop check on the host: ``.item()`` of the next token, every step."""
    clean = _clean_step(decoder, state)

    def step() -> None:
        clean()
        state["stopped"] = state["tokens"][0].item() == STOP_TOKEN

    return step


HOST_WORK_VARIANTS = {"clean": _clean_step, "positions kept on the host": _host_positions_step,
                      ".item() every step": _item_step}


@torch.no_grad()
def decode_host_work(model: HybridLM, backend: str = "fused", *, batch: int = 1, context: int = 16, steps: int = 3,
                     variants: Iterable[str] = tuple(HOST_WORK_VARIANTS)) -> dict[str, HostWorkReport]:
    """:func:`find_host_work` on ``backend``'s decode step after a ``context``-token prefill, clean
    and wrapped each wrong way of :data:`HOST_WORK_VARIANTS` (one warm-up step, ``steps`` profiled)."""
    unknown = [v for v in variants if v not in HOST_WORK_VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]!r}; variants: {', '.join(HOST_WORK_VARIANTS)}")
    cache = model.new_cache(batch, context + steps + 2)
    decoder = make_decoder(backend, model, cache)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(model.device)
    out = {}
    for name in variants:
        cache.reset()
        state = {"tokens": decoder.prefill(ids).argmax(-1)}
        out[name] = find_host_work(HOST_WORK_VARIANTS[name](decoder, state), warmup=1, steps=steps, model=model)
    return out


def host_work_surprises(reports: dict[str, HostWorkReport]) -> list[str]:
    """Where :func:`decode_host_work`'s broken variants were not caught: the host positions must show
    a host-to-device copy, the ``.item()`` a read-back named ``aten::item``. (Findings in the clean
    step are reported, not refused: they are what the step really does.)"""
    out = []
    positions = reports.get("positions kept on the host")
    if positions is not None and not any(w.kind == "h2d" for w in positions):
        out.append("the positions kept on the host were not seen as a host-to-device copy")
    item = reports.get(".item() every step")
    if item is not None and not any(w.op == "aten::item" and w.kind == "sync" for w in item):
        out.append("the .item() of every step was not seen as a read-back from aten::item")
    return out


# -- 3. TF32 measured ---------------------------------------------------------------------------------

TF32_SIZES = (4096, 8192, 4093, 4095, 4097, 4100)
MATMUL_MODES = ("fp32", "tf32", "bf16")


@dataclass
class MatmulRow:
    """One ``n x n @ n x n`` matmul: ``mode`` "fp32" (fp32 with TF32 off), "tf32" (fp32 with
    ``allow_tf32``), "bf16" (the fp32 inputs rounded to bf16); median ms over the repeats, TFLOP/s
    (2 n^3 / time) and ``||C - C64|| / ||C64||``, C64 the float64 product of the fp32 inputs."""

    n: int
    mode: str
    ms: float
    tflops: float
    rel_err: float


def tf32_table(device: torch.device | str = "cuda", sizes: Iterable[int] = TF32_SIZES, *, warmup: int = 3,
               repeats: int = 10) -> list[MatmulRow]:
    """Each size in each of :data:`MATMUL_MODES`, timed by :func:`labkit.lab.timing.measure` (CUDA
    events around eager calls; the host clock on a CPU). ``torch.backends.cuda.matmul.allow_tf32``
    is set per mode and put back as it was, also when a measurement fails."""
    from ..bench.ops import rel_err

    sizes = list(sizes)
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes must be whole numbers >= 1, got {sizes}")
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32
    rows = []
    try:
        for n in sizes:
            g = torch.Generator(device).manual_seed(n)
            a = torch.randn(n, n, device=device, generator=g)
            b = torch.randn(n, n, device=device, generator=g)
            exact = a.double() @ b.double()
            for mode in MATMUL_MODES:
                matmul.allow_tf32 = mode == "tf32"
                x, y = (a.bfloat16(), b.bfloat16()) if mode == "bf16" else (a, b)
                out = torch.empty_like(x)
                t = measure(lambda: torch.matmul(x, y, out=out), device=device, graph=False, warmup=warmup,
                            repeats=repeats)
                rows.append(MatmulRow(n, mode, t.ms, 2 * n**3 / (t.ms * 1e-3) / 1e12, rel_err(out, exact)))
            del a, b, exact, x, y, out
    finally:
        matmul.allow_tf32 = saved
    return rows


def tf32_summary(rows: list[MatmulRow], align: int = 128) -> dict:
    """The table read three ways: per size, TF32's and bf16's speed over FP32's; per size, whether
    the TF32 run really rounded to TF32 (its error over 10x FP32's: TF32 keeps 10 mantissa bits,
    so its error is ~1e-4 where FP32's is ~1e-7); per mode and unaligned size, its TFLOP/s over that
    of the nearest size that is a multiple of ``align``."""
    by = {(r.n, r.mode): r for r in rows}
    sizes = sorted({r.n for r in rows})
    speedup = {n: {m: by[n, m].tflops / by[n, "fp32"].tflops for m in MATMUL_MODES if (n, m) in by and m != "fp32"}
               for n in sizes if (n, "fp32") in by}
    rounded = {str(n): by[n, "tf32"].rel_err > 10 * by[n, "fp32"].rel_err for n in sizes
               if (n, "tf32") in by and (n, "fp32") in by}
    aligned = [n for n in sizes if n % align == 0]
    unaligned = []
    for n in sizes:
        if n % align == 0 or not aligned:
            continue
        base = min(aligned, key=lambda s: abs(math.log(s / n)))
        for m in MATMUL_MODES:
            if (n, m) in by and (base, m) in by:
                unaligned.append({"n": n, "aligned_n": base, "mode": m,
                                  "speed_vs_aligned": by[n, m].tflops / by[base, m].tflops})
    return {"speed_over_fp32": {str(n): v for n, v in speedup.items()}, "tf32_rounded": rounded, "unaligned": unaligned}


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.lab.pitfalls",
                                     description="print the demo tilings' shared memory as Triton compiles them "
                                                 "for a GPU, on a machine without one (JSON)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    args = parser.parse_args(argv)
    print(json.dumps(compiled_tile_shared(args.arch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
