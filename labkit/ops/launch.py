"""What every Triton launcher in ``labkit.ops`` shares: input checks, the interpreter switch, and
three small ``@triton.jit`` helpers.

Launchers check their inputs before anything is launched and raise ``TypeError`` (wrong dtype) or
``ValueError`` (wrong device, shape, layout, alignment) with a message that names the argument;
there is no silent fallback to another implementation.

Kernels run on a CUDA GPU, or on the CPU in Triton's interpreter when ``TRITON_INTERPRET=1`` was
set before triton was first imported. Two things differ in the interpreter of Triton 3.6, and the
kernels take a constexpr flag for each rather than behaving differently by accident:

- ``tl.dot`` on bfloat16 operands multiplies their raw 16-bit patterns (the interpreter stores
  bf16 as uint16), so in the interpreter dots are done on float32 copies (``DOT_F32``);
- float32 -> bfloat16 casts truncate instead of rounding to nearest even, so :func:`cast` rounds by
  hand there (``EMULATE_RTNE``), which keeps CPU results bit-comparable with torch's rounding.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import torch
import triton
import triton.language as tl

from .features import features

INTERPRET: bool = bool(triton.knobs.runtime.interpret)
INTERPRET_CONSTEXPR: tl.constexpr = tl.constexpr(INTERPRET)  # for jit code that differs in the interpreter

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

TORCH_TO_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 at import time)."""
    return INTERPRET


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# What the heuristics assume where there is no GPU to ask (the interpreter, a compile-only check):
# a nominal figure, not a measurement (it happens to be an H100's or H200's count).
NOMINAL_SMS = 132


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int | None = None) -> int:
    """Streaming multiprocessors of the current GPU, as the device reports them; ``NOMINAL_SMS``
    in the interpreter or without a GPU."""
    if INTERPRET or not torch.cuda.is_available():
        return NOMINAL_SMS
    index = torch.cuda.current_device() if device_index is None else device_index
    return torch.cuda.get_device_properties(index).multi_processor_count


# -- input checks -----------------------------------------------------------------------------------
def check_tensor(
    name: str,
    t: object,
    *,
    shape: tuple[int | None, ...] | None = None,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    contiguous: bool = True,
    aligned: bool = True,
) -> torch.Tensor:
    """Raise a clear error unless ``t`` is a tensor of the given shape (None = any size), dtype,
    contiguous, with a 16-byte aligned start (what 16-byte vector loads need)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, allowed))}, got {t.dtype}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {t.stride()}); call .contiguous() first")
    if aligned and t.data_ptr() % 16:
        raise ValueError(f"{name} must start at a 16-byte aligned address (it is a view at an odd offset)")
    return t


def check_devices(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors on one device, and one Triton can run on: CUDA, or anything in the interpreter."""
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) != 1:
        where = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all tensors must be on one device; got {where}")
    device = devices.pop()
    if device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"Triton kernels need CUDA tensors, got tensors on {device}; on a machine without a GPU set "
            "TRITON_INTERPRET=1 before importing triton to run them in Triton's interpreter"
        )
    return device


def check_no_overlap(pairs: Iterable[tuple[str, torch.Tensor | None, str, torch.Tensor | None]]) -> None:
    """Raise if a kernel input shares memory with an output that other programs write."""
    for name_a, a, name_b, b in pairs:
        if a is None or b is None or a.numel() == 0 or b.numel() == 0:
            continue
        a0, a1 = a.data_ptr(), a.data_ptr() + a.numel() * a.element_size()
        b0, b1 = b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{name_a} and {name_b} must not overlap in memory")


def check_pdl(pdl: bool, device: torch.device, what: str = "pdl=True") -> None:
    """A launch with programmatic dependent launch needs a GPU that has it (:mod:`labkit.ops.features`):
    a clear error here, instead of ptxas failing on ``griddepcontrol`` for an older GPU."""
    if pdl:
        features(device).require("pdl", f"{what} (programmatic dependent launch)", "Launch with pdl=False.")


def check_eps(name: str, eps: float) -> float:
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"{name} must be a positive finite float, got {eps!r}")
    return float(eps)


# -- jit helpers ------------------------------------------------------------------------------------
def device_function(fn):
    """``@triton.jit`` for a function that kernels call.

    In the interpreter every call of a jit function re-patches ``triton.language`` (about 1.5 ms,
    more than the arithmetic it wraps); the calling kernel has already patched it, so there the
    AST-rewritten body is called directly. Compiled kernels are unaffected.
    """
    jitted = triton.jit(fn)
    if not INTERPRET:
        return jitted
    try:
        body = jitted.rewrite()
    except AttributeError:  # pragma: no cover - another interpreter layout: keep the slow path
        return jitted

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return body(*args, **kwargs)

    return call


@device_function
def cast(x, dtype: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    """``x.to(dtype)`` with round-to-nearest-even, also in the interpreter (see the module notes)."""
    if EMULATE_RTNE and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@device_function
def dot(a, b, acc, DOT_F32: tl.constexpr):
    """acc + a @ b with float32 accumulation; on float32 copies (exact products) when DOT_F32."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@device_function
def arrive(counter_ptr, expected):
    """Count this program in at ``*counter_ptr``; true for the one that arrives last of ``expected``.

    The pattern ("the last program to finish does the shared work") lets one kernel do what would
    otherwise need a second launch: a split-K sum, a norm over blocks that different programs
    computed, a state update that others must have read first. Before arriving, every thread of
    the program has issued its memory operations (the barrier) and the acq_rel atomic publishes
    them; the last program, after its acquire, sees everything the others wrote (it should read
    that data with ``cache_modifier=".cg"`` so that no stale L1 line is used). It also puts the
    counter back to zero, so that the next launch (or graph replay) starts clean.
    """
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = seen == expected - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    tl.debug_barrier()  # every thread's later reads come after the acquire
    return last


@device_function
def load_acquire(ptr):
    """``*ptr`` (int32) as an acquire load at GPU scope, by every thread: what any program wrote before
    releasing the value it reads is visible to this thread's later loads. (``tl.atomic_add(ptr, 0,
    sem="acquire")`` would do, but Triton 3.6 drops an atomic whose result is unused; in the
    interpreter, where programs run one after another, a plain load.)"""
    if INTERPRET_CONSTEXPR:
        return tl.load(ptr, volatile=True)
    else:
        return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                         is_pure=False, pack=1)


@device_function
def _first_thread_acquire(ptr):
    """``*ptr`` (int32) as an acquire load at GPU scope by the program's thread 0; every other
    thread gets 2**31 - 1 at once, without touching memory. (In the interpreter, where a program
    is one thread, a plain load, as :func:`load_acquire` does.)"""
    if INTERPRET_CONSTEXPR:
        return tl.load(ptr, volatile=True)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred %wa_p; .reg .b32 %wa_t; mov.u32 %wa_t, %tid.x; setp.eq.u32 %wa_p, %wa_t, 0; "
            "mov.u32 $0, 2147483647; @%wa_p ld.acquire.gpu.global.b32 $0, [$1]; }",
            "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)


@device_function
def wait_until(counter_ptr, target):
    """Spin until ``*counter_ptr >= target``: the producers of what comes next have counted themselves in
    (a barrier, then a release atomic add, as :func:`arrive` does; the counter only grows until its
    owner resets it).

    One thread of the program polls, with an acquire load at GPU scope, and the barrier then lets
    the program go on together: what the producers wrote before their release is visible to
    every thread's later loads (the acquire, ordered before the others' loads by the barrier, is
    the pattern of a cooperative grid sync; it also drops the SM's stale L1 lines). Why one
    thread: when every warp of a few hundred programs polls, all their requests go to the one L2
    line that holds the counter, and the producers' own atomics on it queue behind them. Another
    program must be resident to produce, so a grid that waits on itself must fit on the GPU at once
    (the persistent kernel sizes its grid so).
    """
    if target > 0:  # 0: nothing to wait for (a program's later tiles of an instruction)
        while _first_thread_acquire(counter_ptr) < target:
            pass
    tl.debug_barrier()


@device_function
def prefetch_l2(addr, nbytes):
    """Ask L2 for ``nbytes`` (a multiple of 16) from the 16-byte aligned global address ``addr``
    (int64), without waiting: Hopper's bulk prefetch (``cp.async.bulk.prefetch.L2``), issued once
    per program by its thread 0; the data comes to L2 and no register or shared memory is held.
    sm_90 and later; nothing in the interpreter, which has no cache to fill."""
    if not INTERPRET_CONSTEXPR:
        tl.inline_asm_elementwise(
            "{ .reg .pred %pf_p; .reg .b32 %pf_t; mov.u32 %pf_t, %tid.x; setp.eq.u32 %pf_p, %pf_t, 0; "
            "@%pf_p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [addr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def globaltimer():
    """The GPU's global nanosecond timer (PTX %globaltimer; coarse, but one clock for all SMs). Not in
    the interpreter, which runs no PTX."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


def interpreter_flags(dtype: torch.dtype) -> dict[str, bool]:
    """The constexpr flags every kernel takes (see the module notes)."""
    return {
        "DOT_F32": INTERPRET or dtype == torch.float32,
        "EMULATE_RTNE": INTERPRET,
    }
