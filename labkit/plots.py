"""The workbook's figures: layer diagrams, byte budgets, rooflines, kernel timelines, waterfalls."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from .config import ModelConfig
from .roofline import layer_costs, step_cost

COLORS = {
    "attention": "#d9534f",
    "conv": "#5bc0de",
    "gdn": "#9b59b6",
    "mlp": "#f0ad4e",
    "norm": "#95a5a6",
    "projections": "#2e86c1",
    "lm_head": "#27ae60",
    "embedding": "#7f8c8d",
    "sampling": "#34495e",
    "other": "#bdc3c7",
    "weights": "#2e86c1",
    "kv": "#d9534f",
    "state": "#9b59b6",
}
MIXER_LABEL = {"attention": "GQA attention", "conv": "gated short conv", "gdn": "Gated DeltaNet"}


def layer_diagram(cfg: ModelConfig, ax=None):
    """The decoder stack bottom to top: each block's mixer (coloured by kind) beside its MLP."""
    ax = ax or plt.gca()
    n = cfg.num_layers
    for i, kind in enumerate(cfg.layer_types):
        ax.add_patch(FancyBboxPatch((0, i), 2.6, 0.8, boxstyle="round,pad=0.02", color=COLORS[kind]))
        ax.text(1.3, i + 0.4, f"{i}: {MIXER_LABEL[kind]}", ha="center", va="center", fontsize=7, color="white")
        ax.add_patch(FancyBboxPatch((2.8, i), 1.4, 0.8, boxstyle="round,pad=0.02", color=COLORS["mlp"]))
        ax.text(3.5, i + 0.4, "SwiGLU", ha="center", va="center", fontsize=7)
    ax.add_patch(FancyBboxPatch((0, -1.2), 4.2, 0.8, boxstyle="round,pad=0.02", color=COLORS["embedding"]))
    ax.text(2.1, -0.8, f"embedding {cfg.vocab_size:,} x {cfg.hidden_size}", ha="center", va="center", fontsize=7, color="white")
    ax.add_patch(FancyBboxPatch((0, n + 0.2), 4.2, 0.8, boxstyle="round,pad=0.02", color=COLORS["lm_head"]))
    tied = " (tied)" if cfg.tie_embeddings else ""
    ax.text(2.1, n + 0.6, f"norm + lm_head{tied}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(-0.2, 4.4)
    ax.set_ylim(-1.5, n + 1.3)
    ax.axis("off")
    ax.set_title(f"{cfg.name}: {cfg.num_layers} blocks", fontsize=9)
    return ax


def bytes_per_token(cfg: ModelConfig, batches: Sequence[int], context: int, ax=None):
    """Bytes moved per generated token, split into weights, KV cache and fixed-size state."""
    ax = ax or plt.gca()
    costs = layer_costs(cfg, context)
    weights = sum(c.weight_bytes for c in costs)
    kv = sum(c.state_bytes_per_seq for c in costs if c.kind == "attention")
    state = sum(c.state_bytes_per_seq for c in costs if c.kind not in ("attention",))
    xs = [str(b) for b in batches]
    w = [weights / b / 1e6 for b in batches]
    k = [kv / 1e6] * len(batches)
    s = [state / 1e6] * len(batches)
    ax.bar(xs, w, color=COLORS["weights"], label="weights (shared by the batch)")
    ax.bar(xs, k, bottom=w, color=COLORS["kv"], label=f"KV cache at {context} tokens")
    ax.bar(xs, s, bottom=[a + b for a, b in zip(w, k)], color=COLORS["state"], label="conv / delta-rule state")
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.5 * min(min(w), min(k) if kv else min(w), min(s) if state else min(w)))
    ax.set_xlabel("batch size")
    ax.set_ylabel("MB moved per generated token")
    ax.set_title(f"{cfg.name}, context {context}", fontsize=9)
    ax.legend(fontsize=7)
    return ax


def roofline(configs: Sequence[ModelConfig], bytes_per_s: float, flops_per_s: float,
             batches: Sequence[int], context: int, ax=None, measured: dict | None = None):
    """Attainable FLOP/s against arithmetic intensity, with each model's decode step at each batch.

    ``measured`` maps (model name, batch) -> achieved FLOP/s, drawn as hollow markers.
    """
    ax = ax or plt.gca()
    ridge = flops_per_s / bytes_per_s
    xs = [0.1, ridge, ridge * 20]
    ax.plot(xs, [min(x * bytes_per_s, flops_per_s) / 1e12 for x in xs], color="black", lw=1.5)
    ax.annotate(f"{bytes_per_s / 1e12:.2f} TB/s", (0.3, 0.3 * bytes_per_s / 1e12 * 1.3), fontsize=7, rotation=28)
    ax.axhline(flops_per_s / 1e12, color="black", ls=":", lw=0.8)
    for marker, cfg in zip("os^D", configs):
        pts = [step_cost(cfg, b, context) for b in batches]
        ax.plot([p.intensity for p in pts], [min(p.intensity * bytes_per_s, flops_per_s) / 1e12 for p in pts],
                marker=marker, ls="-", lw=0.8, label=f"{cfg.name} (batch {batches[0]}..{batches[-1]})")
        for p in pts:
            if measured and (cfg.name, p.batch) in measured:
                ax.plot(p.intensity, measured[(cfg.name, p.batch)] / 1e12, marker=marker, mfc="none", color="gray")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.legend(fontsize=7)
    return ax


def kernel_timeline(spans, ax=None, title: str = ""):
    """One decode step's kernels on a time axis, coloured by op family, gaps left visible."""
    ax = ax or plt.gca()
    for s in spans:
        ax.broken_barh([(s.start_us, max(s.dur_us, 0.3))], (0, 1), color=COLORS.get(s.family, "#bdc3c7"))
    families = sorted({s.family for s in spans})
    for f in families:
        ax.plot([], [], color=COLORS.get(f, "#bdc3c7"), lw=6, label=f)
    ax.set_yticks([])
    ax.set_xlabel("µs since the step's first kernel")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=min(len(families), 5), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return ax


def family_bars(table, ax=None, title: str = "", unit: str = "ms"):
    """Horizontal bars of (family, time, share) rows."""
    ax = ax or plt.gca()
    names = [r[0] for r in table][::-1]
    values = [r[1] for r in table][::-1]
    ax.barh(names, values, color=[COLORS.get(n, "#bdc3c7") for n in names])
    for y, (v, r) in enumerate(zip(values, [r[2] for r in table][::-1])):
        ax.text(v, y, f" {100 * r:.0f}%", va="center", fontsize=7)
    ax.set_xlabel(f"{unit} per decode step")
    ax.set_title(title, fontsize=9)
    return ax


def waterfall(stages: Sequence[tuple[str, float]], ax=None, title: str = "", unit: str = "tok/s",
              ceiling: float | None = None):
    """Each optimisation stage's result as a bar, with the gain over the previous stage."""
    ax = ax or plt.gca()
    names = [s[0] for s in stages]
    values = [s[1] for s in stages]
    ax.bar(names, values, color=["#95a5a6"] + ["#2e86c1"] * (len(values) - 1))
    for i, v in enumerate(values):
        gain = f"\n×{v / values[i - 1]:.1f}" if i else ""
        ax.text(i, v, f"{v:,.0f}{gain}", ha="center", va="bottom", fontsize=7)
    if ceiling:
        ax.axhline(ceiling, color="black", ls="--", lw=0.8)
        ax.text(len(values) - 0.5, ceiling, " roofline", va="bottom", ha="right", fontsize=7)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=7)
    return ax


def _span_fields(s):
    """(family, start µs, duration µs) of a KernelSpan or of a committed [family, start, duration] row."""
    return (s.family, s.start_us, s.dur_us) if hasattr(s, "family") else tuple(s)


def busy_fraction(spans, bin_us: float, end_us: float | None = None) -> list[float]:
    """Fraction of each ``bin_us`` bin (from 0 to ``end_us``) covered by at least one kernel."""
    import math  # (kept local: this module's header is shared with other notebooks' helpers)

    if bin_us <= 0:
        raise ValueError(f"bin_us must be > 0, got {bin_us}")
    intervals = sorted((st, st + d) for _, st, d in map(_span_fields, spans))
    end_us = max((e for _, e in intervals), default=0.0) if end_us is None else end_us
    bins = [0.0] * max(1, math.ceil(end_us / bin_us))
    merged: list[list[float]] = []
    for s, e in intervals:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    for s, e in merged:
        i = int(s // bin_us)
        while i < len(bins) and i * bin_us < e:
            lo, hi = max(s, i * bin_us), min(e, (i + 1) * bin_us)
            bins[i] += max(0.0, hi - lo) / bin_us
            i += 1
    return bins


def step_timeline(spans, ax, strip_ax, title: str = "", bins: int = 100, zoom_ax=None, zoom_us: float = 300.0):
    """One step's kernels at their true widths (a 2 µs kernel in a 14 ms step is a hairline), and
    under them the fraction of each time bin in which the GPU ran a kernel. With ``zoom_ax``, the
    first ``zoom_us`` µs of the step again, wide enough to see single kernels and the gaps between."""
    rows = [_span_fields(s) for s in spans]
    end = max((st + d for _, st, d in rows), default=1.0)
    for fam in sorted({f for f, _, _ in rows}):
        bars = [(st, d) for f, st, d in rows if f == fam]
        ax.broken_barh(bars, (0, 1), color=COLORS.get(fam, "#bdc3c7"), linewidth=0, label=fam, rasterized=True)
        if zoom_ax is not None:
            zoom_ax.broken_barh([(st, d) for st, d in bars if st < zoom_us], (0, 1), color=COLORS.get(fam, "#bdc3c7"),
                                linewidth=0)
    if zoom_ax is not None:
        zoom_ax.set_xlim(0, zoom_us)
        zoom_ax.set_yticks([])
        zoom_ax.set_xlabel(f"µs: the step's first {zoom_us:,.0f} µs, enlarged", fontsize=8)
    ax.set_xlim(0, end)
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.005, 0.5), frameon=False)
    width = end / bins
    frac = busy_fraction(rows, width, end)
    strip_ax.bar([i * width for i in range(len(frac))], [100 * f for f in frac], width=width, align="edge",
                 color="#34495e")
    strip_ax.set_xlim(0, end)
    strip_ax.set_ylim(0, 100)
    strip_ax.set_ylabel("GPU busy\n% of bin", fontsize=7)
    strip_ax.set_xlabel(f"µs since the step's first kernel (bins of {width:,.0f} µs)")
    return ax


def time_split_bars(rows, ax=None, title: str = ""):
    """Stacked horizontal bars, one per (label, TimeSplit): GPU busy, launching, Python (ms, linear)."""
    ax = ax or plt.gca()
    colors = ["#2e86c1", "#f39c12", "#95a5a6"]
    labels = [r[0] for r in rows][::-1]
    splits = [r[1] for r in rows][::-1]
    left = [0.0] * len(rows)
    for j, part in enumerate(splits[0].parts()):
        widths = [list(s.parts().values())[j] for s in splits]
        ax.barh(labels, widths, left=left, color=colors[j], label=part)
        left = [a + b for a, b in zip(left, widths)]
    for y, s in enumerate(splits):
        ax.text(s.step_ms, y, f" {s.step_ms:.2f} ms", va="center", fontsize=7)
    ax.set_xlim(0, 1.18 * max(s.step_ms for s in splits))
    ax.set_xlabel("ms per decode step (measured without the profiler)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45 * 4 / (len(rows) + 3)), ncol=3, frameon=False)
    return ax


def roofline_share(rows, ax=None, title: str = ""):
    """Horizontal bars of tokens/s as % of the roofline (linear, 0-100%): rows of
    (label, tokens/s, roofline tokens/s, source), source "measured here" or a committed file's name."""
    ax = ax or plt.gca()
    labels = [r[0] for r in rows][::-1]
    pct = [100 * r[1] / r[2] for r in rows][::-1]
    here = [r[3] == "measured here" for r in rows][::-1]
    ax.barh(labels, pct, color=["#2e86c1" if h else "#aab7b8" for h in here])
    for y, (p, r) in enumerate(zip(pct, rows[::-1])):
        ax.text(p, y, f" {r[1]:,.0f} of {r[2]:,.0f} tok/s ({p:.1f}%)" + ("" if r[3] == "measured here" else f", {r[3]}"),
                va="center", fontsize=7)
    ax.set_xlim(0, 100)
    ax.axvline(100, color="black", lw=0.8)
    ax.set_xlabel("% of the roofline (bytes a step must move / measured copy bandwidth)")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    return ax
