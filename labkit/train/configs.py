"""The byte-vocabulary model configurations the training script makes, one per family and size."""

from __future__ import annotations

from ..config import ModelConfig
from ..tokenizer import ByteTokenizer

FAMILIES = ("lfm2", "qwen3.5")
SIZES = ("6m", "tiny")


def byte_config(family: str, size: str = "6m") -> ModelConfig:
    """A byte-vocabulary model of ``family`` ("lfm2" or "qwen3.5") with the family's structure.

    "6m": hidden 256, 8 layers, SwiGLU width 768, head dims 64 (multiples of 64 throughout).
      LFM2: short conv at layers 0,1,3,4,6 and GQA attention (4 q heads, 2 kv heads, q/k RMSNorm,
      full RoPE) at 2,5,7, like LFM2-350M's conv-first pattern with attention growing denser.
      Qwen3.5: 3 Gated DeltaNet layers then 1 attention, twice; attention with 4 q heads of 64, 2 kv
      heads, q/k norm, a sigmoid output gate and RoPE on a quarter of each head (16 channels);
      Gated DeltaNet with 2 key heads and 4 value heads of 64 (each key head shared by two value
      heads, as in the larger Qwen3.5 models), conv kernel 4.
    "tiny": the same patterns at hidden 64 for CPU tests.
    """
    tok = ByteTokenizer()
    common = dict(
        vocab_size=tok.vocab_size,
        tie_embeddings=True,
        bos_token_id=tok.BOS,
        eos_token_id=tok.EOS,
        pad_token_id=tok.PAD,
        max_position_embeddings=4096,
    )
    if size == "6m":
        dims = dict(hidden_size=256, intermediate_size=768, num_heads=4, num_kv_heads=2, head_dim=64)
        lfm2_layers = ("conv", "conv", "attention", "conv", "conv", "attention", "conv", "attention")
        qwen_layers = ("gdn", "gdn", "gdn", "attention") * 2
        gdn = dict(gdn_num_k_heads=2, gdn_num_v_heads=4, gdn_k_head_dim=64, gdn_v_head_dim=64)
    elif size == "tiny":
        dims = dict(hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32)
        lfm2_layers = ("conv", "attention", "conv")
        qwen_layers = ("gdn", "gdn", "attention")
        gdn = dict(gdn_num_k_heads=1, gdn_num_v_heads=2, gdn_k_head_dim=32, gdn_v_head_dim=32)
    else:
        raise ValueError(f"unknown size {size!r}; sizes: {', '.join(map(repr, SIZES))}")
    if family == "lfm2":
        return ModelConfig(
            family="lfm2",
            name=f"byte-lfm2-{size}",
            layer_types=lfm2_layers,
            norm_eps=1e-5,
            norm_unit_offset=False,
            rope_theta=1e6,
            rotary_dim=dims["head_dim"],
            conv_kernel=3,
            **dims,
            **common,
        )
    if family == "qwen3.5":
        return ModelConfig(
            family="qwen3.5",
            name=f"byte-qwen3.5-{size}",
            layer_types=qwen_layers,
            norm_eps=1e-6,
            norm_unit_offset=True,
            rope_theta=1e7,
            rotary_dim=dims["head_dim"] // 4,
            attn_output_gate=True,
            gdn_conv_kernel=4,
            **gdn,
            **dims,
            **common,
        )
    raise ValueError(f"unknown family {family!r}; families: {', '.join(map(repr, FAMILIES))}")
