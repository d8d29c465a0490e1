"""Every rule ModelConfig and the config.json readers enforce, one refused example each, and the
layouts the readers infer when a config leaves them implicit."""

import pytest

import labkit
from labkit.config import ModelConfig, lfm2_ff_dim, to_hf

LFM2 = labkit.PRESETS["tiny-lfm2"]
QWEN = labkit.PRESETS["tiny-qwen3.5"]


@pytest.mark.parametrize(
    "base,changes,message",
    [
        (LFM2, dict(family="llama"), "family"),
        (LFM2, dict(layer_types=("conv", "mamba")), "unknown layer types"),
        (LFM2, dict(layer_types=("conv", "gdn")), "no Gated DeltaNet"),
        (QWEN, dict(layer_types=("gdn", "conv")), "no short-conv"),
        (LFM2, dict(num_kv_heads=4), "num_kv_heads"),  # 6 heads do not share 4 kv heads
        (LFM2, dict(num_heads=2, num_kv_heads=4), "num_kv_heads"),
        (LFM2, dict(rotary_dim=15), "rotary_dim"),
        (LFM2, dict(rotary_dim=0), "rotary_dim"),
        (LFM2, dict(rotary_dim=18), "rotary_dim"),  # head_dim is 16
        (QWEN, dict(gdn_v_head_dim=0), "positive gdn"),
        (QWEN, dict(gdn_num_k_heads=-2), "positive gdn"),
        (QWEN, dict(gdn_num_v_heads=3), "multiple of gdn_num_k_heads"),
    ],
)
def test_inconsistent_configs_are_refused(base, changes, message):
    with pytest.raises(ValueError, match=message):
        base.replace(**changes)


def test_gdn_sizes_only_matter_with_gdn_layers():
    assert LFM2.replace(gdn_num_k_heads=0, gdn_num_v_heads=0).gdn_conv_dim == 0


@pytest.mark.parametrize(
    "base,changes,message",
    [
        (LFM2, {"conv_bias": True}, "conv_bias"),
        (QWEN, {"attention_bias": True}, "bias"),
        (LFM2, {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type"),
        (QWEN, {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_type"),
        (QWEN, {"layer_types": ["linear_attention", "sliding_attention"] * 2 + ["full_attention"]}, "sliding"),
        (LFM2, {"layer_types": ["conv", "conv", "sliding_attention", "conv", "full_attention"]}, "sliding"),
    ],
)
def test_unsupported_hf_configs_are_refused(base, changes, message):
    hf = to_hf(base)
    hf.update(changes)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


def test_qwen35_without_layer_types_puts_attention_every_fourth_layer():
    hf = to_hf(QWEN)
    del hf["layer_types"]
    hf["num_hidden_layers"] = 8
    assert ModelConfig.from_hf(hf).layer_types == ("gdn", "gdn", "gdn", "attention") * 2
    hf["full_attention_interval"] = 2
    assert ModelConfig.from_hf(hf).layer_types == ("gdn", "attention") * 4


def test_lfm2_without_layer_lists_is_all_attention():
    """transformers' Lfm2Config: no layer_types and no full_attn_idxs means every layer attends."""
    hf = to_hf(LFM2)
    del hf["layer_types"]
    assert ModelConfig.from_hf(hf).layer_types == ("attention",) * LFM2.num_layers
    hf["full_attn_idxs"] = [1, 3]
    assert ModelConfig.from_hf(hf).layer_types == ("conv", "attention", "conv", "attention", "conv")


@pytest.mark.parametrize("tied", [True, False])
def test_multimodal_qwen35_takes_the_tie_from_the_outer_config(tied):
    text = to_hf(QWEN)
    del text["tie_word_embeddings"]
    cfg = ModelConfig.from_hf({"model_type": "qwen3_5", "tie_word_embeddings": tied, "text_config": text})
    assert cfg.tie_embeddings is tied


def test_lfm2_width_rounds_up_to_the_multiple():
    assert lfm2_ff_dim(6656, True, 1.0, 256) == 4608  # 4437 -> 4608
    assert lfm2_ff_dim(300, True, 1.0, 64) == 256  # 200 -> 256, not 192
    assert lfm2_ff_dim(300, True, None, 64) == 200  # no multiplier: no rounding
    assert lfm2_ff_dim(300, False, 1.0, 64) == 300


def test_to_hf_refuses_what_transformers_lfm2_cannot_express():
    with pytest.raises(ValueError, match="head_dim"):
        to_hf(LFM2.replace(head_dim=32, rotary_dim=32))
    with pytest.raises(ValueError, match="rotary"):
        to_hf(LFM2.replace(rotary_dim=8))
