"""What the GPU at hand offers the kernels beyond plain loads and stores: the one place that knows.

The rule, stated once: **programmatic dependent launch (PDL), the tensor memory accelerator (TMA)
and the bulk L2 prefetch all need compute capability 9.0 or newer** (Hopper: H100, H200;
Blackwell: B200). An A100 (sm_80), an L4 or an RTX 4090 (sm_89) has none of them. Every check in
labkit asks :func:`features`; nothing else reads the compute capability.

What a rung or an op does on a GPU without a feature is its own choice, made at construction or
before any launch, never deep inside a kernel: it takes its non-Hopper path where it has one (the
persistent rung streams without the bulk prefetch), or raises :class:`MissingFeature`, which names
the GPU, its capability, what is missing and what to use instead (``"fused+graph+pdl"`` points at
``"fused+graph"``). Without the check, a PDL kernel would fail in ptxas (``griddepcontrol`` is not
an sm_80 instruction), and a Triton tensor descriptor would silently become plain loads, so that a
"TMA" measurement would be of something else.

Devices that are not CUDA GPUs:

- in Triton's interpreter (``TRITON_INTERPRET=1``), every feature is on: the interpreter runs each
  Hopper path's arithmetic (a PDL wait and a bulk prefetch are no-ops there, tensor descriptors are
  emulated), which is how the CPU tests cover those paths;
- a plain CPU without the interpreter runs no Triton kernel at all: every feature is off.

:func:`stand_in` makes every device answer as a named GPU of a given capability: for running on a
CPU what a GPU would decide (``python -m labkit compile-check --arch 80``, tests/test_other_gpus.py).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

__all__ = ["Features", "MissingFeature", "features", "stand_in", "HOPPER", "FEATURES", "SHORT_NAMES"]

HOPPER = (9, 0)  # the compute capability every feature below starts at

# feature name -> what it is, in a sentence's words
FEATURES = {
    "pdl": "programmatic dependent launch (PDL: griddepcontrol)",
    "tma": "the tensor memory accelerator (TMA: cp.async.bulk.tensor, tensor descriptors)",
    "bulk_prefetch": "the bulk L2 prefetch (cp.async.bulk.prefetch.L2)",
}
SHORT_NAMES = {"pdl": "PDL", "tma": "TMA", "bulk_prefetch": "bulk prefetch"}


class MissingFeature(RuntimeError):
    """This GPU lacks a feature that was asked for by name (a rung, an option of an op)."""


@dataclass(frozen=True)
class Features:
    """What kernels may use on one device; see the module docstring for the rule."""

    kind: str  # "cuda", "interpreter" (Triton's, on the CPU) or "cpu" (no Triton kernel runs)
    name: str  # the GPU's name, or the kind in words
    capability: tuple[int, int] | None  # (major, minor) of a CUDA GPU; None otherwise
    pdl: bool
    tma: bool
    bulk_prefetch: bool

    @property
    def arch(self) -> str:
        """``"sm_80"`` for a CUDA GPU of capability 8.0; the kind in words otherwise."""
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else self.name

    def has(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
        return bool(getattr(self, feature))

    def require(self, feature: str, what: str, instead: str) -> None:
        """Raise :class:`MissingFeature` unless this device has ``feature``: ``what`` (the thing
        asked for, e.g. ``'backend "fused+graph+pdl"'``) needs it; ``instead`` says what to use."""
        if self.has(feature):
            return
        if self.kind == "cuda":
            where = f"this GPU, {self.name}, is {self.arch}"
        else:
            where = (f"the tensors are on {self.name}, where Triton kernels run only in Triton's interpreter "
                     "(TRITON_INTERPRET=1 before triton is imported)")
        raise MissingFeature(f"{what} needs {FEATURES[feature]}, which needs a GPU of compute capability "
                             f"{HOPPER[0]}.{HOPPER[1]} or newer (Hopper: H100, H200; Blackwell); {where}. "
                             f"{instead}")


def _rule(kind: str, name: str, capability: tuple[int, int] | None) -> Features:
    """The one rule: on a CUDA GPU every feature from sm_90 on; in the interpreter all of them (its
    no-op or emulated versions); on a plain CPU none."""
    if kind == "cuda":
        hopper = capability is not None and tuple(capability) >= HOPPER
        return Features(kind, name, tuple(capability) if capability else None, hopper, hopper, hopper)
    on = kind == "interpreter"
    return Features(kind, name, None, on, on, on)


_STAND_IN: tuple[str, tuple[int, int]] | None = None


def _interpreting() -> bool:
    try:
        from .launch import interpreting
    except ImportError:  # no triton: no interpreter either
        return False
    return interpreting()


def _describe(device: torch.device) -> tuple[str, str, tuple[int, int] | None]:
    """(kind, name, capability) of a device, as torch reports it (or as :func:`stand_in` says)."""
    if _STAND_IN is not None:
        return "cuda", _STAND_IN[0], _STAND_IN[1]
    if device.type == "cuda":
        return "cuda", torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device))
    if _interpreting():
        return "interpreter", "Triton's interpreter", None
    return "cpu", str(device), None


@functools.lru_cache(maxsize=None)
def _cached(kind: str, index: int | None) -> Features:
    return _rule(*_describe(torch.device(kind) if index is None else torch.device(kind, index)))


def features(device: torch.device | str | int | None = None) -> Features:
    """The :class:`Features` of ``device`` (a torch device, ``"cuda:1"``, a CUDA index; None: the
    current CUDA device where there is one, else the CPU). Cached per device."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    index = device.index
    if device.type == "cuda" and index is None and _STAND_IN is None and torch.cuda.is_available():
        index = torch.cuda.current_device()  # "cuda" and "cuda:0" are one GPU: one cache entry
    return _cached(device.type, index)


@contextmanager
def stand_in(name: str, capability: tuple[int, int]) -> Iterator[Features]:
    """While the ``with`` block runs, every device (the CPU included) answers :func:`features` as
    a CUDA GPU called ``name`` of compute capability ``capability``: so that a CPU can run what that
    GPU would decide (which rung refuses, which path a kernel takes), and compile for it. Nothing
    else about the device changes: tensors stay where they are."""
    global _STAND_IN
    if len(capability) != 2 or not all(isinstance(v, int) and v >= 0 for v in capability):
        raise ValueError(f"capability must be (major, minor), e.g. (8, 0), got {capability!r}")
    before = _STAND_IN
    _STAND_IN = (str(name), (capability[0], capability[1]))
    _cached.cache_clear()
    try:
        yield _rule("cuda", *_STAND_IN)
    finally:
        _STAND_IN = before
        _cached.cache_clear()
