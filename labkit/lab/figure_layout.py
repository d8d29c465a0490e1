"""Placement helpers that keep a figure readable at GitHub's width (no label under a legend)."""

from __future__ import annotations

from matplotlib.transforms import offset_copy

# Room under the axes for the tick labels and the x-axis label, in points: a legend anchored this
# far below the axes stays clear of them however tight_layout later resizes the axes (points do
# not scale with the axes, an axes fraction would).
BELOW_XLABEL_POINTS = 44.0


def legend_below_xlabel(ax, ncol: int = 3, fontsize: float = 8, points: float = BELOW_XLABEL_POINTS):
    """Put ``ax``'s legend in one row under its x-axis label (a fixed offset in points from the
    axes' bottom edge), frameless; returns the legend. Raises if the axes have nothing to label."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        raise ValueError("these axes have no labelled artist: there is no legend to place")
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-points, units="points")
    return ax.legend(handles, labels, fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=below, ncol=ncol, frameon=False)
