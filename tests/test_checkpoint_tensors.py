"""Every tensor of a checkpoint is checked as it loads, and each one lands where it belongs.

A tensor of the right size but the wrong shape must stop the load, naming the tensor and both
shapes. Comparing only element counts would let a transposed matrix through: some joins reinterpret the
memory (Qwen3.5's q_proj is viewed per head) and some broadcast on copy (a conv weight stored as
[C, K, 1] instead of [C, 1, K]), so the model would load without complaint and compute nonsense.
"""

import re

import pytest
import torch
from safetensors.torch import load_file, save_file

import labkit


@pytest.fixture(scope="module", params=["tiny-lfm2", "tiny-qwen3.5"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    labkit.save(labkit.build(request.param, dtype=torch.float32, seed=3), path)
    return load_file(path / "model.safetensors"), (path / "config.json").read_text()


def _load(tensors, config_json, path):
    path.mkdir()
    save_file(tensors, path / "model.safetensors")
    (path / "config.json").write_text(config_json)
    return labkit.load(path, dtype=torch.float32)


def _one_per_role(names):
    """One tensor for each role (the layer index dropped): every join and shape kind, few loads."""
    seen, out = set(), []
    for name in sorted(names):
        role = re.sub(r"layers\.\d+\.", "layers.*.", name)
        if role not in seen:
            seen.add(role)
            out.append(name)
    return out


def _same_count_wrong_shape(shape):
    """A layout with the same elements that a checkpoint might plausibly hold by mistake: the
    transpose, or (where that has the same shape: vectors, square matrices) a leading unit dim."""
    if len(shape) == 3 and shape[1] == 1:  # nn.Conv1d's [C, 1, K] stored as [C, K, 1]
        return (shape[0], shape[2], 1)
    transposed = tuple(reversed(shape))
    return transposed if transposed != shape else (1, *shape)


def test_every_reshaped_tensor_is_refused_by_name(checkpoint, tmp_path):
    tensors, config_json = checkpoint
    victims = _one_per_role(tensors)
    assert len(victims) >= 15
    wrong = []
    for i, name in enumerate(victims):
        good = tuple(tensors[name].shape)
        bad = _same_count_wrong_shape(good)
        assert bad != good
        changed = dict(tensors)
        changed[name] = tensors[name].t().contiguous() if bad == good[::-1] else tensors[name].reshape(bad)
        expected = f"tensor {name} has shape {bad}, expected {good}"
        try:
            _load(changed, config_json, tmp_path / str(i))
            wrong.append(f"{name} {good} -> {bad}: loaded without error")
        except labkit.CheckpointError as e:
            if expected not in str(e):
                wrong.append(f"{name}: message {str(e)!r} lacks {expected!r}")
        except Exception as e:  # noqa: BLE001 - any other failure is the wrong kind of error
            wrong.append(f"{name} {good} -> {bad}: {type(e).__name__}: {e}")
    assert not wrong, "\n".join(wrong)


def test_integer_tensor_is_refused_by_name(checkpoint, tmp_path):
    tensors, config_json = checkpoint
    name = "model.embed_tokens.weight"
    changed = dict(tensors)
    changed[name] = tensors[name].round().to(torch.int32)
    with pytest.raises(labkit.CheckpointError, match=re.escape(f"tensor {name} has dtype torch.int32")):
        _load(changed, config_json, tmp_path / "ints")


def test_other_float_dtypes_load_converted(checkpoint, tmp_path):
    """A half-precision checkpoint is fine: its tensors are converted to the dtype asked for."""
    tensors, config_json = checkpoint
    half = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    model = _load(half, config_json, tmp_path / "bf16")
    assert torch.equal(model.embed.weight, tensors["model.embed_tokens.weight"].to(torch.bfloat16).float())


def test_an_untied_head_round_trips(tmp_path):
    """The tiny presets tie lm_head to the embedding; an untied model saves and loads its own head."""
    model = labkit.build(labkit.PRESETS["tiny-qwen3.5"].replace(tie_embeddings=False), dtype=torch.float32, seed=6)
    assert model.lm_head is not None and not torch.equal(model.lm_head, model.embed.weight)
    labkit.save(model, tmp_path)
    assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")
    again = labkit.load(tmp_path, dtype=torch.float32)
    assert torch.equal(again.lm_head, model.lm_head) and torch.equal(again.embed.weight, model.embed.weight)
