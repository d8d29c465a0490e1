"""The step plan: what one fused decode step reads, typed, built once from the model's modules.

Every rung that runs the fused decode ops (``fused``, ``fused+graph``, ``fused+graph+pdl``, and the
persistent kernel to come) builds a :class:`StepPlan` with :func:`build_step_plan`: the weights each
kernel reads (a renamed or missing parameter fails here, naming the layer and the attribute), the
tuned kernel settings of each linear, and every activation buffer, allocated once so that a step
allocates nothing and can be captured in a CUDA graph (which binds these very tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
from torch import nn

from .. import tuning
from ..cache import HybridCache
from ..model import HybridLM, attention_dims, gdn_dims
from ..tuning import linear_config as tuned_linear_config

@dataclass(frozen=True)
class LinearPlan:
    weight: torch.Tensor
    config: Any  # LinearConfig
    norm_weight: torch.Tensor | None = None  # RMSNorm in the prologue
    row_blocks: int = 1  # 2: SwiGLU's gate|up, 3: the short conv's B|C|x
    impl: str = "triton"  # "torch": unfused through cuBLAS, where the tuning file measured that faster

    @property
    def outputs(self) -> int:
        return self.weight.shape[0] // self.row_blocks


@dataclass(frozen=True)
class MlpPlan:
    gate_up: LinearPlan  # mlp norm + gate|up, SwiGLU in the epilogue
    down: LinearPlan  # + residual


@dataclass(frozen=True)
class ConvLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + B|C|x, the short conv and its state shift in the epilogue
    conv_weight: torch.Tensor
    out_proj: LinearPlan
    mlp: MlpPlan


@dataclass(frozen=True)
class AttentionLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + the model's wqkv: q|k|v(|gate)
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    inv_freq: torch.Tensor
    out_proj: LinearPlan  # the model's wo
    mlp: MlpPlan


@dataclass(frozen=True)
class GdnLayerPlan:
    index: int
    in_proj: LinearPlan  # mixer norm + q|k|v|z|b|a
    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    out_proj: LinearPlan
    mlp: MlpPlan


LayerPlan = Union[ConvLayerPlan, AttentionLayerPlan, GdnLayerPlan]


@dataclass
class StepPlan:
    """Everything a decode step touches besides the cache; a captured graph holds these very tensors."""

    embed: torch.Tensor
    layers: list[LayerPlan]
    head: LinearPlan  # final norm + LM head -> logits
    greedy: LinearPlan  # the same, argmax only
    eps: float
    unit_offset: bool
    # static buffers: one per distinct shape, reused by every layer
    tokens: torch.Tensor
    h: torch.Tensor
    act: torch.Tensor
    logits: torch.Tensor
    next_tokens: torch.Tensor
    proj: dict[str, torch.Tensor]  # per mixer kind (the conv's projection never leaves its kernel)
    mixed: dict[str, torch.Tensor]
    linear_ws: Any  # LinearWorkspace
    head_buffers: Any  # GreedyHeadBuffers
    attn_dims: Any = None
    attn_ws: Any = None
    gdn_dims: Any = None
    gdn_ws: Any = None
    placement: Any = None  # PdlPlacement of the linear kernels (tuning.pdl_placement)
    attn_args: Any = None  # attention_decode's tuned keywords (chunk, release_early)
    gdn_args: Any = None  # gdn_decode's tuned keywords (block_v, release_early)

    def activations(self) -> list[torch.Tensor]:
        """The buffers a step writes before reading (tests poison them)."""
        return [self.h, self.act, self.logits, *self.proj.values(), *self.mixed.values()]


def _tensor(owner: nn.Module, path: str, where: str) -> torch.Tensor:
    obj: Any = owner
    for part in path.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor):
        found = "missing" if obj is None else f"a {type(obj).__name__}, not a tensor"
        raise ValueError(f"{where}: the fused backend reads `{path}`, which is {found} (renamed or deleted?)")
    return obj


def _layer_plan(i: int, kind: str, block: nn.Module, plan: Callable[..., LinearPlan]) -> LayerPlan:
    where = f"model.layers[{i}] ({kind} block)"

    def get(path: str) -> torch.Tensor:
        return _tensor(block, path, where)

    norm = get("mixer_norm.weight")
    mlp = MlpPlan(plan(get("mlp.gate_up"), get("mlp_norm.weight"), row_blocks=2), plan(get("mlp.down")))
    if kind == "conv":
        return ConvLayerPlan(i, plan(get("mixer.in_proj"), norm, row_blocks=3), get("mixer.conv_weight"),
                             plan(get("mixer.out_proj")), mlp)
    if kind == "attention":
        return AttentionLayerPlan(i, plan(get("mixer.wqkv"), norm), get("mixer.q_norm.weight"),
                                  get("mixer.k_norm.weight"), get("mixer.inv_freq"), plan(get("mixer.wo")), mlp)
    if kind == "gdn":
        return GdnLayerPlan(i, plan(get("mixer.in_proj"), norm), get("mixer.conv_weight"), get("mixer.A_log"),
                            get("mixer.dt_bias"), get("mixer.norm_weight"), plan(get("mixer.out_proj")), mlp)
    raise TypeError(f"{where}: no fused kernels for a {kind!r} mixer")




def build_step_plan(model: HybridLM, cache: HybridCache) -> StepPlan:
    """The plan of one decode step of ``model`` over ``cache``: its weights, each linear's tuned
    settings at the cache's batch, and buffers for that batch (the attention workspace sized for the
    cache's ``max_len``). Needs the Triton ops (a fused rung loads them first, with a clear error)."""
    from ..ops import attention_decode, gated_delta_decode, greedy_head, linear as lin

    cfg = model.cfg
    B, H, dt, dev = cache.batch_size, cfg.hidden_size, model.dtype, model.device

    def plan(weight: torch.Tensor, norm: torch.Tensor | None = None, row_blocks: int = 1,
             argmax: bool = False, head: bool = False) -> LinearPlan:
        n, k = weight.shape
        config = tuned_linear_config(B, n // row_blocks, k, row_blocks=row_blocks, argmax=argmax, device=dev)
        # the LM head stays on the Triton kernel: its greedy path must sum as its logits path does
        impl = "triton" if head else tuning.linear_impl(B, n // row_blocks, k, row_blocks=row_blocks, device=dev)
        return LinearPlan(weight, config, norm, row_blocks, impl)

    layers = [_layer_plan(i, kind, block, plan) for i, (kind, block) in enumerate(zip(cfg.layer_types, model.layers))]
    embed = _tensor(model, "embed.weight", "model")
    final_norm = _tensor(model, "final_norm.weight", "model")
    lm_head = embed if cfg.tie_embeddings else _tensor(model, "lm_head", "model")
    head, greedy = plan(lm_head, final_norm, head=True), plan(lm_head, final_norm, argmax=True, head=True)

    proj: dict[str, torch.Tensor] = {}
    mixed: dict[str, torch.Tensor] = {}
    for layer in layers:
        kind = cfg.layer_types[layer.index]
        if kind not in mixed:
            mixed[kind] = torch.empty(B, layer.out_proj.weight.shape[1], dtype=dt, device=dev)
            if not isinstance(layer, ConvLayerPlan):
                proj[kind] = torch.empty(B, layer.in_proj.weight.shape[0], dtype=dt, device=dev)

    need_p = need_c = 0
    for p in [head, greedy, *(q for x in layers for q in (x.in_proj, x.out_proj, x.mlp.gate_up, x.mlp.down))]:
        np_, nc = lin.LinearWorkspace.needed(B, p.outputs, p.config, p.row_blocks)
        need_p, need_c = max(need_p, np_), max(need_c, nc)

    step = StepPlan(
        embed=embed, layers=layers, head=head, greedy=greedy, eps=cfg.norm_eps, unit_offset=cfg.norm_unit_offset,
        tokens=torch.zeros(B, dtype=torch.long, device=dev),
        h=torch.empty(B, H, dtype=dt, device=dev),
        act=torch.empty(B, cfg.intermediate_size, dtype=dt, device=dev),
        logits=torch.empty(B, cfg.vocab_size, dtype=dt, device=dev),
        next_tokens=torch.empty(B, dtype=torch.long, device=dev),
        proj=proj, mixed=mixed,
        linear_ws=lin.LinearWorkspace.allocate(need_p, need_c, dev),
        head_buffers=greedy_head.GreedyHeadBuffers.allocate(B, cfg.vocab_size, greedy.config, dev),
        placement=tuning.pdl_placement(dev),
    )
    if "attention" in cfg.layer_types:
        step.attn_dims = attention_dims(cfg)
        tuned = tuning.settings("attention_decode", dev)
        chunk, _ = attention_decode.attention_chunk(cache.max_len, cfg.head_dim, min_chunk=tuned["min_chunk"],
                                                    max_chunks=tuned["max_chunks"])
        step.attn_args = dict(chunk=chunk, release_early=tuned["release_early"])
        step.attn_ws = attention_decode.AttentionWorkspace.allocate(B, step.attn_dims, -(-cache.max_len // chunk), dev)
    if "gdn" in cfg.layer_types:
        step.gdn_dims = gdn_dims(cfg)
        step.gdn_ws = gated_delta_decode.GdnWorkspace.allocate(B, step.gdn_dims, dev)
        tuned = tuning.settings("gated_delta_decode", dev)
        block_v = gated_delta_decode.gdn_block_v(B, step.gdn_dims, block_v=tuned["block_v"],
                                                 narrow_block_v=tuned["narrow_block_v"],
                                                 programs_per_sm=tuned["programs_per_sm"])
        step.gdn_args = dict(block_v=block_v, release_early=tuned["release_early"])
    return step

