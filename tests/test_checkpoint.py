"""Loading checkpoints: round trips, sharded files, and bad checkpoints with errors that name the tensor."""

import json
import sys
import types

import pytest
import torch
from safetensors.torch import load_file, save_file

import labkit
from labkit.checkpoint import hf_state_dict


@pytest.fixture(params=["tiny-lfm2", "tiny-qwen3.5"])
def saved(request, tmp_path):
    model = labkit.build(request.param, dtype=torch.float32, seed=5)
    labkit.save(model, tmp_path)
    return model, tmp_path


def _logits(model, seed=0):
    ids = torch.randint(0, model.cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(seed))
    return model(ids)


def test_round_trip_is_exact(saved):
    model, path = saved
    again = labkit.load(path, dtype=torch.float32)
    assert again.cfg == model.cfg.replace(name=again.cfg.name)
    assert torch.equal(_logits(again), _logits(model))


def test_sharded_checkpoint_with_index(saved, tmp_path_factory):
    model, path = saved
    tensors = load_file(path / "model.safetensors")
    out = tmp_path_factory.mktemp("sharded")
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, out / file)
        weight_map.update({n: file for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (out / "config.json").write_text((path / "config.json").read_text())
    assert torch.equal(_logits(labkit.load(out, dtype=torch.float32)), _logits(model))


def test_qwen_multimodal_layout_loads(tmp_path):
    """Released Qwen3.5 checkpoints keep the text model under model.language_model. beside a vision tower."""
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=2)
    tensors = {k.replace("model.", "model.language_model.", 1): v for k, v in hf_state_dict(model).items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    save_file(tensors, tmp_path / "model.safetensors")
    text = labkit.config.to_hf(model.cfg)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    assert torch.equal(_logits(labkit.load(tmp_path, dtype=torch.float32)), _logits(model))


def _rewrite(path, change):
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors")


def test_missing_tensor_is_named(saved):
    _, path = saved
    victim = sorted(load_file(path / "model.safetensors"))[3]
    _rewrite(path, lambda t: t.pop(victim))
    with pytest.raises(labkit.CheckpointError, match=f"missing tensors {victim}"):
        labkit.load(path)


def test_unexpected_tensor_is_named(saved):
    _, path = saved
    _rewrite(path, lambda t: t.__setitem__("model.layers.0.surprise.weight", torch.zeros(2)))
    with pytest.raises(labkit.CheckpointError, match="unexpected tensors model.layers.0.surprise.weight"):
        labkit.load(path)


def test_misshaped_tensor_is_named(saved):
    model, path = saved
    qwen = model.cfg.family == "qwen3.5"
    name = "model.layers.1.mlp.down_proj.weight" if qwen else "model.layers.1.feed_forward.w2.weight"

    def shrink(t):
        t[name] = t[name][:, :-1].contiguous()

    _rewrite(path, shrink)
    with pytest.raises(labkit.CheckpointError, match=name.replace(".", r"\.") + " has shape"):
        labkit.load(path)


def test_tied_head_that_differs_is_refused(saved):
    _, path = saved
    _rewrite(path, lambda t: t.__setitem__("lm_head.weight", torch.randn_like(t["model.embed_tokens.weight"])))
    with pytest.raises(labkit.CheckpointError, match="ties lm_head"):
        labkit.load(path)


def test_missing_files_are_clear_errors(tmp_path):
    with pytest.raises(labkit.CheckpointError, match="no checkpoint directory"):
        labkit.load(tmp_path / "nowhere")
    with pytest.raises(labkit.CheckpointError, match="no config.json"):
        labkit.load(tmp_path)


def _fake_hub(monkeypatch, answer):
    """huggingface_hub with its download replaced: records each call, answers ``answer`` (no network)."""
    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(answer)

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download))
    return calls


def test_a_missing_local_path_never_reaches_the_hub(tmp_path, monkeypatch):
    calls = _fake_hub(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(labkit.CheckpointError, match="no checkpoint directory at runs/ckpt"):
        labkit.load("runs/ckpt")
    with pytest.raises(labkit.CheckpointError, match="load 'hub:LiquidAI/LFM2-350M'"):
        labkit.load("LiquidAI/LFM2-350M")
    assert calls == []


def test_hub_prefix_downloads_config_and_safetensors(tmp_path, monkeypatch):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=4)
    labkit.save(model, tmp_path / "snapshot")
    calls = _fake_hub(monkeypatch, tmp_path / "snapshot")
    again = labkit.load("hub:owner/tiny", dtype=torch.float32)
    assert calls == [("owner/tiny", {"allow_patterns": ["*.json", "*.safetensors"]})]
    assert torch.equal(_logits(again), _logits(model))
    with pytest.raises(labkit.CheckpointError, match="hub:owner/name"):
        labkit.load("hub:no-owner")
    assert len(calls) == 1
