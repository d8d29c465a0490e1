"""The reference hybrid decoder, in plain PyTorch.

One module tree serves both families. A block is

    h = h + mixer(norm(h))        mixer: Attention | ShortConv | GatedDeltaNet
    h = h + mlp(norm(h))          mlp:   SwiGLU

and the model is embed -> blocks -> final norm -> lm_head (tied to the embedding when the
config says so). Weights that one decode step reads together are stored together, so that a
fused kernel later streams one matrix per step: q|k|v(|gate) for attention, B|C|x for the short
conv, q|k|v|z|b|a for Gated DeltaNet, gate|up for the MLP. The reference forward still computes
every piece in plain torch; it is the function every faster backend must reproduce. Each mixer is
``in_proj -> labkit.ops.mixers.<mixer>_ref -> out_proj``: the maths between the projections is
stated once there, and the decode kernels are tested against the same functions. A faster prefill
runs this same forward with other implementations of the mixers' inner cores (``cores``, a
:class:`labkit.ops.mixers.MixerCores`: the delta rule, the attention core, the element-wise chains,
the output projections with their residual add). The residual add is the output projection's:
each mixer and the MLP take the residual stream ``residual`` and return ``residual + out_proj(y)``
through ``cores.project`` (:func:`labkit.ops.mixers.project_ref`; without ``residual``, the
projection alone), so that a faster core can add it inside the GEMM.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .cache import Attachments, HybridCache
from .config import ModelConfig
from .ops.mixers import (
    REFERENCE_CORES,
    AttentionDims,
    GdnDims,
    MixerCores,
    attention_ref,
    gated_deltanet_ref,
    project_ref,
    swiglu_ref,
)
from .ops.norm import rms_norm_ref
from .ops.rope import rope_inv_freq


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor, norm=rms_norm_ref) -> torch.Tensor:
        """``norm``: an implementation of :func:`~labkit.ops.norm.rms_norm_ref` (a core)."""
        return norm(x, self.weight, self.eps, self.unit_offset)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}, unit_offset={self.unit_offset}"


class SwiGLU(nn.Module):
    """down(silu(x W_gate^T) * (x W_up^T)); ``gate_up`` stacks W_gate over W_up."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.gate_up = nn.Parameter(torch.empty(2 * width, hidden))
        self.down = nn.Parameter(torch.empty(hidden, width))

    def forward(self, x: torch.Tensor, activation=swiglu_ref, residual: torch.Tensor | None = None,
                project=project_ref, gate_up=None) -> torch.Tensor:
        """``activation``, ``project``: implementations of :func:`~labkit.ops.mixers.swiglu_ref` and
        :func:`~labkit.ops.mixers.project_ref` (cores); ``gate_up(x, weight)``: an implementation of
        ``activation(F.linear(x, weight))`` (None: those two); with ``residual``, returns residual + the MLP."""
        h = activation(F.linear(x, self.gate_up)) if gate_up is None else gate_up(x, self.gate_up)
        return project(h, self.down, residual)


def attention_dims(cfg: ModelConfig) -> AttentionDims:
    return AttentionDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.attn_output_gate)


def gdn_dims(cfg: ModelConfig) -> GdnDims:
    return GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)


class Attention(nn.Module):
    """Grouped-query attention over the static KV cache (maths: :func:`labkit.ops.mixers.attention_ref`).

    q, k get a per-head RMSNorm, then RoPE on their first ``rotary_dim`` channels. With
    ``attn_output_gate`` (Qwen3.5) the output of each head is multiplied by sigmoid(gate), a
    second projection of the input, before ``wo``.
    """

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.dims = attention_dims(cfg)
        self.wqkv = nn.Parameter(torch.empty(self.dims.proj_dim, cfg.hidden_size))
        self.wo = nn.Parameter(torch.empty(cfg.hidden_size, cfg.q_size))
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_unit_offset)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, cfg.norm_unit_offset)
        self.register_buffer("inv_freq", rope_inv_freq(cfg.rotary_dim, cfg.rope_theta), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """``nn.Module``'s conversions (``to(dtype)``, ``half()``, ``bfloat16()``, ...) for every tensor but
        the rotary frequencies, which stay float32 whatever the weights' dtype: rounded to bf16 they move
        every angle (the reference's logits drift; the fused rung refuses them). A dtype change keeps the
        very same float32 buffer (a captured graph still reads it); a move to another device makes
        them afresh there, exactly, rather than converting a rounded copy back."""
        before = self.inv_freq
        out = super()._apply(fn, recurse)
        after = self.inv_freq
        if after.dtype != torch.float32:
            self.inv_freq = before if after.device == before.device else rope_inv_freq(
                self.cfg.rotary_dim, self.cfg.rope_theta, device=after.device)
        return out

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: HybridCache | None, cores: MixerCores = REFERENCE_CORES,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        keys = values = None
        if cache is not None:  # the sequences' cached positions and the T new ones, nothing past them
            length = cache.seq_len + x.shape[1]
            keys = cache.keys[self.layer][:, :, :length]
            values = cache.values[self.layer][:, :, :length]
        out = attention_ref(
            F.linear(x, self.wqkv), self.q_norm.weight, self.k_norm.weight, self.inv_freq, keys, values,
            positions, self.dims, self.cfg.norm_eps, self.cfg.norm_unit_offset, attend=cores.attend,
            norm_rope=cores.norm_rope, store_kv=cores.store_kv, output_gate=cores.output_gate,
            inputs=cores.attention_inputs,
        )
        return cores.project(out, self.wo, residual)


class ShortConv(nn.Module):
    """LFM2's gated short convolution: out(C * conv(B * x)), with B, C, x = in_proj(input)
    (maths: :func:`labkit.ops.mixers.short_conv_ref`)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.in_proj = nn.Parameter(torch.empty(3 * cfg.hidden_size, cfg.hidden_size))
        self.conv_weight = nn.Parameter(torch.empty(cfg.hidden_size, cfg.conv_kernel))
        self.out_proj = nn.Parameter(torch.empty(cfg.hidden_size, cfg.hidden_size))

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: HybridCache | None, cores: MixerCores = REFERENCE_CORES,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        state = None if cache is None else cache.conv_states[self.layer]
        y, new_state = cores.short_conv(F.linear(x, self.in_proj), state, self.conv_weight)
        if cache is not None:
            state.copy_(new_state)  # a no-op when the core updated the cache's window in place
        return cores.project(y, self.out_proj, residual)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear-attention mixer (maths: :func:`labkit.ops.mixers.gated_deltanet_ref`).

    q|k|v go through a depthwise causal conv and SiLU; q, k are L2-normalised per head; the
    per-head gates are g = -exp(A_log) * softplus(a + dt_bias) (a log-decay, <= 0) and
    beta = sigmoid(b); the gated delta rule (see ``ops.delta_rule``) mixes the sequence; the
    output is RMS-normed per head, multiplied by silu(z), and projected back.
    """

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.dims = gdn_dims(cfg)
        nv = cfg.gdn_num_v_heads
        self.in_proj = nn.Parameter(torch.empty(self.dims.proj_dim, cfg.hidden_size))
        self.conv_weight = nn.Parameter(torch.empty(cfg.gdn_conv_dim, cfg.gdn_conv_kernel))
        self.A_log = nn.Parameter(torch.empty(nv))
        self.dt_bias = nn.Parameter(torch.empty(nv))
        self.norm_weight = nn.Parameter(torch.empty(cfg.gdn_v_head_dim))
        self.out_proj = nn.Parameter(torch.empty(cfg.hidden_size, cfg.gdn_value_dim))

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, cache: HybridCache | None, cores: MixerCores = REFERENCE_CORES,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        conv_state = None if cache is None else cache.conv_states[self.layer]
        state = None if cache is None else cache.recurrent_states[self.layer]
        y, new_conv_state, new_state = gated_deltanet_ref(
            F.linear(x, self.in_proj), conv_state, self.conv_weight, self.A_log, self.dt_bias, self.norm_weight,
            state, self.dims, self.cfg.norm_eps, cores=cores,
        )
        if cache is not None:  # each a no-op when its core updated the cache's tensor in place
            conv_state.copy_(new_conv_state)
            state.copy_(new_state)
        return cores.project(y, self.out_proj, residual)


MIXERS = {"attention": Attention, "conv": ShortConv, "gdn": GatedDeltaNet}


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.kind = cfg.layer_types[layer]
        self.mixer_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_unit_offset)
        self.mixer = MIXERS[self.kind](cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_unit_offset)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self, h: torch.Tensor, positions: torch.Tensor, cache: HybridCache | None, cores: MixerCores = REFERENCE_CORES
    ) -> torch.Tensor:
        # h + mixer(norm(h)), then h + mlp(norm(h)): the residual adds are the output projections'
        h = self.mixer(self.mixer_norm(h, cores.rms_norm), positions, cache, cores, residual=h)
        return self.mlp(self.mlp_norm(h, cores.rms_norm), cores.swiglu, residual=h, project=cores.project,
                        gate_up=cores.gate_up)


class HybridLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_unit_offset)
        if cfg.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        # What other modules build around these weights and reuse across calls (generate's pooled
        # decoders and caches, with their captured graphs; see labkit.decode.registry.pooled_decoder).
        self.attachments = Attachments()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def num_parameters(self) -> int:
        """Distinct parameters (a tied lm_head counts once)."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int = 1, max_len: int = 4096) -> HybridCache:
        return HybridCache(self.cfg, batch_size, max_len, dtype=self.dtype, device=self.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: HybridCache | None = None,
        last_only: bool = False,
        cores: MixerCores = REFERENCE_CORES,
    ) -> torch.Tensor:
        """Logits ``[B, T, vocab]`` (``[B, 1, vocab]`` with ``last_only``) for ``input_ids [B, T]``.

        With a cache, the tokens continue the cached sequences and the cache advances by T; the
        cache is checked for room before anything is written. Token ids are range-checked when
        T > 1 (a prompt); single decode tokens are not, since the check would sync the device.
        ``cores``: the implementations of the mixers' inner cores (default: the references).
        """
        self._check_input(input_ids, cache)
        return self.forward_checked(input_ids, cache, last_only, cores)

    def forward_checked(
        self,
        input_ids: torch.Tensor,
        cache: HybridCache | None = None,
        last_only: bool = False,
        cores: MixerCores = REFERENCE_CORES,
    ) -> torch.Tensor:
        """:meth:`forward` for inputs the caller has checked (``_check_input``): nothing here reads
        back to the host, so a CUDA graph can capture it (the fused prefill's graphs do)."""
        B, T = input_ids.shape
        if cache is None:
            positions = torch.arange(T, device=input_ids.device).expand(B, T)
        else:
            positions = cache.lengths[:, None].long() + torch.arange(T, device=input_ids.device)
        h = self.embed(input_ids)
        for block in self.layers:
            h = block(h, positions, cache, cores)
        if cache is not None:
            cache.advance(T)
        if last_only:
            h = h[:, -1:]
        return F.linear(self.final_norm(h, cores.rms_norm), self.lm_head_weight)

    def _check_input(self, input_ids: torch.Tensor, cache: HybridCache | None, check_ids: bool = True) -> None:
        """Raise on bad input before anything is written. ``check_ids=False``: the caller has checked
        the token ids' range already (on the host: reading them here syncs the device)."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(f"input_ids must be a [batch, tokens] tensor, got {getattr(input_ids, 'shape', input_ids)!r}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32, got {input_ids.dtype}")
        if input_ids.device != self.device:
            raise ValueError(f"input_ids are on {input_ids.device} but the model is on {self.device}")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids has no tokens")
        if check_ids and input_ids.shape[1] > 1:
            lo, hi = torch.stack(torch.aminmax(input_ids)).tolist()  # one read to the host (a sync), not two
            if lo < 0 or hi >= self.cfg.vocab_size:
                raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got [{lo}, {hi}]")
        if cache is not None:
            if cache.cfg != self.cfg:
                raise ValueError("the cache was made for another model configuration")
            if cache.device != self.device or cache.dtype != self.dtype:
                raise ValueError(
                    f"cache is {cache.dtype} on {cache.device}; the model is {self.dtype} on {self.device}"
                )
            cache.check_room(input_ids.shape[0], input_ids.shape[1])


# -- construction -----------------------------------------------------------------------------------
def empty_model(cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> HybridLM:
    """A model whose parameters are allocated on ``device`` but not initialised."""
    with torch.device("meta"):
        model = HybridLM(cfg).to(dtype)  # meta tensors change dtype without allocating
    model = model.to_empty(device=device)
    for layer in model.layers:  # rotary frequencies stay float32 whatever the weight dtype
        if isinstance(layer.mixer, Attention):
            layer.mixer.inv_freq = rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, device=device)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def init_random(model: HybridLM, seed: int = 0) -> HybridLM:
    """Fill every parameter with seeded random values of a realistic scale.

    Norm weights are drawn around their neutral value rather than set to it, so that a kernel
    that forgets a norm weight (or the Qwen3.5 ``1 + w`` offset) fails its tests.
    """
    gen = torch.Generator(device=model.device).manual_seed(seed)

    def fill(p: torch.Tensor, kind: str, fan_in: int = 1) -> None:
        r = torch.empty(p.shape, dtype=torch.float32, device=p.device)
        if kind == "normal":
            r.normal_(0.0, 0.02, generator=gen)
        elif kind == "uniform":
            bound = 1.0 / math.sqrt(fan_in)
            r.uniform_(-bound, bound, generator=gen)
        elif kind == "norm":
            r.normal_(0.0 if model.cfg.norm_unit_offset else 1.0, 0.1, generator=gen)
        elif kind == "A_log":
            r.uniform_(1.0, 16.0, generator=gen).log_()
        elif kind == "dt_bias":
            r.uniform_(-1.0, 1.0, generator=gen)
        elif kind == "gated_norm":
            r.normal_(1.0, 0.1, generator=gen)
        p.copy_(r)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "weight" and ("norm" in name):
            fill(p, "norm")
        elif leaf == "conv_weight":
            fill(p, "uniform", fan_in=p.shape[1])
        elif leaf in ("A_log", "dt_bias"):
            fill(p, leaf)
        elif leaf == "norm_weight":
            fill(p, "gated_norm")
        else:
            fill(p, "normal")
    return model


def build(
    cfg: ModelConfig | str,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> HybridLM:
    """A model of ``cfg`` (a ModelConfig or a preset name) with seeded random weights."""
    if isinstance(cfg, str):
        from .config import PRESETS

        if cfg not in PRESETS:
            raise KeyError(f"unknown preset {cfg!r}; presets: {sorted(PRESETS)}")
        cfg = PRESETS[cfg]
    return init_random(empty_model(cfg, dtype, device), seed)
