"""Checkpoints under misuse (issue 24 items 1 and 5): atomic, validated saves, one set of weights per
directory, and load errors that name the file (and the tensor)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import labkit
from labkit.checkpoint import CheckpointError


def _model(seed=5, preset="tiny-lfm2", **changes):
    cfg = labkit.PRESETS[preset].replace(**changes)
    return labkit.build(cfg, dtype=torch.float32, seed=seed)


def _logits(model):
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    return model(ids)


@pytest.fixture
def old(tmp_path):
    """A good checkpoint at tmp_path/ckpt (of seed 5) and its logits."""
    model = _model()
    path = labkit.save(model, tmp_path / "ckpt")
    return path, _logits(model)


def _assert_whole(path, logits):
    """The checkpoint at ``path`` is the old one, whole, and nothing was left beside it."""
    assert torch.equal(_logits(labkit.load(path, dtype=torch.float32)), logits)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


# -- saving: validated before the first byte, atomic -----------------------------------------------
def test_a_writer_that_dies_partway_leaves_the_old_checkpoint(old, monkeypatch):
    import safetensors.torch

    path, logits = old

    def dies_partway(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{")  # half a header, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", dies_partway)
    with pytest.raises(OSError, match="No space"):
        labkit.save(_model(seed=6), path)
    _assert_whole(path, logits)


def test_a_writer_that_dies_leaves_no_new_directory(tmp_path, monkeypatch):
    import safetensors.torch

    def dies(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        labkit.save(_model(), tmp_path / "new")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool, "int8", "float33"])
def test_a_dtype_load_refuses_is_refused_before_writing(old, dtype):
    path, logits = old
    with pytest.raises(ValueError, match="dtype"):
        labkit.save(_model(seed=6), path, dtype=dtype)
    _assert_whole(path, logits)


def test_a_config_transformers_cannot_express_leaves_the_old_checkpoint(old):
    path, logits = old
    odd = _model(seed=6, head_dim=8, rotary_dim=8)  # 6 heads of 8 != hidden 96: not an HF LFM2
    with pytest.raises(ValueError, match="head_dim"):
        labkit.save(odd, path)
    _assert_whole(path, logits)


@pytest.mark.parametrize("extra", [{"when": object()}, {"scale": float("nan")}, {"t": torch.ones(1)}])
def test_extra_config_that_is_not_json_is_refused_before_writing(old, extra):
    path, logits = old
    with pytest.raises(ValueError, match="extra_config"):
        labkit.save(_model(seed=6), path, extra_config=extra)
    _assert_whole(path, logits)


def test_extra_config_that_describes_another_model_is_refused(old):
    path, logits = old
    with pytest.raises(ValueError, match=r"extra_config changes the model.*hidden_size \(96 -> 64\)"):
        labkit.save(_model(seed=6), path, extra_config={"hidden_size": 64})
    _assert_whole(path, logits)


def test_a_config_that_would_read_back_as_another_model_is_refused(old):
    """partial_rotary_factor = 58 / 100 reads back as int(100 * 0.58) = 57 rotary channels: a config.json
    that load would refuse (or, were 57 allowed, read as another model)."""
    path, logits = old
    odd = labkit.build(labkit.PRESETS["tiny-qwen3.5"].replace(num_heads=2, num_kv_heads=2, head_dim=100, rotary_dim=58),
                       dtype=torch.float32)
    with pytest.raises(ValueError, match=r"reads back as another model: .*rotary_dim 57"):
        labkit.save(odd, path)
    _assert_whole(path, logits)


def test_extra_config_may_set_what_does_not_change_the_model(tmp_path):
    model = _model()
    labkit.save(model, tmp_path, extra_config={"eos_token_id": 7, "labkit_tokenizer": "byte_tokenizer.json"})
    assert json.loads((tmp_path / "config.json").read_text())["labkit_tokenizer"] == "byte_tokenizer.json"
    assert labkit.load(tmp_path, dtype=torch.float32).cfg.eos_token_id == 7


def test_saving_over_a_checkpoint_keeps_its_other_files(old):
    path, _ = old
    (path / "byte_tokenizer.json").write_text("{}")
    model = _model(seed=6)
    labkit.save(model, path)
    assert (path / "byte_tokenizer.json").read_text() == "{}"
    assert torch.equal(_logits(labkit.load(path, dtype=torch.float32)), _logits(model))


def _shard(path, out):
    """The checkpoint at ``path`` as a two-shard Hugging Face directory at ``out``."""
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    out.mkdir()
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, out / file)
        weight_map.update({n: file for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(path / "config.json", out / "config.json")
    return out


def test_saving_into_a_sharded_directory_is_refused_unless_replace_weights(old, tmp_path):
    path, logits = old
    sharded = _shard(path, tmp_path / "sharded")
    before = sorted(p.name for p in sharded.iterdir())
    new = _model(seed=6)
    with pytest.raises(CheckpointError, match="replace_weights=True"):
        labkit.save(new, sharded)
    assert sorted(p.name for p in sharded.iterdir()) == before
    assert torch.equal(_logits(labkit.load(sharded, dtype=torch.float32)), logits)

    labkit.save(new, sharded, replace_weights=True)
    assert sorted(p.name for p in sharded.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(_logits(labkit.load(sharded, dtype=torch.float32)), _logits(new))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "sharded"]  # no staging left


def test_save_into_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _model()
    labkit.save(model, ".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(_logits(labkit.load(".", dtype=torch.float32)), _logits(model))


def test_saving_beside_a_stray_safetensors_file_is_refused(old):
    path, logits = old
    shutil.copy(path / "model.safetensors", path / "adapter.safetensors")
    with pytest.raises(CheckpointError, match="adapter.safetensors"):
        labkit.save(_model(seed=6), path)
    (path / "adapter.safetensors").unlink()
    _assert_whole(path, logits)


def test_save_and_load_check_their_arguments(old, tmp_path):
    path, _ = old
    with pytest.raises(TypeError, match="HybridLM"):
        labkit.save({"embed.weight": torch.zeros(2)}, tmp_path / "x")
    with pytest.raises(TypeError, match="path"):
        labkit.save(_model(), 5)
    with pytest.raises(TypeError, match="extra_config"):
        labkit.save(_model(), tmp_path / "x", extra_config=[("a", 1)])
    with pytest.raises(TypeError, match="replace_weights"):
        labkit.save(_model(), tmp_path / "x", replace_weights="yes")
    with pytest.raises(TypeError, match="path"):
        labkit.load(5)
    with pytest.raises(ValueError, match="device.*'gpu'"):
        labkit.load(path, device="gpu")
    with pytest.raises(ValueError, match="dtype.*int8"):
        labkit.load(path, dtype=torch.int8)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", ["float32", "torch.float32"])
def test_load_takes_a_dtype_by_name(old, name):
    path, logits = old
    model = labkit.load(path, dtype=name)
    assert model.dtype == torch.float32 and torch.equal(_logits(model), logits)


# -- loading: one set of weights, errors that name the file ------------------------------------------
def test_load_refuses_a_stray_copy_beside_the_weights(old):
    path, _ = old
    labkit.save(_model(seed=6), path.parent / "other")
    shutil.copy(path.parent / "other" / "model.safetensors", path / "model_old.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors and model_old.safetensors"):
        labkit.load(path, dtype=torch.float32)


def test_load_refuses_weights_the_index_does_not_name(old, tmp_path):
    path, _ = old
    sharded = _shard(path, tmp_path / "sharded")
    shutil.copy(path / "model.safetensors", sharded / "model.safetensors")
    with pytest.raises(CheckpointError, match="two sets of weights: model.safetensors"):
        labkit.load(sharded)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"config\.json .*not valid JSON"),
    ("[1, 2]", r"config\.json.*JSON object"),
    ('{"model_type": "lfm2"}', r"config\.json.*no 'num_hidden_layers'"),
])
def test_a_malformed_config_is_named(old, text, message):
    path, _ = old
    (path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match=message):
        labkit.load(path)


@pytest.mark.parametrize("change, message", [
    (dict(num_attention_heads=0), "num_attention_heads must be an int >= 1, got 0"),
    (dict(num_key_value_heads=0), "num_kv_heads must be an int >= 1, got 0"),
    (dict(norm_eps=-1), "norm_eps must be a finite number > 0, got -1"),
    (dict(num_hidden_layers=4), "num_hidden_layers is 4 but layer_types lists 5"),
    (dict(hidden_size="96"), "wrong type"),
])
def test_a_config_with_bad_values_is_named(old, change, message):
    path, _ = old
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hf, **change}))
    with pytest.raises(CheckpointError, match=rf"config\.json: .*{message}"):
        labkit.load(path)


@pytest.mark.parametrize("index, message", [
    ("{not json", "not valid JSON"),
    ('{"metadata": {}}', 'no "weight_map"'),
    ('{"weight_map": {"model.embed_tokens.weight": "gone.safetensors"}}', "names files that are not in"),
])
def test_a_malformed_index_is_named(old, tmp_path, index, message):
    path, _ = old
    sharded = _shard(path, tmp_path / "sharded")
    (sharded / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors\.index\.json.*{message}"):
        labkit.load(sharded)


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_a_truncated_weights_file_is_named(old, keep):
    path, _ = old
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        labkit.load(path)


def test_an_untied_head_missing_from_the_checkpoint_is_named(tmp_path):
    """Issue 23 item 9: a check that exempted an untied lm_head.weight raised a bare KeyError."""
    labkit.save(_model(preset="tiny-qwen3.5", tie_embeddings=False), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing tensors lm_head.weight"):
        labkit.load(tmp_path)
