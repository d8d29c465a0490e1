"""Gated DeltaNet, one decode step after in_proj, in one kernel.

From ``proj [B, P]`` = (q | k | v | z | b | a) of in_proj (q, k: ``nk*dk`` channels, v, z:
``nv*dv``, b, a: ``nv``), the conv state ``[B, KW-1, C]`` (raw q|k|v of the last KW-1 tokens,
C = 2*nk*dk + nv*dv) and the float32 recurrent state ``S [B, nv, dk, dv]``, per sequence and
value head h (sharing q/k head h // (nv/nk)):

    q, k, v = silu(conv(q|k|v))                      depthwise causal conv; the state shifts
    q = q / sqrt(|q|^2 + 1e-6) / sqrt(dk);  k = k / sqrt(|k|^2 + 1e-6)
    g = -exp(A_log[h]) * softplus(a[h] + dt_bias[h]);  beta = sigmoid(b[h])
    S = exp(g) * S;  u = beta * (v - S^T k);  S = S + k u^T;  o = S^T q          (float32)
    out[h] = o / sqrt(mean(o^2) + eps) * norm_weight * silu(z[h])                ready for out_proj

Parallelism: one program per (sequence, value head, block of BLOCK_V value columns), so that
batch 1 with 16 heads of 128 columns still spreads over 128-256 programs; each reads its [dk,
BLOCK_V] slice of S once and writes it once, in place. What the slices share is finished by the
last program to arrive (an atomic counter, see :func:`labkit.ops.launch.arrive`), not by extra
launches:

- q and k of a head are needed by every program of the head group, so each recomputes their
  conv + L2 norm (about 2*dk*KW values from L2; cheaper than a launch). Their conv state must
  shift only after all of them have read it: the last of the group to arrive shifts it.
- the output RMSNorm spans all dv columns: each program leaves its o block in a float32 scratch
  and the last of the head normalises the whole head and writes it.

With BLOCK_V >= dv (and one value head per key head) neither is needed and the kernel skips them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .launch import (
    device_function,
    FLOAT_DTYPES,
    TORCH_TO_TL,
    arrive,
    cast,
    cdiv,
    check_devices,
    check_eps,
    check_pdl,
    check_no_overlap,
    check_tensor,
    interpreter_flags,
    interpreting,
    next_pow2,
    num_sms,
    wait_until,
)
from .mixers import GdnDims, gated_deltanet_ref


@device_function
def _conv_channels(row, conv_state, conv_w_ptr, ch, mask, C, KW: tl.constexpr, KW_PAD: tl.constexpr):
    """Pre-activation causal conv of channels ``ch`` at the new token, sum_j w[c, j] u_j over the
    window u = (state rows, new value row[c]), as one [KW_PAD, len(ch)] tile."""
    j = tl.arange(0, KW_PAD)[:, None]
    old = tl.load(conv_state + j * C + ch[None, :], mask=(j < KW - 1) & mask[None, :], other=0.0)
    new = tl.load(row + ch, mask=mask, other=0.0)
    u = tl.where(j == KW - 1, new[None, :], old).to(tl.float32)
    w = tl.load(conv_w_ptr + ch[None, :] * KW + j, mask=(j < KW) & mask[None, :], other=0.0).to(tl.float32)
    return tl.sum(u * w, axis=0)


@device_function
def _shift_conv_state(row, conv_state, ch, mask, C, KW: tl.constexpr, KW_PAD: tl.constexpr):
    """state rows j <- j + 1, the last row <- the new raw value row[c].

    Row j + 1 is loaded by the thread that holds element (j + 1, c) of the tile, and stored by
    another one: the barrier keeps every load of the old window ahead of every store.
    """
    j = tl.arange(0, KW_PAD)[:, None]
    later = tl.load(conv_state + (j + 1) * C + ch[None, :], mask=(j + 1 < KW - 1) & mask[None, :], other=0.0)
    new = tl.load(row + ch, mask=mask, other=0.0)
    later = tl.where(j + 1 == KW - 1, new[None, :], later)
    tl.debug_barrier()
    tl.store(conv_state + j * C + ch[None, :], later, mask=(j < KW - 1) & mask[None, :])


@device_function
def _gated_norm_store(o, z_row, norm_w_ptr, out_row, d, dmask, DV: tl.constexpr, eps,
                      OUT_DTYPE: tl.constexpr, EMULATE_RTNE: tl.constexpr):
    z = tl.load(z_row + d, mask=dmask, other=0.0).to(tl.float32)
    w = tl.load(norm_w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(o * o, axis=0) / DV + eps)
    y = o * rstd * w * (z / (1.0 + tl.exp(-z)))
    tl.store(out_row + d, cast(y, OUT_DTYPE, EMULATE_RTNE), mask=dmask)


@device_function
def gdn_tile(
    pid, vb, n_vb, wait_ptr, wait_target,
    proj_ptr, conv_state_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, state_ptr, out_ptr,
    qk_count_ptr, o_count_ptr, o_part_ptr,
    P, C, eps, q_scale,
    NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr, KW_PAD: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_V: tl.constexpr,
    SHARED_QK: tl.constexpr, SPLIT_V: tl.constexpr, OUT_DTYPE: tl.constexpr,
    DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr, RELEASE_EARLY: tl.constexpr,
    WAIT_COUNTER: tl.constexpr,
):
    """Value block ``vb`` of ``n_vb`` of (sequence, value head) ``pid = b * NV + hv``; see the
    module docstring for the maths. With WAIT_COUNTER it waits for ``*wait_ptr >= wait_target``
    (the persistent decode kernel's dependency) where a PDL launch waits for the previous grid:
    after the state slice, which depends on no earlier work of the step, is requested."""
    b = pid // NV
    hv = pid % NV
    GROUP: tl.constexpr = NV // NK
    hk = hv // GROUP
    dk = tl.arange(0, BLOCK_DK)
    kmask = dk < DK
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = dv < DV

    # The recurrent state slice does not depend on the previous kernel: start streaming it first.
    s_ptrs = state_ptr + (pid.to(tl.int64) * DK + dk[:, None]) * DV + dv[None, :]
    s_mask = kmask[:, None] & vmask[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)

    if USE_PDL:
        if RELEASE_EARLY:
            # Release the next kernel at once (it waits for this whole grid before reading our
            # outputs) so that it can put its weights in flight on the SMs this grid leaves idle.
            gdc_launch_dependents()
        gdc_wait()
    if WAIT_COUNTER:
        wait_until(wait_ptr, wait_target)
    row = proj_ptr + b * P
    conv_state = conv_state_ptr + b * (KW - 1) * C
    q_ch = hk * DK + dk
    k_ch = NK * DK + hk * DK + dk
    v_ch = 2 * NK * DK + hv * DV + dv

    q = _conv_channels(row, conv_state, conv_w_ptr, q_ch, kmask, C, KW, KW_PAD)
    k = _conv_channels(row, conv_state, conv_w_ptr, k_ch, kmask, C, KW, KW_PAD)
    v = _conv_channels(row, conv_state, conv_w_ptr, v_ch, vmask, C, KW, KW_PAD)
    q = q / (1.0 + tl.exp(-q))  # silu
    k = k / (1.0 + tl.exp(-k))
    v = v / (1.0 + tl.exp(-v))
    # Shifting happens in place: every thread (replicated lanes included) must have read the old
    # rows first. These v channels belong to this program alone; q/k ones too unless shared.
    tl.debug_barrier()
    _shift_conv_state(row, conv_state, v_ch, vmask, C, KW, KW_PAD)
    if not SHARED_QK:
        _shift_conv_state(row, conv_state, q_ch, kmask, C, KW, KW_PAD)
        _shift_conv_state(row, conv_state, k_ch, kmask, C, KW, KW_PAD)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)

    gates = row + 2 * NK * DK + 2 * NV * DV
    beta = 1.0 / (1.0 + tl.exp(-tl.load(gates + hv).to(tl.float32)))
    x = tl.load(gates + NV + hv).to(tl.float32) + tl.load(dt_bias_ptr + hv).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's softplus (threshold 20)
    g = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32)) * softplus

    S = S * tl.exp(g)
    u = beta * (v - tl.sum(S * k[:, None], axis=0))
    S = S + k[:, None] * u[None, :]
    o = tl.sum(S * q[:, None], axis=0)  # [BLOCK_V]
    # Not needed for correctness: the tile is stored with the layout it was loaded with, so every
    # element is rewritten by the thread that read it (planted away on the H200 on 2026-12-02, the
    # race test passed and Triton's own barriers left the PTX with as many bar.syncs). Kept until
    # its removal is timed; the race test's planted "state" names it.
    tl.debug_barrier()  # in place: the old slice is read before it is overwritten
    tl.store(s_ptrs, S, mask=s_mask)
    if USE_PDL and not RELEASE_EARLY:
        gdc_launch_dependents()

    z_row = row + 2 * NK * DK + NV * DV + hv * DV
    out_row = out_ptr + b * NV * DV + hv * DV
    if SPLIT_V:
        part = o_part_ptr + pid * BLOCK_DV
        tl.store(part + dv, o, mask=vmask)
        if arrive(o_count_ptr + pid, n_vb):
            d = tl.arange(0, BLOCK_DV)
            dmask = d < DV
            o_all = tl.load(part + d, mask=dmask, other=0.0, cache_modifier=".cg")
            _gated_norm_store(o_all, z_row, norm_w_ptr, out_row, d, dmask, DV, eps, OUT_DTYPE, EMULATE_RTNE)
    else:
        _gated_norm_store(o, z_row, norm_w_ptr, out_row, dv, vmask, DV, eps, OUT_DTYPE, EMULATE_RTNE)

    if SHARED_QK:
        # every program of this key head has read its q/k conv state: the last one shifts it
        if arrive(qk_count_ptr + b * NK + hk, GROUP * n_vb):
            _shift_conv_state(row, conv_state, q_ch, kmask, C, KW, KW_PAD)
            _shift_conv_state(row, conv_state, k_ch, kmask, C, KW, KW_PAD)


@triton.jit
def _gdn_decode_kernel(
    proj_ptr, conv_state_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, state_ptr, out_ptr,
    qk_count_ptr, o_count_ptr, o_part_ptr,
    P, C, eps, q_scale,
    NK: tl.constexpr, NV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KW: tl.constexpr, KW_PAD: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_V: tl.constexpr,
    SHARED_QK: tl.constexpr, SPLIT_V: tl.constexpr, OUT_DTYPE: tl.constexpr,
    DOT_F32: tl.constexpr, EMULATE_RTNE: tl.constexpr, USE_PDL: tl.constexpr, RELEASE_EARLY: tl.constexpr,
):
    """Grid (B * NV, cdiv(DV, BLOCK_V)): one :func:`gdn_tile` per program."""
    gdn_tile(
        tl.program_id(0), tl.program_id(1), tl.num_programs(1), qk_count_ptr, 0,
        proj_ptr, conv_state_ptr, conv_w_ptr, a_log_ptr, dt_bias_ptr, norm_w_ptr, state_ptr, out_ptr,
        qk_count_ptr, o_count_ptr, o_part_ptr, P, C, eps, q_scale,
        NK, NV, DK, DV, KW, KW_PAD, BLOCK_DK, BLOCK_DV, BLOCK_V, SHARED_QK, SPLIT_V, OUT_DTYPE,
        DOT_F32, EMULATE_RTNE, USE_PDL, RELEASE_EARLY, False,
    )


@dataclass
class GdnWorkspace:
    """Arrival counters (zero between launches) and the float32 o scratch of split value heads."""

    qk_counters: torch.Tensor  # int32 [B * nk]
    o_counters: torch.Tensor  # int32 [B * nv]
    o_partials: torch.Tensor  # float32 [B * nv, next_pow2(dv)]

    @classmethod
    def allocate(cls, batch: int, dims: GdnDims, device: torch.device | str) -> "GdnWorkspace":
        return cls(
            torch.zeros(batch * dims.num_k_heads, dtype=torch.int32, device=device),
            torch.zeros(batch * dims.num_v_heads, dtype=torch.int32, device=device),
            torch.empty(batch * dims.num_v_heads, next_pow2(dims.v_head_dim), dtype=torch.float32, device=device),
        )


def gdn_block_v(batch: int, dims: GdnDims, *, block_v: int = 32, narrow_block_v: int = 16,
                programs_per_sm: int = 2) -> int:
    """Value columns per program: ``block_v`` where that still gives ``programs_per_sm`` programs
    per SM, else ``narrow_block_v`` (each at most the head, padded to a power of two).

    The defaults are the heuristic, the H200's measurement (notebook 02;
    data/bench/nvidia-h200/fusion-evidence.json, "block_v"; a GPU's own are its tuning file's,
    ``labkit.tuning.settings("gated_delta_decode")``), for 128 x 128 heads: blocks of 16-32 columns
    (8-16 KB of float32 state per program) beat finer splits, which repeat the per-head work (gates,
    q/k norms) in more programs, and whole heads, which at batch 1 launch one program per head (16
    on 132 SMs). Whole heads also spill a few registers, yet at batch 16 (256 programs) they match
    the best: the grid is what costs.
    """
    for name, v in (("block_v", block_v), ("narrow_block_v", narrow_block_v)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    whole = next_pow2(dims.v_head_dim)
    if interpreting():
        return whole
    if batch * dims.num_v_heads * cdiv(dims.v_head_dim, block_v) >= programs_per_sm * num_sms():
        return min(block_v, whole)
    return min(narrow_block_v, whole)


def tile_sizes(dims: GdnDims, kw: int, block_v: int) -> dict[str, object]:
    """The constexpr sizes of :func:`gdn_tile` (this module's kernel and the persistent step's):
    value heads split in ``block_v`` columns, and whether programs share a key head's q/k."""
    n_vb = cdiv(dims.v_head_dim, block_v)
    group = dims.num_v_heads // dims.num_k_heads
    return dict(NK=dims.num_k_heads, NV=dims.num_v_heads, DK=dims.k_head_dim, DV=dims.v_head_dim, KW=kw,
                KW_PAD=next_pow2(kw), BLOCK_DK=next_pow2(dims.k_head_dim), BLOCK_DV=next_pow2(dims.v_head_dim),
                BLOCK_V=block_v, SHARED_QK=group * n_vb > 1, SPLIT_V=n_vb > 1)


def gdn_decode(
    proj: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    dims: GdnDims,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    workspace: GdnWorkspace | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    pdl: bool = False,
    release_early: bool = True,
) -> torch.Tensor:
    """One Gated DeltaNet decode step: returns ``out [B, nv*dv]`` (gated-normed, for out_proj) and
    updates ``conv_state`` [B, KW-1, C] and the float32 ``state`` [B, nv, dk, dv] in place.

    ``block_v``: value columns per program (default :func:`gdn_block_v`'s). ``release_early``:
    under PDL, release the next kernel first thing (True, the heuristic) or at the end (False);
    safe either way, since the next kernel waits for this whole grid before reading its outputs."""
    if not isinstance(dims, GdnDims):
        raise TypeError(f"dims must be GdnDims, got {type(dims).__name__}")
    if dims.num_v_heads % dims.num_k_heads:
        raise ValueError("num_v_heads must be a multiple of num_k_heads")
    check_tensor("proj", proj, dtype=FLOAT_DTYPES, shape=(None, dims.proj_dim))
    bsz, dtype = proj.shape[0], proj.dtype
    check_tensor("conv_weight", conv_weight, dtype=FLOAT_DTYPES, shape=(dims.conv_dim, None))
    kw = conv_weight.shape[1]
    if kw < 2:
        raise ValueError(f"the conv needs at least 2 taps, got {kw}")
    check_tensor("conv_state", conv_state, dtype=dtype, shape=(bsz, kw - 1, dims.conv_dim))
    check_tensor("A_log", A_log, dtype=FLOAT_DTYPES, shape=(dims.num_v_heads,), aligned=False)
    check_tensor("dt_bias", dt_bias, dtype=FLOAT_DTYPES, shape=(dims.num_v_heads,), aligned=False)
    check_tensor("norm_weight", norm_weight, dtype=FLOAT_DTYPES, shape=(dims.v_head_dim,))
    check_tensor(
        "state", state, dtype=torch.float32, shape=(bsz, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim)
    )
    eps = check_eps("eps", eps)
    if out is None:
        out = torch.empty(bsz, dims.value_dim, dtype=dtype, device=proj.device)
    check_tensor("out", out, dtype=dtype, shape=(bsz, dims.value_dim))
    if workspace is None:
        workspace = GdnWorkspace.allocate(bsz, dims, proj.device)
    if not isinstance(workspace, GdnWorkspace):
        raise TypeError(f"workspace must be a GdnWorkspace, got {type(workspace).__name__}")
    check_tensor("workspace.qk_counters", workspace.qk_counters, dtype=torch.int32, shape=(bsz * dims.num_k_heads,))
    check_tensor("workspace.o_counters", workspace.o_counters, dtype=torch.int32, shape=(bsz * dims.num_v_heads,))
    check_tensor(
        "workspace.o_partials", workspace.o_partials, dtype=torch.float32,
        shape=(bsz * dims.num_v_heads, next_pow2(dims.v_head_dim)),
    )
    check_pdl(pdl, check_devices(
        proj=proj, conv_state=conv_state, conv_weight=conv_weight, A_log=A_log, dt_bias=dt_bias,
        norm_weight=norm_weight, state=state, out=out, counters=workspace.qk_counters,
    ))
    check_no_overlap([("proj", proj, "out", out), ("proj", proj, "conv_state", conv_state)])
    block = block_v or gdn_block_v(bsz, dims)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block_v must be a power of two, got {block}")
    n_vb = cdiv(dims.v_head_dim, block)
    if num_warps is None:  # about 32 float32 state elements per thread: no spills at [128, 64]
        num_warps = max(4, min(16, next_pow2(dims.k_head_dim) * block // 1024))
    _gdn_decode_kernel[(bsz * dims.num_v_heads, n_vb)](
        proj, conv_state, conv_weight, A_log, dt_bias, norm_weight, state, out,
        workspace.qk_counters, workspace.o_counters, workspace.o_partials,
        proj.shape[1], dims.conv_dim, eps, dims.k_head_dim**-0.5,
        **tile_sizes(dims, kw, block), OUT_DTYPE=TORCH_TO_TL[dtype], USE_PDL=bool(pdl),
        RELEASE_EARLY=bool(release_early), **interpreter_flags(dtype), num_warps=num_warps, launch_pdl=bool(pdl),
    )
    return out


def gdn_decode_ref(
    proj: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor,
    dims: GdnDims,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [B, nv*dv], new conv_state, new state): :func:`labkit.ops.mixers.gated_deltanet_ref`
    (the model's maths) for one token; the inputs are not modified."""
    out, new_conv_state, new_state = gated_deltanet_ref(
        proj[:, None], conv_state, conv_weight, A_log, dt_bias, norm_weight, state, dims, eps
    )
    return out[:, 0], new_conv_state, new_state
