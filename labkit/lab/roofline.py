"""Bytes and FLOPs of one decode step, per layer type, and the speed limit they imply.

At batch B and context length L (tokens already cached), one decode step must at least:

- read every weight once (shared by the whole batch); the embedding table is *not* read, only B of
  its rows, except where it doubles as the lm_head (tied), when it is read in full once;
- per sequence and attention layer, read L cached keys and values and write one new pair;
- per sequence and Gated DeltaNet layer, read and write its float32 state [v_heads, dk, dv];
- per sequence and conv/GDN layer, read and write the K-1 rows of its conv window.

Everything else (activations) is a few KB and is ignored. The time floor is bytes / bandwidth;
tokens/s at the floor is B / that time. FLOPs are 2 per weight per sequence, plus attention's
4 * L * heads * head_dim and the delta rule's ~6 * dk * dv per head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..model import HybridLM


@dataclass(frozen=True)
class LayerCost:
    kind: str  # "attention", "conv", "gdn", "embedding", "lm_head"
    count: int  # layers of this kind
    params: int  # parameters in all layers of this kind (mixer + mlp + norms)
    weight_bytes: int  # bytes of those parameters
    state_bytes_per_seq: int  # cache bytes each sequence reads + writes per step (at the given L)
    flops_per_seq: int


def _meta_model(cfg: ModelConfig) -> HybridLM:
    with torch.device("meta"):
        return HybridLM(cfg)


def layer_costs(cfg: ModelConfig, context: int, dtype_bytes: int = 2) -> list[LayerCost]:
    """Costs of one decode step per layer kind, for a context of ``context`` cached tokens."""
    model = _meta_model(cfg)
    per_kind: dict[str, list[int]] = {}
    for block in model.layers:
        n = sum(p.numel() for p in block.parameters())
        per_kind.setdefault(block.kind, []).append(n)
    out = []
    for kind, counts in per_kind.items():
        params = sum(counts)
        if kind == "attention":
            kv = 2 * cfg.kv_size * dtype_bytes
            state = kv * (context + 1)  # read L pairs, write one
            attn_flops = 4 * (context + 1) * cfg.num_heads * cfg.head_dim
        elif kind == "conv":
            state = 2 * (cfg.conv_kernel - 1) * cfg.hidden_size * dtype_bytes
            attn_flops = 2 * cfg.conv_kernel * cfg.hidden_size
        else:  # gdn
            state = 2 * cfg.gdn_num_v_heads * cfg.gdn_k_head_dim * cfg.gdn_v_head_dim * 4
            state += 2 * (cfg.gdn_conv_kernel - 1) * cfg.gdn_conv_dim * dtype_bytes
            attn_flops = 6 * cfg.gdn_num_v_heads * cfg.gdn_k_head_dim * cfg.gdn_v_head_dim
        out.append(
            LayerCost(
                kind=kind,
                count=len(counts),
                params=params,
                weight_bytes=params * dtype_bytes,
                state_bytes_per_seq=state * len(counts),
                flops_per_seq=2 * params + attn_flops * len(counts),
            )
        )
    vh = cfg.vocab_size * cfg.hidden_size
    out.append(LayerCost("embedding", 1, vh, 0, cfg.hidden_size * dtype_bytes, 0))
    # The head reads the whole table (tied or not) and the final norm's weight.
    head_params = (0 if cfg.tie_embeddings else vh) + cfg.hidden_size
    out.append(LayerCost("lm_head", 1, head_params, (vh + cfg.hidden_size) * dtype_bytes, 0, 2 * vh))
    return out


@dataclass(frozen=True)
class StepCost:
    batch: int
    context: int
    weight_bytes: int
    state_bytes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.state_bytes

    def time_floor_s(self, bytes_per_s: float) -> float:
        return self.bytes / bytes_per_s

    def tokens_per_s_limit(self, bytes_per_s: float) -> float:
        return self.batch / self.time_floor_s(bytes_per_s)

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes


def step_cost(cfg: ModelConfig, batch: int = 1, context: int = 0, dtype_bytes: int = 2) -> StepCost:
    costs = layer_costs(cfg, context, dtype_bytes)
    return StepCost(
        batch=batch,
        context=context,
        weight_bytes=sum(c.weight_bytes for c in costs),
        state_bytes=batch * sum(c.state_bytes_per_seq for c in costs),
        flops=batch * sum(c.flops_per_seq for c in costs),
    )


def cache_buffer_bytes(cfg: ModelConfig, max_len: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Bytes one sequence holds in labkit's real cache (:class:`labkit.cache.HybridCache`, built on
    the meta device, so nothing is allocated), per kind: "kv" (keys and values of ``max_len``
    positions), "conv" (the conv windows of short-conv and GDN layers), "gdn" (the recurrent states).
    A check on :func:`layer_costs`: a step reads and writes each fixed buffer once."""
    from ..cache import HybridCache

    cache = HybridCache(cfg, 1, max_len, dtype, "meta")

    def total(buffers) -> int:
        return sum(b.numel() * b.element_size() for b in buffers)

    return {"kv": total([*cache.keys.values(), *cache.values.values()]),
            "conv": total(cache.conv_states.values()),
            "gdn": total(cache.recurrent_states.values())}


@dataclass(frozen=True)
class PublishedDecoder:
    """A published decode result, quoted as a fraction of the memory bandwidth it reached."""

    what: str
    gpu: str
    fraction_of_bandwidth: float
    source: str


# What hand-written decoders of small models reach (the target the notebooks measure against).
PUBLISHED_DECODERS = (
    PublishedDecoder("HazyResearch's Llama-3.2-1B megakernel, batch-1 decode", "H100", 0.78,
                     "HazyResearch, 'Look Ma, No Bubbles! Designing a Low-Latency Megakernel for Llama-1B' (2025)"),
)
