"""LFM2's gated short convolution, one decode step, in one kernel.

From the in_proj output ``proj [B, 3H] = (B | C | x)`` and the conv state ``[B, K-1, H]`` (the last
K-1 values of B*x), for every channel c:

    u     = (state[:, 0], ..., state[:, K-2], B_c * x_c)          the window, oldest first
    y_c   = C_c * sum_{j<K} w[c, j] * u_j                            ready for out_proj
    state <- (u_1, ..., u_{K-1})                                     shifted in place

B*x is rounded to the state dtype before it enters the window, as the reference stores it.
Channels are independent, so each program owns a block of channels of one sequence and updates
their state without any coordination. (The conv could also ride in the epilogue of the in_proj
GEMV if that program owned rows c, H + c and 2H + c; kept separate here, it costs one small launch.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .launch import FLOAT_DTYPES, TORCH_TO_TL, cast, cdiv, check_devices, check_no_overlap, check_pdl, check_tensor, interpreter_flags, interpreting, next_pow2
from .mixers import short_conv_ref


@triton.jit
def _short_conv_decode_kernel(
    proj_ptr, state_ptr, w_ptr, out_ptr, H,
    KW: tl.constexpr, BLOCK_H: tl.constexpr, OUT_DTYPE: tl.constexpr,
    DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Grid (B, cdiv(H, BLOCK_H)); see the module docstring for the maths."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = c < H
    state_dtype = state_ptr.dtype.element_ty
    if USE_PDL:
        gdc_wait()
    row = proj_ptr + b * 3 * H
    gate_b = tl.load(row + c, mask=mask, other=0.0).to(tl.float32)
    gate_c = tl.load(row + H + c, mask=mask, other=0.0).to(tl.float32)
    xv = tl.load(row + 2 * H + c, mask=mask, other=0.0).to(tl.float32)
    bx = cast(gate_b * xv, state_dtype, EMULATE_RTNE)
    state = state_ptr + b * (KW - 1) * H + c
    y = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(KW - 1):
        s = tl.load(state + j * H, mask=mask, other=0.0).to(tl.float32)
        y += s * tl.load(w_ptr + c * KW + j, mask=mask, other=0.0).to(tl.float32)
    y += bx.to(tl.float32) * tl.load(w_ptr + c * KW + KW - 1, mask=mask, other=0.0).to(tl.float32)
    # The shift is in place: every thread (replicated lanes included) reads the old rows first.
    tl.debug_barrier()
    for j in tl.static_range(KW - 2):
        tl.store(state + j * H, tl.load(state + (j + 1) * H, mask=mask, other=0.0), mask=mask)
    tl.store(state + (KW - 2) * H, bx, mask=mask)
    if USE_PDL:
        gdc_launch_dependents()
    tl.store(out_ptr + b * H + c, cast(gate_c * y, OUT_DTYPE, EMULATE_RTNE), mask=mask)


def short_conv_block(hidden: int, batch: int) -> int:
    """Channels per program: enough programs to spread a small step, 16-byte loads per thread."""
    if interpreting():
        return min(256, next_pow2(hidden))
    return max(64, min(1024, next_pow2(hidden) // 4 if batch == 1 else next_pow2(hidden) // 2))


def short_conv_decode(
    proj: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    block_h: int | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """One decode step of the gated short conv: returns C * conv(B * x) [B, H] and shifts ``state``
    ([B, K-1, H], in place). ``proj`` [B, 3H] is the in_proj output, ``weight`` [H, K]."""
    check_tensor("proj", proj, dtype=FLOAT_DTYPES)
    if proj.dim() != 2 or proj.shape[1] % 3:
        raise ValueError(f"proj must be [B, 3H] (B | C | x), got {list(proj.shape)}")
    bsz, hidden = proj.shape[0], proj.shape[1] // 3
    check_tensor("weight", weight, dtype=FLOAT_DTYPES, shape=(hidden, None))
    kw = weight.shape[1]
    if kw < 2:
        raise ValueError(f"the conv needs at least 2 taps (a state to carry), got {kw}")
    check_tensor("state", state, dtype=FLOAT_DTYPES, shape=(bsz, kw - 1, hidden))
    if out is None:
        out = torch.empty(bsz, hidden, dtype=proj.dtype, device=proj.device)
    check_tensor("out", out, dtype=proj.dtype, shape=(bsz, hidden))
    check_pdl(pdl, check_devices(proj=proj, state=state, weight=weight, out=out))
    check_no_overlap([("proj", proj, "out", out), ("state", state, "out", out), ("proj", proj, "state", state)])
    block = block_h or short_conv_block(hidden, bsz)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block_h must be a power of two, got {block}")
    _short_conv_decode_kernel[(bsz, cdiv(hidden, block))](
        proj, state, weight, out, hidden,
        KW=kw, BLOCK_H=block, OUT_DTYPE=TORCH_TO_TL[out.dtype], USE_PDL=bool(pdl),
        **interpreter_flags(proj.dtype), num_warps=4, launch_pdl=bool(pdl),
    )
    return out


def short_conv_decode_ref(
    proj: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [B, H], new_state [B, K-1, H]): :func:`labkit.ops.mixers.short_conv_ref` (the model's
    maths) for one token; ``state`` is not modified."""
    y, new_state = short_conv_ref(proj[:, None], state, weight)
    return y[:, 0], new_state
