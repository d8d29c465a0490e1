"""Time against bytes for a weight stream: the fit t = t0 + B / BW_fit per implementation, where it
reaches half a bandwidth, and the check of a fitted rate above the copy bandwidth.

The copy bandwidth (``hw.json``) counts the bytes a copy kernel reads and writes; a GEMV only reads.
A rate above it is therefore possible without any cache hit, and the check says which it is from
numbers alone: the largest projection's own rate (bytes / its whole time, fixed part included: a
lower bound on its stream rate) set beside its size against the L2.
"""

from __future__ import annotations

from ..bench.chain import KernelFit, fit_per_kernel


def fit_rows(rows) -> KernelFit:
    """The least-squares fit of ``us`` on ``weight_bytes`` over tma-gemv style rows."""
    return fit_per_kernel([r["weight_bytes"] for r in rows], [r["us"] for r in rows])


def half_bandwidth_bytes(fit: KernelFit, bytes_per_s: float) -> float:
    """The size B at which B / (t0 + B / BW_fit) = bytes_per_s / 2; inf when the fit streams too slowly
    to ever reach it."""
    denom = 2 / bytes_per_s - 1 / fit.bytes_per_s
    return float("inf") if denom <= 0 else fit.t0_us * 1e-6 / denom


def fits_table(fits: dict, bytes_per_s: float) -> str:
    """Markdown: one row per (implementation, batch) fit."""
    rows = ["| batch | implementation | intercept t0 (µs) | streaming rate (TB/s) | r² | half the copy bandwidth at |",
            "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for (impl, b), f in fits.items():
        rows.append(f"| {b} | {impl} | {f.t0_us:.2f} | {f.bytes_per_s / 1e12:.2f} | {f.r2:.3f} | "
                    f"{half_bandwidth_bytes(f, bytes_per_s) / 1e6:,.1f} MB |")
    return "\n".join(rows)


def above_copy_check(rows, copy_bytes_per_s: float, l2_bytes: float) -> dict:
    """For rows of one implementation and batch: the largest shape's own rate (``own_bytes_per_s``,
    fixed cost included), how many times the L2 it is (``l2_multiple``), the most of it a warm L2
    could serve (``l2_share_max``), the slope between the two largest shapes (``top_slope_bytes_per_s``),
    and whether its own rate is above the copy bandwidth (``own_above_copy``)."""
    ok = sorted((r for r in rows if not r["error"]), key=lambda r: r["weight_bytes"])
    if len(ok) < 2:
        raise ValueError("the check needs at least two shapes")
    a, b = ok[-2], ok[-1]
    own = b["weight_bytes"] / (b["us"] * 1e-6)
    slope = (b["weight_bytes"] - a["weight_bytes"]) / ((b["us"] - a["us"]) * 1e-6)
    return {"largest": b, "own_bytes_per_s": own, "l2_multiple": b["weight_bytes"] / l2_bytes,
            "l2_share_max": min(1.0, l2_bytes / b["weight_bytes"]), "top_slope_bytes_per_s": slope,
            "own_above_copy": own > copy_bytes_per_s, "copy_bytes_per_s": copy_bytes_per_s}


def plot_stream_rates(ax, rows, fits: dict, batch: int, impls: dict, best_rows=(), live_rows=(), latency_ns: float = 0.0,
                      copy_bytes_per_s: float = 0.0, live_label: str = "this run"):
    """TB/s of weight bytes against size at ``batch``: each implementation's points and fit line
    (``impls``: name -> (label, colour); ``fits``: (name, batch) -> KernelFit), the sweep's best
    config per shape (crosses), this run's points (open diamonds), and the prediction of one latency
    + bytes at the copy bandwidth."""
    import numpy as np

    grid = np.geomspace(1e6, 6e8, 120)
    for impl, (label, color) in impls.items():
        pts = sorted((r["weight_bytes"], r["gb_per_s"]) for r in rows if r["impl"] == impl and r["batch"] == batch and not r["error"])
        ax.scatter([p[0] / 1e6 for p in pts], [p[1] / 1e3 for p in pts], color=color, s=18, zorder=3, label=f"{label}, measured")
        f = fits[impl, batch]
        ax.plot(grid / 1e6, grid / (f.t0_us * 1e-6 + grid / f.bytes_per_s) / 1e12, color=color, lw=1,
                label=f"fit {f.t0_us:.1f} µs + B / {f.bytes_per_s / 1e12:.2f} TB/s")
    if best_rows:
        ax.scatter([r["weight_bytes"] / 1e6 for r in best_rows], [r["gb_per_s"] / 1e3 for r in best_rows], marker="x",
                   color="#d9534f", label="CUDA + TMA, fastest config of the sweep per shape")
    for r in live_rows:
        ax.scatter([r["weight_bytes"] / 1e6], [r["gb_per_s"] / 1e3], marker="D", facecolor="none",
                   edgecolor=impls[r["impl"]][1], s=60, zorder=4)
    if live_rows:
        ax.scatter([], [], marker="D", facecolor="none", edgecolor="black", label=live_label)
    if latency_ns and copy_bytes_per_s:
        ax.plot(grid / 1e6, grid / (latency_ns * 1e-9 + grid / copy_bytes_per_s) / 1e12, color="black", ls="--", lw=1,
                label="prediction: one latency + B / copy bandwidth")
        ax.axhline(copy_bytes_per_s / 1e12, color="grey", ls=":", lw=1, label="copy bandwidth")
        ax.set_ylim(0, copy_bytes_per_s / 1e12 * 1.6)
    ax.set(xscale="log", xlabel="weight bytes of the projection (MB)", ylabel="TB/s of weight bytes",
           title=f"batch {batch}: one projection alone, L2-cold")
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    return ax


def best_share_by_stages(sweep_rows, config_of) -> dict[tuple[int, int], float]:
    """(batch, stages) -> geometric mean over shapes of (the shape's fastest time / the fastest time
    with that many stages): 1.0 where that stage count holds every shape's best config."""
    import math

    best, by = {}, {}
    for r in sweep_rows:
        if r["error"]:
            continue
        key = (r["n"], r["k"], r["batch"])
        best[key] = min(best.get(key, math.inf), r["us"])
        d = by.setdefault((r["batch"], config_of(r["config"]).stages), {})
        d[key] = min(d.get(key, math.inf), r["us"])
    return {bs: math.exp(sum(math.log(best[k] / v) for k, v in d.items()) / len(d)) for bs, d in sorted(by.items())}
