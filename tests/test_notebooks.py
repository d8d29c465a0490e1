"""Every notebook runs end to end with papermill on a CPU, as `make run` does there: the shipped
byte-level checkpoints (tiny random presets where they are absent), Triton's interpreter.

The notebooks assert their own checks, so a failing check fails here. (CI also runs nbval over the
committed notebooks, comparing the outputs of cells marked NBVAL_CHECK_OUTPUT.)
"""

import pytest

from labkit.notebooks import notebook_paths, run_notebooks

pytest.importorskip("papermill")

NOTEBOOKS = notebook_paths()


def test_there_are_notebooks():
    # numbered from 00, each number once; a gap is a chapter still to come (the README lists them)
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert numbers[0] == "00" and numbers == sorted(set(numbers))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_cpu(path, tmp_path):
    (row,) = run_notebooks(tmp_path, parameters={"DEVICE": "cpu"}, only=[path.name])
    assert row["error"] is None, row["error"]
    assert (tmp_path / path.name).exists()


def test_auto_models_and_loading_by_name(monkeypatch, tmp_path):
    import torch

    import labkit
    from labkit.notebooks import default_models, load_model

    assert default_models(on_gpu=True) == ["lfm2-350m", "qwen3.5-0.8b"]
    monkeypatch.setenv("LABKIT_CHECKPOINTS", str(tmp_path))  # no shipped checkpoints here
    assert default_models(on_gpu=False) == ["tiny-lfm2", "tiny-qwen3.5"]
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=3)
    labkit.save(model, tmp_path / "byte-lfm2-6m")  # stands in for the shipped checkpoint
    assert default_models(on_gpu=False) == ["byte-lfm2-6m"]
    loaded = load_model("byte-lfm2-6m", torch.float32, "cpu")
    assert torch.equal(loaded.lm_head_weight, model.lm_head_weight)
    random = load_model("tiny-lfm2", torch.float32, "cpu", seed=3)
    assert torch.equal(random.lm_head_weight, model.lm_head_weight)  # a preset: seeded random weights
