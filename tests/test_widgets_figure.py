"""labkit.lab.widgets.figure_with_controls: one figure, drawn at once, redrawn on a change, busy label cleared."""

import matplotlib

matplotlib.use("Agg")

import pytest

pytest.importorskip("ipywidgets")


def test_draws_once_then_on_each_change_and_clears_the_busy_label():
    import ipywidgets as w

    from labkit.lab.widgets import figure_with_controls

    calls, seen = [], []
    block = w.IntSlider(value=8, min=1, max=64)

    def draw(block):
        calls.append(block)
        seen.append((status_of(box), block_control.disabled))

    box = None
    block_control = block
    status_of = lambda b: None if b is None else b.children[0].children[-1].value  # noqa: E731
    box = figure_with_controls({"block": block}, draw, busy_text="busy")
    assert calls == [8]  # drawn once at construction: the page shows one figure
    block.value = 16
    assert calls == [8, 16]
    assert seen[-1] == ("busy", True)  # while drawing: the label says so and the control waits
    label = box.children[0].children[-1]
    assert label.value == "" and not block.disabled


def test_needs_a_control():
    from labkit.lab.widgets import figure_with_controls

    with pytest.raises(ValueError, match="control"):
        figure_with_controls({}, lambda: None)
