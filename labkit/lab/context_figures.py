"""What one sequence moves per decode step as its context grows, with one line per distinct curve.

Two models whose attention layers hold the same bytes per cached token (LFM2-350M and Qwen3.5-0.8B
do: as many attention layers, and key/value heads x head size equal) draw the same KV line; drawn
twice, one hides the other, so models with equal curves share one line whose label names them all.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt

from ..config import ModelConfig
from .plots import COLORS, byte_parts, crossing_context


def _group_equal(configs: Sequence[ModelConfig], curve) -> list[tuple[list[str], tuple]]:
    groups: dict[tuple, list[str]] = {}
    for cfg in configs:
        groups.setdefault(curve(cfg), []).append(cfg.name)
    return [(names, ys) for ys, names in groups.items()]


def state_vs_context(configs: Sequence[ModelConfig], max_context: int, ax=None, points: int = 65,
                     mark: Sequence[str] | None = None):
    """MB each sequence moves per step against its context: the attention layers' KV cache (rising)
    and the conv windows / delta-rule state (flat), one line per distinct curve. The crossing (KV
    traffic reaches the fixed state's) is marked for the models named in ``mark`` (all when None;
    a page that asks for a crossing as an exercise leaves that model out). Returns the axes."""
    if max_context < 1 or points < 2:
        raise ValueError(f"need max_context >= 1 and points >= 2, got {max_context}, {points}")
    ax = ax or plt.gca()
    xs = [round(max_context * i / (points - 1)) for i in range(points)]
    kv_groups = _group_equal(configs, lambda c: tuple(byte_parts(c, L)[1] for L in xs))
    state_groups = _group_equal(configs, lambda c: (byte_parts(c, 0)[2],))
    styles = ("-", "--", "-.", ":")
    for (names, ys), ls in zip(kv_groups, styles):
        ax.plot(xs, [y / 1e6 for y in ys], color=COLORS["kv"], ls=ls, lw=1.5,
                label=f"KV cache of the attention layers: {' and '.join(names)}")
    for (names, (state,)), ls in zip(state_groups, styles):
        ax.plot(xs, [state / 1e6] * len(xs), color=COLORS["state"], ls=ls, lw=1.5,
                label=f"conv windows / delta-rule state: {' and '.join(names)}")
    unknown = set(mark or ()) - {c.name for c in configs}
    if unknown:
        raise ValueError(f"mark names models not drawn: {sorted(unknown)}")
    for cfg in configs:
        if mark is not None and cfg.name not in mark:
            continue
        cross, state = crossing_context(cfg), byte_parts(cfg, 0)[2]
        if 0 < cross <= max_context:
            ax.plot([cross], [state / 1e6], marker="o", color="black", ms=5)
            ax.annotate(f"{cfg.name}: {cross:,} tokens", (cross, state / 1e6), textcoords="offset points",
                        xytext=(6, -12), fontsize=8)
    ax.set_xlim(0, max_context)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens already in the cache (context)")
    ax.set_ylabel("MB per sequence per decode step")
    ax.legend(fontsize=8, loc="upper left")
    return ax
