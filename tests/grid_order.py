"""Run Triton interpreter grids out of order, to expose races between programs.

The interpreter runs a launch's programs one after another, in order (x, then y, then z, each
from 0: triton/runtime/interpreter.py, ``GridExecutor.__call__``), and each program whole before
the next. Two programs that write the same element then always end with the last one's value,
so a missing mask that lets an earlier program write a later one's result (on a GPU, a race:
either may land last) is hidden wherever the correct writer comes later in that order. Running
the grid backwards, or shuffled, makes the wrong writer land last instead.

The order is changed where the interpreter hands each program its index:
``interpreter_builder.set_grid_idx(x, y, z)`` is remapped through a permutation of the grid drawn
when ``set_grid_dim`` announces the launch's grid. Nothing changes on a GPU (no interpreter).
"""

from __future__ import annotations

import os
import random

ORDERS = ("reversed", "shuffled")


def scramble_grid(monkeypatch, order: str = "reversed", seed: int = 0) -> bool:
    """Make every interpreted launch run its programs in ``order`` ("reversed": the last program
    first; "shuffled": a seeded random permutation per launch) until ``monkeypatch`` is undone.
    Returns False (and changes nothing) where kernels do not run in the interpreter."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    rng = random.Random(seed)
    perm: list[int] = []

    def grid_dim(nx, ny, nz):
        set_dim(nx, ny, nz)
        perm[:] = range(nx * ny * nz)
        if order == "reversed":
            perm.reverse()
        else:
            rng.shuffle(perm)

    def grid_idx(x, y, z):
        nx, ny, nz = builder.grid_dim
        i = perm[(x * ny + y) * nz + z]
        set_idx(i // (ny * nz), i // nz % ny, i % nz)

    monkeypatch.setattr(builder, "set_grid_dim", grid_dim)
    monkeypatch.setattr(builder, "set_grid_idx", grid_idx)
    return True
