"""The workbook's figures: layer diagrams, byte budgets, rooflines, kernel timelines, waterfalls."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from ..config import ModelConfig
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


# -- notebook 00: byte budgets on linear axes, state against KV, copy-time fit, roofline with measurements
def byte_parts(cfg: ModelConfig, context: int) -> tuple[int, int, int]:
    """(weight bytes per step, KV bytes per sequence per step, fixed-state bytes per sequence per step)."""
    costs = layer_costs(cfg, context)
    weights = sum(c.weight_bytes for c in costs)
    kv = sum(c.state_bytes_per_seq for c in costs if c.kind == "attention")
    state = sum(c.state_bytes_per_seq for c in costs if c.kind in ("conv", "gdn"))
    return weights, kv, state


def bytes_per_token_linear(cfg: ModelConfig, batches: Sequence[int], context: int, ax_abs=None, ax_share=None):
    """Bytes moved per generated token, split into weights (shared by the batch), KV cache and
    fixed-size state (per sequence): absolute MB on a linear axis (no bar clipped), and each part's
    share of the total, where the point at which the cache and state take over stays visible."""
    weights, kv, state = byte_parts(cfg, context)
    xs = [str(b) for b in batches]
    parts = [
        ("weights (shared by the batch)", [weights / b for b in batches], COLORS["weights"]),
        (f"KV cache at {context:,} tokens", [kv] * len(batches), COLORS["kv"]),
        ("conv / delta-rule state", [state] * len(batches), COLORS["state"]),
    ]
    totals = [sum(p[1][i] for p in parts) for i in range(len(batches))]
    for ax, scale, unit in ((ax_abs, None, "MB moved per generated token"), (ax_share, totals, "share of the bytes per token (%)")):
        if ax is None:
            continue
        bottom = [0.0] * len(batches)
        for label, values, color in parts:
            ys = [v / 1e6 for v in values] if scale is None else [100 * v / t for v, t in zip(values, scale)]
            ax.bar(xs, ys, bottom=bottom, color=color, label=label)
            bottom = [a + b for a, b in zip(bottom, ys)]
        ax.set_ylim(0, max(bottom) * 1.08)
        ax.set_xlabel("batch size")
        ax.set_ylabel(unit)
        ax.set_title(f"{cfg.name}, context {context:,}", fontsize=9)
    (ax_abs or ax_share).legend(fontsize=7)
    return ax_abs, ax_share


def state_vs_context(configs: Sequence[ModelConfig], max_context: int, ax=None):
    """MB each sequence moves per step against its context: the attention layers' KV cache grows
    linearly, the conv windows and delta-rule state are flat; the crossing is marked."""
    ax = ax or plt.gca()
    xs = [round(max_context * i / 64) for i in range(65)]
    for cfg, ls in zip(configs, ("-", "--", "-.", ":")):
        kv = [byte_parts(cfg, L)[1] / 1e6 for L in xs]
        state = byte_parts(cfg, 0)[2] / 1e6
        ax.plot(xs, kv, color=COLORS["kv"], ls=ls, label=f"{cfg.name}: KV cache of its attention layers")
        ax.plot(xs, [state] * len(xs), color=COLORS["state"], ls=ls, label=f"{cfg.name}: conv / delta-rule state")
        cross = crossing_context(cfg)
        if 0 < cross <= max_context:
            ax.plot([cross], [state], marker="o", color="black", ms=5)
            ax.annotate(f"{cross:,} tokens", (cross, state), textcoords="offset points", xytext=(6, -12), fontsize=7)
    ax.set_xlim(0, max_context)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens already in the cache (context)")
    ax.set_ylabel("MB per sequence per decode step")
    ax.legend(fontsize=7)
    return ax


def crossing_context(cfg: ModelConfig) -> int:
    """The context at which one sequence's KV traffic first reaches its fixed-state traffic (0 if
    the model has no fixed state)."""
    _, kv0, state = byte_parts(cfg, 0)
    per_token = byte_parts(cfg, 1)[1] - kv0
    if state == 0 or per_token == 0:
        return 0
    return max(0, -(-(state - kv0) // per_token))


def copy_time_fit(rows, t0_us: float, bytes_per_s: float, ax=None, label: str = "measured",
                  predicted_bytes_per_s: float | None = None):
    """Per-kernel time of the copy sweep against bytes moved (log-log), measured points hollow, with
    the prediction bytes / bandwidth (dotted; ``predicted_bytes_per_s``, else the fit's) and the
    fitted, revised model t0 + bytes / bandwidth (dashed)."""
    ax = ax or plt.gca()
    predicted = predicted_bytes_per_s or bytes_per_s
    xs = [r.bytes if hasattr(r, "bytes") else r["bytes"] for r in rows]
    ys = [r.us if hasattr(r, "us") else r["us"] for r in rows]
    grid = [min(xs) * (max(xs) / min(xs)) ** (i / 50) for i in range(51)]
    ax.plot(grid, [b / predicted * 1e6 for b in grid], color="gray", ls=":", lw=1,
            label=f"prediction: bytes / {predicted / 1e12:.2f} TB/s")
    ax.plot(grid, [t0_us + b / bytes_per_s * 1e6 for b in grid], color="black", ls="--", lw=1,
            label=f"revised: {t0_us:.1f} µs + bytes / {bytes_per_s / 1e12:.2f} TB/s")
    ax.plot(xs, ys, ls="none", marker="o", mfc="none", color=COLORS["weights"], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes read + written by one kernel")
    ax.set_ylabel("µs per kernel")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def roofline_with_measurements(configs: Sequence[ModelConfig], bytes_per_s: float, flops_per_s: float,
                               batches: Sequence[int], context: int, measured: dict | None = None,
                               ax=None, roof_label: str = ""):
    """The roofline with each model's predicted decode steps drawn on the roof (small filled markers,
    dashed) and measured steps drawn where they landed (large hollow markers, labelled "measured").

    ``measured`` maps (model name, batch) -> (intensity in FLOP/byte, achieved FLOP/s). The roof
    spans every point drawn, from a third of the smallest intensity to three times the larger of
    the ridge and the largest intensity.
    """
    ax = ax or plt.gca()
    measured = measured or {}
    ridge = flops_per_s / bytes_per_s
    xs_all = [step_cost(c, b, context).intensity for c in configs for b in batches]
    xs_all += [v[0] for v in measured.values()]
    lo, hi = min(xs_all) / 3, max(ridge, max(xs_all)) * 3
    roof_x = [lo, ridge, hi]
    ax.plot(roof_x, [min(x * bytes_per_s, flops_per_s) / 1e12 for x in roof_x], color="black", lw=1.5,
            label=roof_label or f"roof: {bytes_per_s / 1e12:.2f} TB/s, {flops_per_s / 1e12:,.0f} TFLOP/s")
    ax.axvline(ridge, color="black", ls=":", lw=0.8)
    ax.annotate(f"ridge {ridge:,.0f} FLOP/byte", (ridge, flops_per_s / 1e12), textcoords="offset points",
                xytext=(-3, -6), ha="right", va="top", rotation=90, fontsize=7)
    for marker, cfg in zip("os^D", configs):
        pts = [step_cost(cfg, b, context) for b in batches]
        line, = ax.plot([p.intensity for p in pts], [min(p.intensity * bytes_per_s, flops_per_s) / 1e12 for p in pts],
                        marker=marker, ms=4, ls="--", lw=0.8,
                        label=f"{cfg.name} predicted (on the roof), batch {batches[0]}..{batches[-1]}")
        mine = sorted((b, v) for (name, b), v in measured.items() if name == cfg.name)
        if mine:
            ax.plot([v[0] for _, v in mine], [v[1] / 1e12 for _, v in mine], marker=marker, ms=9, mfc="none",
                    mew=1.5, ls="none", color=line.get_color(),
                    label=f"{cfg.name} measured, batch {', '.join(str(b) for b, _ in mine)}")
    ax.set_xlim(lo, hi)
    ys = [min(x * bytes_per_s, flops_per_s) / 1e12 for x in roof_x] + [v[1] / 1e12 for v in measured.values()]
    ax.set_ylim(min(ys) / 3, max(ys) * 3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16))
    return ax


ARTICLE_CLAIM_SKIPPED = 0.60  # the article's "-60% compute for stable contexts", drawn as its claim


def article_cache_curves(doc: dict, axes=None):
    """The article's two-level cache across reuse thresholds (a results file of ``bench article-cache``).

    Panels: the counted share of the cores' work skipped (trained checkpoints; the article's claim as
    a dashed line), the cost (logit relative RMS error and the held-out bits per byte added), the
    agreement with the exact path (top-1 per position, free-running greedy tokens), and decode tok/s
    relative to the exact path at the real shapes with random weights. Thresholds sit at even steps
    on the x axis (0 cannot go on a log axis), labelled with their values.
    """
    rows = [r for r in doc["results"] if not r.get("error")]
    quality = [dict(r, model=r["model"] if r.get("context", "held-out") == "held-out" else f"{r['model']}, {r['context']}")
               for r in rows if r["measure"] == "quality"]
    speed = [r for r in rows if r["measure"] == "speed"]
    thresholds = sorted({r["threshold"] for r in rows})
    pos = {t: i for i, t in enumerate(thresholds)}
    if axes is None:
        _, axes = plt.subplots(1, 4 if speed else 3, figsize=(16 if speed else 12.5, 3.6), constrained_layout=True)
    axes = list(axes)

    def curve(ax, rs, value, **kw):
        rs = sorted(rs, key=lambda r: r["threshold"])
        ax.plot([pos[r["threshold"]] for r in rs], [value(r) for r in rs], marker="o", **kw)

    models = sorted({r["model"] for r in quality})
    palette = ["#2e86c1", "#9b59b6", "#27ae60", "#d9534f", "#f0ad4e", "#34495e"]
    colors = {m: palette[i % len(palette)] for i, m in enumerate(models)}
    ax = axes[0]
    for m in models:
        rs = [r for r in quality if r["model"] == m]
        curve(ax, rs, lambda r: r["skipped_of_core"]["all"], color=colors[m], label=f"{m}: of the cores")
        curve(ax, rs, lambda r: r["skipped_of_step"], color=colors[m], ls=":", label=f"{m}: of the whole step")
    ax.axhline(ARTICLE_CLAIM_SKIPPED, color="k", ls="--", lw=1, label="article's claim (-60%)")
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of the work skipped (counted FLOPs)")
    ax.set_title("work skipped, trained checkpoints", fontsize=9)

    ax = axes[1]
    for m in models:
        rs = [r for r in quality if r["model"] == m]
        curve(ax, rs, lambda r: r["logit_rel_rms"], color=colors[m], label=f"{m}: logits, relative RMS error")
        curve(ax, rs, lambda r: r["bits_per_byte"] - r["bits_per_byte_exact"], color=colors[m], ls="--",
              label=f"{m}: held-out bits/byte added")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylabel("error against the exact path")
    ax.set_title("what it costs", fontsize=9)

    ax = axes[2]
    for m in models:
        rs = [r for r in quality if r["model"] == m]
        curve(ax, rs, lambda r: r["top1_agreement"], color=colors[m], label=f"{m}: top-1, teacher-forced")
        curve(ax, rs, lambda r: r["greedy_agreement"], color=colors[m], ls="--", label=f"{m}: greedy tokens")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("agreement with the exact path")
    ax.set_title("same tokens?", fontsize=9)

    if speed:
        ax = axes[3]
        for i, m in enumerate(sorted({r["model"] for r in speed})):
            rs = [r for r in speed if r["model"] == m]
            curve(ax, rs, lambda r: r["tokens_per_s"] / r["tokens_per_s_exact"], color=["#f0ad4e", "#34495e"][i % 2],
                  label=f"{m}: tok/s / exact")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("decode tok/s relative to the exact path")
        ax.set_title(f"speed, real shapes, random weights ({doc.get('gpu') or 'cpu'})", fontsize=9)

    for ax in axes:
        ax.set_xticks(range(len(thresholds)), [f"{t:g}" for t in thresholds])
        ax.set_xlabel("reuse threshold (change of the gates vs their EMA)")
        ax.legend(fontsize=6)
    return axes


def prefill_vs_length(rows, ax=None, title: str = ""):
    """Prefill milliseconds against prompt length, one line per implementation (results rows with
    impl, tokens, ms; failed rows left out), log-log so that linear cost is a slope of one."""
    ax = ax or plt.gca()
    impls = sorted({r["impl"] for r in rows})
    for impl in impls:
        pts = sorted((r["tokens"], r["ms"]) for r in rows if r["impl"] == impl and r.get("ms") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("prefill ms (median, measured)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=7)


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
