import json

import pytest
import torch

import labkit
from labkit.config import ModelConfig, to_hf
from labkit.model import HybridLM


def _meta(cfg):
    with torch.device("meta"):
        return HybridLM(cfg)


def test_lfm2_350m_matches_the_release():
    cfg = labkit.PRESETS["lfm2-350m"]
    assert cfg.attention_layers == (2, 5, 8, 10, 12, 14)
    assert cfg.layer_types.count("conv") == 10
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (1024, 4608, 65536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta) == (16, 8, 64, 1e6)
    assert _meta(cfg).num_parameters() == 354_483_968


def test_qwen35_08b_matches_the_release():
    cfg = labkit.PRESETS["qwen3.5-0.8b"]
    assert cfg.layer_types == ("gdn", "gdn", "gdn", "attention") * 6
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim) == (8, 2, 256, 64)
    assert (cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim) == (16, 16, 128, 128)
    # 1,505 MB of bf16 weights, the figure the roofline is drawn from
    assert _meta(cfg).num_parameters() * 2 == pytest.approx(1.505e9, rel=1e-3)


# LiquidAI/LFM2-350M's config.json in the old-style keys it was released with (block_ff_dim, tie_embedding).
LFM2_350M_JSON = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": 65536, "hidden_size": 1024,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "block_ff_dim": 6656,
    "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
    "conv_L_cache": 3, "conv_bias": False, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "norm_eps": 1e-05,
    "rope_theta": 1000000.0, "tie_embedding": True, "bos_token_id": 1, "eos_token_id": 7, "pad_token_id": 0,
    "max_position_embeddings": 128000,
}


def test_from_hf_reads_the_released_lfm2_config():
    cfg = ModelConfig.from_hf(LFM2_350M_JSON)
    preset = labkit.PRESETS["lfm2-350m"]
    assert cfg.replace(name=preset.name) == preset


def test_from_hf_reads_a_multimodal_qwen35_config():
    text = to_hf(labkit.PRESETS["qwen3.5-0.8b"])
    text["rope_parameters"].update(mrope_section=[11, 11, 10], mrope_interleaved=True)
    wrapped = {"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": text, "vision_config": {}}
    cfg = ModelConfig.from_hf(json.loads(json.dumps(wrapped)))
    preset = labkit.PRESETS["qwen3.5-0.8b"]
    assert cfg.replace(name=preset.name) == preset


@pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-qwen3.5"])
def test_to_hf_round_trips(name):
    cfg = labkit.PRESETS[name]
    assert ModelConfig.from_hf(to_hf(cfg)).replace(name=name) == cfg


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match="num_kv_heads"):
        labkit.PRESETS["tiny-lfm2"].replace(num_kv_heads=4)
    with pytest.raises(ValueError, match="Gated DeltaNet"):
        labkit.PRESETS["tiny-lfm2"].replace(layer_types=("gdn",))
