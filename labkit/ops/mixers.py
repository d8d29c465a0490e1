"""The three token mixers after their input projection, in plain torch: the one statement of each.

The model's mixers are ``in_proj -> (these) -> out_proj``; the decode kernels' references are
these at T = 1. Each takes the projection ``proj [B, T, P]`` of T new tokens per sequence and the
layer's weights and state:

- gated short conv (LFM2), ``proj = B | C | x`` (H channels each), conv state ``[B, K-1, H]``::

      y = C * conv(B * x)                 depthwise causal conv over (state, B * x), see causal_conv

- Gated DeltaNet (Qwen3.5), ``proj = q | k | v | z | b | a`` (q, k: nk*dk; v, z: nv*dv; b, a: nv),
  conv state ``[B, KW-1, 2*nk*dk + nv*dv]``, float32 recurrent state ``S [B, nv, dk, dv]``::

      q, k, v = silu(conv(q | k | v));  q, k L2-normalised per head
      g = -exp(A_log) * softplus(a + dt_bias);  beta = sigmoid(b)
      o = delta_rule(q, k, v, g, beta; S)                   see delta_rule.delta_rule_ref
      y = rmsnorm(o) * norm_weight * silu(z)                per value head

- grouped-query attention, ``proj = q | k | v (| gate)`` (q, gate: nh*hd; k, v: nkv*hd), the KV
  cache ``[B, nkv, L, hd]`` and the new tokens' positions ``[B, T]``::

      q = rope(rmsnorm(q)), k = rope(rmsnorm(k))            per head, at each token's position
      keys[pos], values[pos] = k, v                         written into the given cache, in place
      y = softmax(q . keys[<= pos] / sqrt(hd)) values        (* sigmoid(gate) with an output gate)

The conv and delta-rule states are returned new (the inputs are left as they were); the KV cache
is written in place, since copying a whole cache per token would be the reference's main cost.

The inner computations are parameters, :class:`MixerCores`: the delta rule, the attention core
(the softmax line above), the KV cache write, the element-wise chains, and the blocks' output
projections with their residual add (:func:`project_ref`). A faster path passes another
implementation of the same function (the chunked Triton delta rule, SDPA's causal form, a slice
copy into the cache, one cuBLAS call for projection + residual) and runs everything around it from
these very functions, so nothing here is restated elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from .causal_conv import causal_conv_ref
from .delta_rule import delta_rule_ref
from .norm import gated_rms_norm_ref, l2_norm_ref, rms_norm_ref
from .rope import rope_ref


@dataclass(frozen=True)
class GdnDims:
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def proj_dim(self) -> int:
        return self.conv_dim + self.value_dim + 2 * self.num_v_heads

    @property
    def proj_sizes(self) -> list[int]:
        """q|k|v (through the conv), z, b, a."""
        return [self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads]


@dataclass(frozen=True)
class AttentionDims:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    output_gate: bool = False

    @property
    def proj_sizes(self) -> list[int]:
        """q, k, v (, gate)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [q, kv, kv] + ([q] if self.output_gate else [])

    @property
    def proj_dim(self) -> int:
        """q | k | v (| gate) rows of the projection."""
        return sum(self.proj_sizes)

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads


def attend_ref(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """The attention core: softmax(q . keys / sqrt(hd)) values over the keys at positions <= each query's.

    ``q`` [B, nh, T, hd] (after norm and RoPE), ``keys``, ``values`` [B, nkv, L, hd] (nh a multiple of
    nkv), ``positions`` [B, T] of the queries, ``key_positions`` [B, L]. Returns [B, nh, T, hd].
    """
    visible = key_positions[:, None, None, :] <= positions[:, None, :, None]  # [B, 1, T, L]
    return F.scaled_dot_product_attention(
        q, keys, values, attn_mask=visible, scale=q.shape[-1] ** -0.5, enable_gqa=True
    )


def attend_causal(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """:func:`attend_ref` for a prompt that starts every sequence: the T queries are at positions
    0..T-1 of each sequence and the keys are exactly those T tokens. The visibility mask is then the
    causal triangle, which SDPA takes as ``is_causal`` with no mask tensor: the same function, and
    its flash kernel on a GPU. The caller vouches for the positions (reading them here would sync
    the device); the shapes are checked.
    """
    if keys.shape[2] != q.shape[2] or positions.shape[1] != q.shape[2]:
        raise ValueError(
            f"the causal form needs exactly the T = {q.shape[2]} new tokens as keys, got {keys.shape[2]}; "
            "use attend_ref when sequences continue a cache"
        )
    return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=q.shape[-1] ** -0.5, enable_gqa=True)


def attend_continuing(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor,
    *, start: int,
) -> torch.Tensor:
    """:func:`attend_ref` for T new tokens that continue a cache holding ``start`` tokens in every
    sequence: the queries are at positions start..start+T-1 and the keys at 0..L-1 (L >= start+T,
    the cache buffer). Keys past start+T-1 are seen by no query, so only the first ``start + T`` are
    read, and the visibility mask over them is the causal triangle aligned to the bottom-right
    corner (query i sees keys 0..start+i), which SDPA takes as ``causal_lower_right`` with no mask
    tensor: its flash kernel on a GPU (GQA without expanding the keys), instead of a masked kernel
    streaming the whole buffer. The same function; the caller vouches for the positions (every row
    at ``start``: reading them here would sync the device); the shapes are checked.
    """
    T, used = q.shape[2], start + q.shape[2]
    if start < 1 or positions.shape[1] != T or keys.shape[2] < used or values.shape[2] < used:
        raise ValueError(
            f"the continuing form needs start >= 1 cached tokens and a key buffer of at least start + T = {used} "
            f"(start={start}, T={T}, {keys.shape[2]} keys, positions {tuple(positions.shape)}); "
            "use attend_causal for a fresh prompt and attend_ref when rows differ"
        )
    # imported here: torch.nn.attention.bias imports torch._dynamo, which imports triton, and a notebook
    # must be able to import labkit before it chooses Triton's interpreter (TRITON_INTERPRET)
    from torch.nn.attention.bias import causal_lower_right

    return F.scaled_dot_product_attention(
        q, keys[:, :, :used], values[:, :, :used], attn_mask=causal_lower_right(T, used),
        scale=q.shape[-1] ** -0.5, enable_gqa=True,
    )


def store_kv_ref(keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """The KV cache write: the new tokens' ``k``, ``v`` [B, T, nkv, hd] into ``keys``, ``values``
    [B, nkv, L, hd] at ``positions`` [B, T] (in place; rows may differ). Returns the key positions
    [B, L] the attention core reads (each slot's own position)."""
    B = k.shape[0]
    rows = torch.arange(B, device=k.device)[:, None]
    keys[rows, :, positions] = k
    values[rows, :, positions] = v
    return torch.arange(keys.shape[2], device=k.device).expand(B, -1)


def store_kv_slice(keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor, *, start: int, key_positions: torch.Tensor) -> torch.Tensor:
    """:func:`store_kv_ref` for T new tokens that every row writes at positions start..start+T-1 (a
    prefill into a fresh cache, start 0, or after ``start`` cached tokens in every row): two slice
    copies instead of advanced indexing (an index_put, with a copy of its values first, per tensor).
    ``key_positions`` [B, >= L] (slot positions, 0, 1, ...) is made once by the caller for every
    layer; its first L columns are returned, as the reference makes them. The caller vouches for
    the positions (reading them here would sync the device); the shapes are checked."""
    T = k.shape[1]
    if start < 0 or keys.shape[2] < start + T or key_positions.shape[-1] < keys.shape[2]:
        raise ValueError(
            f"the slice write needs start >= 0 and a key buffer of at least start + T = {start + T} slots, and key "
            f"positions for all of them (start={start}, {keys.shape[2]} slots, {key_positions.shape[-1]} positions); "
            "use store_kv_ref when rows differ"
        )
    keys[:, :, start:start + T].copy_(k.transpose(1, 2))
    values[:, :, start:start + T].copy_(v.transpose(1, 2))
    return key_positions[:, :keys.shape[2]]


def attention_inputs_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
    positions: torch.Tensor, inv_freq: torch.Tensor, eps: float, unit_offset: bool, keys: torch.Tensor,
    values: torch.Tensor, *, norm_rope: Callable[..., torch.Tensor] | None = None,
    store_kv: Callable[..., torch.Tensor] = store_kv_ref,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention's inputs into a cache: q and k [B, T, heads, hd] of the projection normed and
    rotated (``norm_rope``, :func:`norm_rope_ref`), then k and v written into ``keys``, ``values``
    at ``positions`` (``store_kv``, :func:`store_kv_ref`). Returns (q, the key positions [B, L])."""
    norm_rope = norm_rope or norm_rope_ref
    q = norm_rope(q, q_norm_weight, positions, inv_freq, eps, unit_offset)
    k = norm_rope(k, k_norm_weight, positions, inv_freq, eps, unit_offset)
    return q, store_kv(keys, values, k, v, positions)


def output_gate_ref(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Attention's output gate (Qwen3.5): o * sigmoid(gate), both [B, T, nh, hd], in their dtype
    (sigmoid's result rounded to it before the product, as torch's ops on the dtype do)."""
    return o * torch.sigmoid(gate)


def project_ref(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """A block's output projection, x @ weight^T, added to the residual stream when ``residual`` is
    given (residual + F.linear(x, weight): the projection rounded to the dtype, then the sum)."""
    y = F.linear(x, weight)
    return y if residual is None else residual + y


DeltaRule = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # delta_rule_ref's signature
Attend = Callable[..., torch.Tensor]  # attend_ref's signature
Conv = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # causal_conv_ref's signature


@dataclass(frozen=True)
class MixerCores:
    """The inner computations of the blocks, replaceable by other implementations of the same function.

    ``delta_rule(q, k, v, g, beta, state) -> (o, final state)`` as :func:`~labkit.ops.delta_rule.delta_rule_ref`
    (an implementation may return ``state`` itself, updated in place); ``attend`` as :func:`attend_ref`;
    ``gdn_inputs`` as :func:`gdn_inputs_ref` (it may return q, k, v in the projection's dtype: the
    delta rule takes them in that dtype); ``gated_norm`` as
    :func:`~labkit.ops.norm.gated_rms_norm_ref`; ``short_conv`` as :func:`short_conv_ref`;
    ``rms_norm`` as :func:`~labkit.ops.norm.rms_norm_ref` (the blocks' and the final norm);
    ``swiglu`` as :func:`swiglu_ref` (the MLP's activation); ``gate_up(x, weight)`` as
    ``swiglu(F.linear(x, weight))`` (the MLP's input projection and activation together; None
    composes those two); ``norm_rope`` as :func:`norm_rope_ref`
    (attention's q and k before the core); ``store_kv`` as :func:`store_kv_ref` (attention's cache
    write); ``attention_inputs`` as :func:`attention_inputs_ref` (``norm_rope`` of q and k, then
    ``store_kv``, in one call; None composes those two); ``output_gate`` as :func:`output_gate_ref`;
    ``project`` as :func:`project_ref` (the mixers' and the MLP's output projections, with the
    residual add: an implementation may update ``residual`` in place and return it); ``conv(x, weight, state) -> (y, new state)`` as
    :func:`~labkit.ops.causal_conv.causal_conv_ref`, the depthwise causal conv inside the reference
    ``short_conv`` and ``gdn_inputs`` (the prefix cache wraps it to read the conv windows at block
    boundaries; left out, those two references use it).
    """

    delta_rule: DeltaRule = delta_rule_ref
    attend: Attend = attend_ref
    gdn_inputs: Callable[..., tuple] = None  # type: ignore[assignment]  # gdn_inputs_ref, set below
    gated_norm: Callable[..., torch.Tensor] = gated_rms_norm_ref
    short_conv: Callable[..., tuple] = None  # type: ignore[assignment]  # short_conv_ref, set below
    rms_norm: Callable[..., torch.Tensor] = rms_norm_ref
    swiglu: Callable[..., torch.Tensor] = None  # type: ignore[assignment]  # swiglu_ref, set below
    norm_rope: Callable[..., torch.Tensor] = None  # type: ignore[assignment]  # norm_rope_ref, set below
    conv: Conv = causal_conv_ref
    store_kv: Callable[..., torch.Tensor] = store_kv_ref
    output_gate: Callable[..., torch.Tensor] = output_gate_ref
    project: Callable[..., torch.Tensor] = project_ref
    attention_inputs: Callable[..., tuple] | None = None  # None: norm_rope twice, then store_kv
    gate_up: Callable[..., torch.Tensor] | None = None  # None: F.linear, then swiglu

    def __post_init__(self) -> None:
        # the references are defined below this class: fill them in where left out
        if self.gdn_inputs is None:
            object.__setattr__(self, "gdn_inputs", gdn_inputs_ref if self.conv is causal_conv_ref
                               else partial(gdn_inputs_ref, conv=self.conv))
        if self.short_conv is None:
            object.__setattr__(self, "short_conv", short_conv_ref if self.conv is causal_conv_ref
                               else partial(short_conv_ref, conv=self.conv))
        if self.swiglu is None:
            object.__setattr__(self, "swiglu", swiglu_ref)
        if self.norm_rope is None:
            object.__setattr__(self, "norm_rope", norm_rope_ref)


def norm_rope_ref(
    x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, eps: float,
    unit_offset: bool,
) -> torch.Tensor:
    """Attention's q or k before the core: rope(rmsnorm(x)) per head, x [B, T, H, hd] (the norm's
    result in x's dtype, then rotated at ``positions`` [B, T])."""
    return rope_ref(rms_norm_ref(x, weight, eps, unit_offset), positions, inv_freq)


def swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's activation: silu(gate) * up for ``gate_up`` [..., 2W] = gate | up, in its dtype
    (silu's result rounded to it before the product, as torch's ops on the dtype do)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def short_conv_input(proj: torch.Tensor) -> torch.Tensor:
    """The input of LFM2's short conv, B * x, in proj's dtype (``proj`` [..., 3H] = B | C | x)."""
    b, _, x = proj.chunk(3, dim=-1)
    return b * x


def short_conv_ref(
    proj: torch.Tensor, state: torch.Tensor | None, weight: torch.Tensor, conv: Conv = causal_conv_ref
) -> tuple[torch.Tensor, torch.Tensor]:
    """LFM2's gated short conv: (y [B, T, H] in proj's dtype, new state [B, K-1, H]).

    ``proj`` [B, T, 3H]; ``state`` [B, K-1, H] (None: zeros) is not modified; ``weight`` [H, K].
    """
    c = proj.chunk(3, dim=-1)[1]
    y, new_state = conv(short_conv_input(proj), weight, state)
    return (c.float() * y).to(proj.dtype), new_state


def gdn_inputs_ref(
    proj: torch.Tensor,
    conv_state: torch.Tensor | None,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    dims: GdnDims,
    conv: Conv = causal_conv_ref,
) -> tuple[torch.Tensor, ...]:
    """What the delta rule takes, from the projection: (q, k [B, T, nk, dk] and v [B, T, nv, dv] in
    float32, g and beta [B, T, nv] float32, z [B, T, nv, dv] (a view of ``proj``), new conv state).
    ``conv_state`` [B, KW-1, C] (None: zeros) is not modified."""
    B, T, _ = proj.shape
    nk, nv, dk, dv = dims.num_k_heads, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim
    qkv, z, b, a = proj.split(dims.proj_sizes, dim=-1)
    qkv, new_conv_state = conv(qkv, conv_weight, conv_state)
    qkv = F.silu(qkv)
    q, k, v = qkv.split([dims.key_dim, dims.key_dim, dims.value_dim], dim=-1)
    q = l2_norm_ref(q.reshape(B, T, nk, dk))
    k = l2_norm_ref(k.reshape(B, T, nk, dk))
    v = v.reshape(B, T, nv, dv)
    beta = torch.sigmoid(b.float())
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return q, k, v, g, beta, z.reshape(B, T, nv, dv), new_conv_state


def gated_deltanet_ref(
    proj: torch.Tensor,
    conv_state: torch.Tensor | None,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    norm_weight: torch.Tensor,
    state: torch.Tensor | None,
    dims: GdnDims,
    eps: float,
    delta_rule: DeltaRule = delta_rule_ref,
    cores: "MixerCores | None" = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gated DeltaNet after in_proj: (y [B, T, nv*dv] in proj's dtype, new conv state, new float32 state).

    ``proj`` [B, T, P]; ``conv_state`` [B, KW-1, C] and ``state`` [B, nv, dk, dv] (None: zeros) are
    not modified by the reference ``delta_rule`` (another one may update ``state`` in place and
    return it). ``cores``: other implementations of the inputs, the delta rule and the gated norm
    (its delta rule overrides ``delta_rule``).
    """
    B, T, _ = proj.shape
    if cores is None:
        cores = MixerCores(delta_rule=delta_rule)
    q, k, v, g, beta, z, new_conv_state = cores.gdn_inputs(proj, conv_state, conv_weight, A_log, dt_bias, dims)
    o, new_state = cores.delta_rule(q, k, v, g, beta, state)
    o = cores.gated_norm(o, z, norm_weight, eps)
    return o.reshape(B, T, dims.value_dim).to(proj.dtype), new_conv_state, new_state


def attention_ref(
    proj: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    keys: torch.Tensor | None,
    values: torch.Tensor | None,
    positions: torch.Tensor,
    dims: AttentionDims,
    eps: float,
    unit_offset: bool,
    attend: Attend = attend_ref,
    norm_rope: Callable[..., torch.Tensor] | None = None,
    store_kv: Callable[..., torch.Tensor] = store_kv_ref,
    output_gate: Callable[..., torch.Tensor] = output_gate_ref,
    inputs: Callable[..., tuple] | None = None,
) -> torch.Tensor:
    """Attention after the qkv projection: y [B, T, nh*hd] in proj's dtype.

    ``positions`` [B, T] (integer) are the new tokens' positions; sequences may differ. ``keys``,
    ``values`` [B, nkv, L, hd] hold each sequence's earlier tokens at their positions below L; the
    new k, v are written into them (in place, by ``store_kv``) and a query at position p sees every
    key at a position <= p. Without a cache (None), the T tokens attend among themselves. With a
    cache, ``inputs`` (as :func:`attention_inputs_ref`, which ``norm_rope`` and ``store_kv`` make
    where it is left out) norms and rotates q and k and writes the cache.
    """
    B, T, _ = proj.shape
    nh, nkv, hd = dims.num_heads, dims.num_kv_heads, dims.head_dim
    parts = proj.split(dims.proj_sizes, dim=-1)
    norm_rope = norm_rope or norm_rope_ref
    q, k = parts[0].reshape(B, T, nh, hd), parts[1].reshape(B, T, nkv, hd)
    v = parts[2].reshape(B, T, nkv, hd)
    if keys is None:
        q = norm_rope(q, q_norm_weight, positions, inv_freq, eps, unit_offset)
        k = norm_rope(k, k_norm_weight, positions, inv_freq, eps, unit_offset)
        keys, values, key_pos = k.transpose(1, 2), v.transpose(1, 2), positions
    else:
        inputs = inputs or partial(attention_inputs_ref, norm_rope=norm_rope, store_kv=store_kv)
        q, key_pos = inputs(q, k, v, q_norm_weight, k_norm_weight, positions, inv_freq, eps, unit_offset, keys, values)
    out = attend(q.transpose(1, 2), keys, values, positions, key_pos).transpose(1, 2)  # [B, T, nh, hd]
    if dims.output_gate:
        out = output_gate(out, parts[3].reshape(B, T, nh, hd))
    return out.reshape(B, T, nh * hd)


REFERENCE_CORES = MixerCores()
