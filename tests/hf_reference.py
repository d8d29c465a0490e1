"""Tiny transformers models (the implementation nobody here wrote) for parity tests."""

from __future__ import annotations

import torch

from labkit.config import ModelConfig, to_hf


def make_hf_model(cfg: ModelConfig, seed: int = 0):
    """transformers' own model for ``cfg``, with every parameter randomised.

    transformers initialises norm weights to their neutral value (1, or 0 for Qwen3.5's 1 + w
    norms); randomising them makes the parity test catch a dropped weight or a wrong offset.
    """
    import transformers

    hf_cfg = to_hf(cfg)
    arch = hf_cfg.pop("architectures")[0]
    model_type = hf_cfg.pop("model_type")
    config_cls = transformers.Lfm2Config if model_type == "lfm2" else transformers.Qwen3_5TextConfig
    config = config_cls(**hf_cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "A_log" in name:
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


@torch.no_grad()
def hf_greedy_logits(model, input_ids: torch.Tensor, prompt_len: int) -> list[torch.Tensor]:
    """Logits of the prompt, then of each following token fed one at a time through HF's cache."""
    out = model(input_ids=input_ids[:, :prompt_len], use_cache=True)
    logits = [out.logits]
    past = out.past_key_values
    for t in range(prompt_len, input_ids.shape[1]):
        out = model(input_ids=input_ids[:, t : t + 1], past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits.append(out.logits)
    return logits
