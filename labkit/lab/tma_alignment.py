"""The CUDA + TMA GEMV's rate against the weight's base-address offset (``tma-alignment.json``):
per (batch, row stride) group, how much the rate varies across accepted offsets, and the figure."""

from __future__ import annotations

import numpy as np


def alignment_summary(rows) -> dict:
    """``groups`` [(batch, row_stride)], ``offsets`` (accepted), ``spread`` per group ((max − min) / max
    of the rate), ``us`` per (group, offset), and the ``refused`` rows (an error before launch)."""
    ok = [r for r in rows if not r["error"]]
    if not ok:
        raise ValueError("no accepted alignment rows")
    groups = sorted({(r["batch"], r["row_stride"]) for r in rows})
    spread = {}
    for g in groups:
        v = [r["gb_per_s"] for r in ok if (r["batch"], r["row_stride"]) == g]
        spread[g] = (max(v) - min(v)) / max(v)
    return {"groups": groups, "offsets": sorted({r["base_offset_bytes"] for r in ok}), "spread": spread,
            "us": {((r["batch"], r["row_stride"]), r["base_offset_bytes"]): r["us"] for r in ok},
            "refused": [r for r in rows if r["error"]]}


def plot_alignment(ax, rows, copy_bytes_per_s: float):
    """Grouped bars: TB/s per accepted offset, one colour per (batch, row stride); refused offsets noted."""
    s = alignment_summary(rows)
    ok = {((r["batch"], r["row_stride"]), r["base_offset_bytes"]): r["gb_per_s"] for r in rows if not r["error"]}
    width = 0.8 / len(s["groups"])
    for j, g in enumerate(s["groups"]):
        ax.bar(np.arange(len(s["offsets"])) + (j - (len(s["groups"]) - 1) / 2) * width,
               [ok.get((g, o), 0) / 1e3 for o in s["offsets"]], width,
               label=f"batch {g[0]}, row stride {g[1]} elements ({g[1] * 2} B)")
    ax.set_xticks(range(len(s["offsets"])), [f"+{o} B" for o in s["offsets"]])
    ax.set(xlabel="weight base address past a 256-byte boundary", ylabel="TB/s of weight bytes",
           ylim=(0, copy_bytes_per_s / 1e12 * 1.35), title="CUDA + TMA GEMV, L2-cold (tma-alignment.json)")
    if s["refused"]:
        ax.text(len(s["offsets"]) - 0.5, copy_bytes_per_s / 1e12 * 1.05,
                f"+{s['refused'][0]['base_offset_bytes']} B: refused before launch (16-byte rule)", ha="right", fontsize=8,
                color="#d9534f")
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    return s
