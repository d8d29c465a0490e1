"""Final norm + LM head + greedy argmax, without writing the logits.

Greedy decode needs one integer per sequence, but ``argmax(lm_head(norm(h)))`` done naively
writes ``[B, vocab]`` logits (248k columns for Qwen3.5) and reads them back. Here the LM-head
stream (:mod:`labkit.ops.linear`, with its RMSNorm prologue) ends each [rows, BLOCK_N] tile with
its own (max, first argmax), and a second tiny kernel reduces those per-tile winners:

    token[m] = min{ n : logits[m, n] = max_n' logits[m, n'] }      (torch.argmax's choice)

where logits are taken as rounded to the activation dtype, so the token equals
``torch.argmax`` of the logits that :func:`labkit.ops.linear.linear` would return. Writing the
logits as well is optional (``logits_out``), for a step that needs both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .launch import cdiv, check_devices, check_pdl, check_tensor, device_function
from .linear import LinearConfig, LinearWorkspace, PdlPlacement, launch_linear, linear_config
from .norm import rms_norm_ref


@device_function
def argmax_row(row, best_val_ptr, best_idx_ptr, out_ptr, n_tiles, BLOCK: tl.constexpr):
    """out[row] = best_idx[row, t*] with t* the first tile of the largest best_val[row, t].

    Lanes keep a running (value, index) with strict '>' so the earliest tile wins within a lane;
    across lanes the smallest index among the maxima wins. Tile winners are first-in-tile, so the
    result is the first column holding the row maximum.
    """
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 2147483647, tl.int32)
    for t0 in range(0, n_tiles, BLOCK):
        t = t0 + offs
        mask = t < n_tiles
        v = tl.load(best_val_ptr + row * n_tiles + t, mask=mask, other=float("-inf"))
        i = tl.load(best_idx_ptr + row * n_tiles + t, mask=mask, other=2147483647)
        take = v > best
        best = tl.where(take, v, best)
        best_i = tl.where(take, i, best_i)
    top = tl.max(best, axis=0)
    winner = tl.min(tl.where(best == top, best_i, 2147483647), axis=0)
    tl.store(out_ptr + row, winner.to(tl.int64))


@triton.jit
def _argmax_reduce_kernel(best_val_ptr, best_idx_ptr, out_ptr, n_tiles, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """One :func:`argmax_row` per program (one per row)."""
    if USE_PDL:
        gdc_wait()
    argmax_row(tl.program_id(0), best_val_ptr, best_idx_ptr, out_ptr, n_tiles, BLOCK)


@dataclass
class GreedyHeadBuffers:
    """Per-tile winners of the LM-head stream: [M, n_tiles] values and indices."""

    best_val: torch.Tensor  # float32
    best_idx: torch.Tensor  # int32

    @classmethod
    def allocate(cls, m: int, n: int, config: LinearConfig, device: torch.device | str) -> "GreedyHeadBuffers":
        tiles = cdiv(n, config.block_n)
        return cls(
            torch.empty(m, tiles, dtype=torch.float32, device=device),
            torch.empty(m, tiles, dtype=torch.int32, device=device),
        )


def greedy_head(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
    tokens_out: torch.Tensor | None = None,
    logits_out: torch.Tensor | None = None,
    config: LinearConfig | None = None,
    buffers: GreedyHeadBuffers | None = None,
    workspace: LinearWorkspace | None = None,
    pdl: bool = False,
    placement: PdlPlacement | None = None,
) -> torch.Tensor:
    """``argmax(norm(x) @ weight^T, -1)`` as int64 [M] for x [M, K], weight [V, K].

    ``logits_out`` [M, V], when given, receives the logits too. ``buffers`` (per-tile winners,
    sized for ``config``) and ``tokens_out`` let a CUDA graph reuse fixed memory. ``placement``:
    the projection's PDL placement (see :func:`labkit.ops.linear.launch_linear`).
    """
    check_tensor("weight", weight)
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"x must be [M, K] and weight [V, K], got {list(x.shape)} and {list(weight.shape)}")
    m, v = x.shape[0], weight.shape[0]
    cfg = config or linear_config(m, v, weight.shape[1], argmax=True)
    if buffers is None:
        buffers = GreedyHeadBuffers.allocate(m, v, cfg, x.device)
    if not isinstance(buffers, GreedyHeadBuffers):
        raise TypeError(f"buffers must be GreedyHeadBuffers, got {type(buffers).__name__}")
    if tokens_out is None:
        tokens_out = torch.empty(m, dtype=torch.int64, device=x.device)
    check_tensor("tokens_out", tokens_out, dtype=torch.int64, shape=(m,))
    check_pdl(pdl, check_devices(x=x, tokens_out=tokens_out, best_val=buffers.best_val))
    launch_linear(
        x, weight, out=logits_out, norm_weight=norm_weight, norm_eps=norm_eps, norm_unit_offset=norm_unit_offset,
        config=cfg, workspace=workspace, pdl=pdl, store_out=logits_out is not None,
        best_val=buffers.best_val, best_idx=buffers.best_idx, placement=placement,
    )
    n_tiles = buffers.best_val.shape[1]
    block = min(4096, triton.next_power_of_2(n_tiles))
    _argmax_reduce_kernel[(m,)](
        buffers.best_val, buffers.best_idx, tokens_out, n_tiles,
        BLOCK=block, USE_PDL=bool(pdl), num_warps=8 if block >= 2048 else 4, launch_pdl=bool(pdl),
    )
    return tokens_out


def greedy_head_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    norm_unit_offset: bool = False,
) -> torch.Tensor:
    if norm_weight is not None:
        x = rms_norm_ref(x, norm_weight, norm_eps, norm_unit_offset)
    return F.linear(x, weight).argmax(-1)
