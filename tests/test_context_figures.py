"""Equal KV curves are drawn once (one line naming both models), different ones apart."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import labkit  # noqa: E402
from labkit.lab.context_figures import state_vs_context  # noqa: E402


def _labels(ax):
    return [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_equal_kv_curves_share_one_line():
    configs = [labkit.PRESETS["lfm2-350m"], labkit.PRESETS["qwen3.5-0.8b"]]
    fig, ax = plt.subplots()
    state_vs_context(configs, max_context=300, ax=ax, points=7, mark=["qwen3.5-0.8b"])
    labels = [lab for lab in _labels(ax) if lab.startswith(("KV", "conv"))]
    assert labels == ["KV cache of the attention layers: lfm2-350m and qwen3.5-0.8b",
                      "conv windows / delta-rule state: lfm2-350m", "conv windows / delta-rule state: qwen3.5-0.8b"]
    plt.close(fig)


def test_different_kv_curves_are_drawn_apart_and_crossings_marked():
    configs = [labkit.PRESETS["tiny-lfm2"], labkit.PRESETS["lfm2-350m"]]
    fig, ax = plt.subplots()
    state_vs_context(configs, max_context=64, ax=ax, points=5)
    kv = [lab for lab in _labels(ax) if lab.startswith("KV")]
    assert len(kv) == 2
    assert any(t.get_text().startswith("lfm2-350m:") for t in ax.texts)
    plt.close(fig)


def test_bad_arguments():
    cfg = labkit.PRESETS["lfm2-350m"]
    with pytest.raises(ValueError, match="not drawn"):
        state_vs_context([cfg], 10, ax=plt.subplots()[1], mark=["nope"])
    with pytest.raises(ValueError, match="max_context"):
        state_vs_context([cfg], 0, ax=plt.subplots()[1])
    plt.close("all")
