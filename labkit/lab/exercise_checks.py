"""Checks for the notebooks' coding exercises.

Each check returns one line for the reader, ``"correct: ..."`` or ``"not yet: ..."``, and never
raises for a wrong or unfinished answer, so a notebook run with its exercises untouched still passes.
The truth each answer is held to is labkit's own (one reference per piece of maths): the byte
count of :func:`labkit.lab.roofline.step_cost`, the short conv of
:func:`labkit.ops.short_conv.short_conv_decode_ref`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import PRESETS
from ..ops.short_conv import short_conv_decode_ref
from .roofline import layer_costs, step_cost

# (preset, batch, context): both families, irregular batches and contexts, an empty cache
STEP_BYTES_CASES = (("lfm2-350m", 1, 0), ("lfm2-350m", 3, 100), ("qwen3.5-0.8b", 5, 77), ("qwen3.5-0.8b", 16, 2048))
# step_cost also counts the B embedding rows a step reads (2 KB each): far below this tolerance
STEP_BYTES_RTOL = 1e-4


def check_step_bytes(fn: Callable[[Any, int, int], int]) -> str:
    """Hold ``fn(cfg, batch, context)`` (the bytes one decode step moves) to labkit's count on
    :data:`STEP_BYTES_CASES`; when it is off, say which part (KV cache or fixed state) it is off by."""
    for name, batch, context in STEP_BYTES_CASES:
        cfg = PRESETS[name]
        want = step_cost(cfg, batch, context).bytes
        try:
            got = int(fn(cfg, batch, context))
        except Exception as exc:  # the reader's code: any failure is an answer to report, not to raise
            return f"not yet: step_bytes({name}, batch={batch}, context={context}) raised {type(exc).__name__}: {exc}"
        if abs(got - want) <= STEP_BYTES_RTOL * want:
            continue
        costs = layer_costs(cfg, context)
        kv = batch * sum(c.state_bytes_per_seq for c in costs if c.kind == "attention")
        fixed = batch * sum(c.state_bytes_per_seq for c in costs if c.kind in ("conv", "gdn"))
        missing = want - got
        near = 0.01 * abs(missing) + batch * cfg.hidden_size * 2  # slack: the embedding rows a reader may leave out
        hint = next((what for what, b in (("the KV cache and the fixed state", kv + fixed), ("the KV cache", kv),
                                          ("the conv windows and GDN states", fixed))
                     if abs(missing - b) <= near), None)
        return (f"not yet: {name}, batch {batch}, context {context}: yours {got / 1e6:,.2f} MB, labkit counts "
                f"{want / 1e6:,.2f} MB" + (f" (the difference is {hint}, for the whole batch)" if hint else ""))
    return f"correct: your byte count matches labkit's on all {len(STEP_BYTES_CASES)} (model, batch, context) cases"


class _OpCounter(TorchDispatchMode):
    """Records every ATen op that computes (views launch no kernel, so they are left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[..., Any], *args: Any) -> tuple[list[str], Any]:
    """(the computing ATen ops ``fn(*args)`` dispatched, in order; its result). On a GPU each of them
    is at least one kernel launch; the count does not depend on the device."""
    with _OpCounter() as counter:
        out = fn(*args)
    return counter.ops, out


def short_conv_inputs(batch: int = 3, kernel: int = 3, hidden: int = 40, seed: int = 0):
    """(proj [B, 3H], window [B, K-1, H], weight [H, K]): an irregular short-conv decode step, float32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3 * hidden, generator=g), torch.randn(batch, kernel - 1, hidden, generator=g),
            torch.randn(hidden, kernel, generator=g))


def check_short_conv_step(fn: Callable[..., Any], max_ops: int) -> str:
    """Hold ``fn(proj, window, weight) -> (y, new_window)`` to the reference short conv decode step,
    and its op count to ``max_ops``."""
    if max_ops < 1:
        raise ValueError(f"max_ops must be at least 1, got {max_ops}")
    ref_ops, (y_ref, w_ref) = count_ops(short_conv_decode_ref, *short_conv_inputs())
    try:
        ops, out = count_ops(fn, *short_conv_inputs())
        y, new_window = out
        close = torch.allclose(y, y_ref, atol=1e-5) and torch.allclose(new_window, w_ref, atol=1e-6)
    except Exception as exc:  # the reader's code
        return f"not yet: your step raised {type(exc).__name__}: {exc}"
    if not close:
        return "not yet: your step's output (or its new window) differs from the reference's"
    if len(ops) > max_ops:
        return (f"not yet: right result, but {len(ops)} ops ({', '.join(ops)}); the reference runs {len(ref_ops)}, "
                f"the target is at most {max_ops}")
    return f"correct: the same result in {len(ops)} ops ({', '.join(ops)}) instead of the reference's {len(ref_ops)}"
