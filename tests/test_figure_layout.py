"""A legend placed under the x-axis label stays clear of it after tight_layout."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from labkit.lab.figure_layout import legend_below_xlabel  # noqa: E402


@pytest.mark.parametrize("height", [1.6, 4.0])
def test_legend_sits_below_the_xlabel(height):
    fig, ax = plt.subplots(figsize=(8, height))
    ax.barh(["a", "b"], [1, 2], label="one part")
    ax.barh(["a", "b"], [1, 1], left=[1, 2], label="another part")
    ax.set_xlabel("ms per decode step (a long label that a legend could cover)")
    legend = legend_below_xlabel(ax, ncol=2)
    plt.tight_layout()
    fig.canvas.draw()
    label_box = ax.xaxis.label.get_window_extent()
    legend_box = legend.get_window_extent()
    assert legend_box.y1 <= label_box.y0, (legend_box, label_box)
    plt.close(fig)


def test_no_legend_to_place():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="no labelled artist"):
        legend_below_xlabel(ax)
    plt.close(fig)
