"""ModelConfig under misuse (issue 24 item 5): values that would only fail later, deep in a shape or a
division, are refused when the config is made, naming the field and the value."""

import math

import pytest

from labkit.config import PRESETS, ModelConfig, to_hf

LFM2, QWEN = PRESETS["tiny-lfm2"], PRESETS["tiny-qwen3.5"]


@pytest.mark.parametrize("change, message", [
    (dict(norm_eps=-1), "norm_eps must be a finite number > 0, got -1"),
    (dict(norm_eps=0.0), "norm_eps must be a finite number > 0, got 0.0"),
    (dict(norm_eps=math.nan), "norm_eps must be a finite number > 0, got nan"),
    (dict(rope_theta=-1e4), "rope_theta must be a finite number > 0"),
    (dict(vocab_size=0), "vocab_size must be an int >= 1, got 0"),
    (dict(hidden_size=96.0), "hidden_size must be an int >= 1, got 96.0"),
    (dict(intermediate_size=True), "intermediate_size must be an int >= 1, got True"),
    (dict(num_heads=0, num_kv_heads=0), "num_heads must be an int >= 1, got 0"),
    (dict(head_dim=-16), "head_dim must be an int >= 1, got -16"),
    (dict(conv_kernel=0), "conv_kernel must be an int >= 1, got 0"),
    (dict(layer_types=()), "layer_types is empty"),
])
def test_bad_values_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LFM2.replace(**change)


@pytest.mark.parametrize("base", [LFM2, QWEN], ids=["lfm2", "qwen3.5"])
def test_num_hidden_layers_must_agree_with_layer_types(base):
    hf = to_hf(base)
    for n in (len(base.layer_types) - 1, len(base.layer_types) + 2):
        with pytest.raises(ValueError, match=f"num_hidden_layers is {n} but layer_types lists {base.num_layers}"):
            ModelConfig.from_hf({**hf, "num_hidden_layers": n})
    assert ModelConfig.from_hf(hf).layer_types == base.layer_types


@pytest.mark.parametrize("base", [LFM2, QWEN], ids=["lfm2", "qwen3.5"])
@pytest.mark.parametrize("change, message", [
    (dict(num_attention_heads=0), "num_.*heads must be an int >= 1, got 0"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be an int >= 1, got 0"),
    (dict(rms_norm_eps=-1, norm_eps=-1), "norm_eps must be a finite number > 0, got -1"),
])
def test_bad_hf_values_are_refused_by_name(base, change, message):
    hf = to_hf(base)
    hf = {**hf, **{k: v for k, v in change.items() if k in hf}}
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(hf)


def test_missing_and_mistyped_hf_entries_are_named():
    hf = to_hf(LFM2)
    with pytest.raises(ValueError, match="LFM2 config has no 'vocab_size' entry"):
        ModelConfig.from_hf({k: v for k, v in hf.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="wrong type"):
        ModelConfig.from_hf({**hf, "hidden_size": "96"})
    with pytest.raises(ValueError, match="JSON object"):
        ModelConfig.from_hf([hf])
