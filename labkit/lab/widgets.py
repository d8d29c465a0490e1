"""Interactive controls for the notebooks (ipywidgets); each one redraws a labkit figure."""

from __future__ import annotations

import matplotlib.pyplot as plt

from . import plots
from ..config import PRESETS


def roofline_explorer(bytes_per_s: float, flops_per_s: float, presets=("lfm2-350m", "qwen3.5-0.8b")):
    """Pick a preset, a batch size and a context length; see the byte budget and the limit they set.

    Returns the widget (display it); without ipywidgets installed, raises ImportError naming it.
    """
    try:
        import ipywidgets as w
    except ImportError as exc:  # the notebooks extra installs it
        raise ImportError("roofline_explorer needs ipywidgets: pip install 'labkit[notebooks]'") from exc
    from .roofline import step_cost

    preset = w.Dropdown(options=list(presets), value=presets[0], description="preset")
    batch = w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256], value=1, description="batch")
    context = w.SelectionSlider(options=[128, 512, 2048, 8192, 32768], value=2048, description="context")
    out = w.Output()

    def redraw(*_):
        cfg = PRESETS[preset.value]
        with out:
            out.clear_output(wait=True)
            fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
            plots.bytes_per_token(cfg, [1, 4, 16, 64, 256], context.value, ax=a)
            plots.roofline([cfg], bytes_per_s, flops_per_s, [batch.value], context.value, ax=b)
            cost = step_cost(cfg, batch.value, context.value)
            fig.suptitle(f"{cfg.name}, batch {batch.value}, context {context.value}: {cost.bytes / 1e6:,.0f} MB per step, "
                         f"limit {cost.tokens_per_s_limit(bytes_per_s):,.0f} tok/s", fontsize=9)
            plt.show()

    for control in (preset, batch, context):
        control.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([preset, batch, context]), out])


def figure_with_controls(controls: dict, draw, busy_text: str = "redrawing…"):
    """Sliders (or any value widgets) above ONE figure that ``draw(**values)`` makes; while it draws, a
    label says so (a redraw can take seconds: a replay on a CPU runs the model). The figure is drawn
    once at once, so the page shows it a single time. Returns the widget (display it)."""
    try:
        import ipywidgets as w
    except ImportError as exc:  # the notebooks extra installs it
        raise ImportError("figure_with_controls needs ipywidgets: pip install 'labkit[notebooks]'") from exc
    if not controls:
        raise ValueError("figure_with_controls needs at least one control")
    status = w.Label(value="")
    out = w.Output()

    def redraw(*_):
        status.value = busy_text
        for c in controls.values():
            c.disabled = True
        try:
            with out:
                out.clear_output(wait=True)
                draw(**{name: c.value for name, c in controls.items()})
                plt.show()
        finally:
            for c in controls.values():
                c.disabled = False
            status.value = ""

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([*controls.values(), status]), out])
