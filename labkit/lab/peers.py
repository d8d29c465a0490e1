"""Peers measured in the same run as labkit: transformers' own models of the same weights."""

from __future__ import annotations

import logging

import torch

from ..checkpoint import hf_state_dict
from ..config import to_hf
from ..model import HybridLM


class _ReferenceFallbackNotice(logging.Filter):
    """transformers warns, on stderr, when an op runs its PyTorch reference because flash-linear-attention
    or causal-conv1d is not installed. That is the peer as labkit measures and describes it (the README,
    notebook 01), so the notice is dropped; every other message of that logger still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is falling back to its reference PyTorch implementation" not in record.getMessage()


def _quiet_reference_fallbacks() -> None:
    log = logging.getLogger("transformers.integrations.hub_kernels")
    if not any(isinstance(f, _ReferenceFallbackNotice) for f in log.filters):
        log.addFilter(_ReferenceFallbackNotice())


def transformers_twin(model: HybridLM, attn_implementation: str = "sdpa"):
    """transformers' Lfm2ForCausalLM / Qwen3_5ForCausalLM holding exactly ``model``'s weights."""
    import transformers

    _quiet_reference_fallbacks()

    hf_cfg = to_hf(model.cfg)
    arch = hf_cfg.pop("architectures")[0]
    model_type = hf_cfg.pop("model_type")
    config_cls = transformers.Lfm2Config if model_type == "lfm2" else transformers.Qwen3_5TextConfig
    config = config_cls(**hf_cfg)
    config._attn_implementation = attn_implementation
    with torch.device("meta"):
        twin = getattr(transformers, arch)(config)
    twin = twin.to(model.dtype).to_empty(device=model.device)
    state = hf_state_dict(model, device=None)
    missing, unexpected = twin.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if model.cfg.tie_embeddings else set()
    # non-persistent buffers (rotary inv_freq) are recomputed below, not loaded
    if set(missing) - allowed_missing or unexpected:
        raise RuntimeError(f"transformers twin: missing {missing}, unexpected {unexpected}")
    if model.cfg.tie_embeddings:
        twin.tie_weights()
    for module in twin.modules():  # rotary buffers were left empty by to_empty
        if hasattr(module, "inv_freq") and hasattr(module, "compute_default_rope_parameters"):
            inv, _ = module.compute_default_rope_parameters(module.config, model.device)
            module.inv_freq = inv.to(model.device)
            if hasattr(module, "original_inv_freq"):
                module.original_inv_freq = module.inv_freq.clone()
    return twin.eval().requires_grad_(False)
