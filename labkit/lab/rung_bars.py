"""Horizontal bars of decode rungs (tokens/s), one panel per model: the ladder's rows, a notebook's
own runs and predictions (hatched), with the roofline drawn across."""

from __future__ import annotations


def rung_bars(ax, bars, roofline: float, title: str, xlabel: str = "decode tokens/s, batch 1 (log scale)"):
    """``bars``: (label, tokens/s, colour, hatch) top to bottom; a hatched bar is drawn open (a
    prediction). A log axis: the ladder spans two orders of magnitude from its first rung."""
    if not bars:
        raise ValueError(f"{title}: no bars to draw")
    for i, (label, v, color, hatch) in enumerate(bars):
        ax.barh(i, v, color="white" if hatch else color, edgecolor=color, hatch=hatch)
        ax.text(v * 1.03, i, f"{v:,.0f}", va="center", fontsize=8)
    ax.axvline(roofline, color="black", ls="--", lw=1)
    ax.text(roofline, len(bars) - 0.4, " roofline", fontsize=8, va="top")
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    lo = min(b[1] for b in bars)
    ax.set(xscale="log", xlabel=xlabel, xlim=(lo / 2, roofline * 3), title=title)
    return ax
