"""Figures of how a fused kernel's work maps onto programs (notebook 02), and of its measurements.

Each diagram is drawn from the same numbers the kernel launches with (block sizes, split, grid),
so changing a configuration changes the picture: a program's share of the work is a colour.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from .plots import COLORS


def _program_colors(ids: np.ndarray, ax, extent, cmap: str = "tab20"):
    """Draw an integer program-id image; neighbours get different colours (cyclic colormap)."""
    ax.imshow(ids % 20, cmap=cmap, vmin=0, vmax=19, aspect="auto", interpolation="nearest", extent=extent)


def gemv_tiles(n: int, k: int, block_n: int, block_k: int, split_k: int = 1, *, ax=None, sms: int | None = None,
               title: str = "", tiles_shown: int = 16):
    """The [N, K] weight of one projection, coloured by the program that streams each element:
    row tiles of ``block_n`` outputs, K cut into ``split_k`` slices (each a whole number of
    ``block_k`` steps). The input row x sits on top; every program reads the slice of x it needs.
    Only the first ``tiles_shown`` row tiles are drawn (the rest repeat them), so each is visible."""
    ax = ax or plt.gca()
    k_per_split = -(-(-(-k // split_k)) // block_k) * block_k
    tiles = -(-n // block_n)
    n_all, n = n, min(n, tiles_shown * block_n)
    rows = np.arange(n)[:, None] // block_n
    cols = np.minimum(np.arange(k)[None, :] // k_per_split, split_k - 1)
    _program_colors(rows * split_k + cols, ax, extent=(0, k, n, 0))
    for s in range(1, split_k):
        ax.axvline(s * k_per_split, color="black", lw=1.2)
    ax.add_patch(Rectangle((0, -0.08 * n), k, 0.05 * n, color=COLORS["projections"], clip_on=False))
    ax.text(k / 2, -0.055 * n, "x (the K inputs, read by every program)", ha="center", va="center",
            fontsize=7, color="white")
    programs = tiles * split_k
    note = f"{tiles} row tiles x {split_k} K-splits = {programs} programs"
    if sms:
        note += f" on {sms} SMs ({programs / sms:.1f} per SM)"
    ax.set_title(title + ("\n" if title else "") + note, fontsize=8)
    ax.set_xlabel(f"K (input features; one step reads block_k = {block_k} of them)")
    ax.set_ylabel(f"outputs {0}-{n - 1} of {n_all}\n(a program owns block_n = {block_n})")
    ax.set_ylim(n, -0.1 * n)
    return ax


def delta_state_blocks(dk: int, dv: int, block_v: int, heads: int = 2, *, ax=None, sms: int | None = None,
                       batch: int = 1, num_heads: int | None = None):
    """The float32 state S [dk, dv] of ``heads`` value heads side by side, coloured by program: each
    program owns ``block_v`` columns of one head, reads them once and writes them once; q and k
    (length dk) are shared by all programs of a head, each column block needs its own v slice."""
    ax = ax or plt.gca()
    cols = np.arange(heads * dv)
    ids = (cols // dv) * (-(-dv // block_v)) + (cols % dv) // block_v
    _program_colors(np.broadcast_to(ids[None, :], (dk, heads * dv)), ax, extent=(0, heads * dv, dk, 0), cmap="tab20")
    for h in range(1, heads):
        ax.axvline(h * dv, color="black", lw=2)
    for h in range(heads):
        ax.text(h * dv + dv / 2, 0.08 * dk, f"head {h}: S is {dk} x {dv} float32 ({dk * dv * 4 // 1024} KB)",
                ha="center", va="center", fontsize=7, color="white", backgroundcolor="#00000080")
    per_head = -(-dv // block_v)
    total = batch * (num_heads or heads) * per_head
    note = f"block_v = {block_v}: {per_head} programs per head"
    if num_heads:
        note += f"; batch {batch} x {num_heads} heads -> {total} programs"
        if sms:
            note += f" on {sms} SMs"
    ax.set_title(note, fontsize=8)
    ax.set_xlabel("value columns (dv per head)")
    ax.set_ylabel("key rows (dk)")
    ax.set_ylim(dk, -0.02 * dk)
    return ax


def flash_decoding_chunks(length: int, max_len: int, chunk: int, *, ax=None):
    """The KV cache of one sequence and kv head, cut into chunks of ``chunk`` positions, one program
    each: chunks holding cached tokens stream them and leave (max, sum, partial output); chunks
    past the length return at once; the last program to finish merges the partials."""
    ax = ax or plt.gca()
    n_chunks = -(-max_len // chunk)
    for c in range(n_chunks):
        lo = c * chunk
        active = lo <= length
        ax.add_patch(Rectangle((lo, 0), min(chunk, max_len - lo), 1, facecolor=COLORS["kv"] if active else "#e5e5e5",
                               edgecolor="white", lw=1.5))
    ax.add_patch(Rectangle((0, 0), length, 0.18, color="black", alpha=0.6))
    ax.text(length / 2, 0.09, f"{length:,} cached positions", ha="center", va="center", fontsize=7, color="white")
    active = sum(c * chunk <= length for c in range(n_chunks))
    ax.add_patch(Rectangle((max_len * 0.1, 1.6), max_len * 0.8, 0.65, color=COLORS["attention"], alpha=0.35))
    ax.text(max_len * 0.5, 1.9, "last program merges the chunks' (m_c, l_c, acc_c):\n"
            "m = max m_c,  l = sum exp(m_c - m) l_c,  o = sum exp(m_c - m) acc_c / l", ha="center", va="center", fontsize=7)
    for c in range(active):
        ax.add_patch(FancyArrowPatch((c * chunk + chunk / 2, 1.02), (max_len * 0.5, 1.58), arrowstyle="-|>",
                                     mutation_scale=7, lw=0.6, color="#555555"))
    ax.set_xlim(0, max_len)
    ax.set_ylim(0, 2.4)
    ax.set_yticks([])
    ax.set_xlabel(f"cache position ({n_chunks} chunks of {chunk}; {active} hold tokens,\n"
                  "grey ones would return at once)")
    return ax


def conv_window(kw: int, *, ax=None):
    """LFM2's short conv at decode: the window of kw - 1 stored values and the new B*x, weighted and
    summed; then the window shifts by one, in place, in the same program."""
    ax = ax or plt.gca()
    labels = [f"state[{j}]" for j in range(kw - 1)] + ["B*x (new)"]
    for j, label in enumerate(labels):
        ax.add_patch(Rectangle((j, 1), 0.9, 0.6, color=COLORS["conv"] if j < kw - 1 else COLORS["projections"]))
        ax.text(j + 0.45, 1.3, label, ha="center", va="center", fontsize=7)
        ax.text(j + 0.45, 0.85, f"x w[{j}]", ha="center", va="center", fontsize=7)
    ax.text(kw / 2, 0.45, "y = C * sum_j w[j] u_j   (u = the window)", ha="center", fontsize=8)
    for j in range(1, kw):
        ax.add_patch(FancyArrowPatch((j + 0.45, 1.62), (j - 0.55, 1.62), connectionstyle="arc3,rad=-0.5",
                                     arrowstyle="-|>", mutation_scale=7, lw=0.8))
    ax.text(kw / 2, 2.15, "then shift: state[j] <- u[j+1]  (the oldest value drops out)", ha="center", fontsize=8)
    ax.set_xlim(-0.2, kw + 0.2)
    ax.set_ylim(0.2, 2.4)
    ax.axis("off")
    return ax


def fixed_cost_fit(points: Sequence[tuple[float, float]], t0_us: float, fit_bytes_per_s: float,
                   copy_bytes_per_s: float, *, ax=None, extra: Sequence[tuple[float, float, str]] = ()):
    """Measured (bytes, µs) of kernels timed alone as dots; the fitted ``t0 + bytes / BW`` as a line;
    the prediction from the copy bandwidth alone (no fixed cost) dashed. ``extra``: labelled points
    outside the fit (drawn as crosses)."""
    ax = ax or plt.gca()
    xs = [b for b, _ in points] + [b for b, _, _ in extra]
    grid = np.geomspace(min(xs) / 2, max(xs) * 1.5, 100)
    ax.plot(grid / 1e6, t0_us + grid / fit_bytes_per_s * 1e6, color="black", lw=1.2,
            label=f"fit: {t0_us:.2f} µs + bytes / {fit_bytes_per_s / 1e12:.2f} TB/s")
    ax.plot(grid / 1e6, grid / copy_bytes_per_s * 1e6, color="grey", ls="--", lw=1,
            label=f"prediction: bytes / copy bandwidth ({copy_bytes_per_s / 1e12:.2f} TB/s)")
    ax.scatter([b / 1e6 for b, _ in points], [t for _, t in points], color=COLORS["projections"], zorder=3,
               label="measured, each kernel alone in a graph")
    for b, t, label in extra:
        ax.scatter([b / 1e6], [t], marker="x", color=COLORS["lm_head"], zorder=3)
        ax.annotate(label, (b / 1e6, t), textcoords="offset points", xytext=(-4, 6), ha="right", fontsize=7)
    ax.set_xlabel("weight bytes streamed by the kernel (MB)")
    ax.set_ylabel("µs per call")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper left")
    return ax


def overlap_timeline(runs: dict[str, Sequence[dict]], *, ax=None, first: int = 14):
    """The first ``first`` kernels of a step per run (label -> spans with start_us, dur_us, family),
    at their true start and width; consecutive kernels alternate between two lanes, so a kernel
    that starts before its predecessor ends is seen overlapping it."""
    ax = ax or plt.gca()
    yticks, ylabels = [], []
    for r, (label, spans) in enumerate(runs.items()):
        spans = sorted(spans, key=lambda s: s["start_us"])[:first]
        base = r * 3
        for i, s in enumerate(spans):
            y = base + (i % 2) * 1.0
            ax.broken_barh([(s["start_us"], s["dur_us"])], (y, 0.8),
                           facecolors=COLORS.get(s.get("family", "other"), COLORS["other"]), edgecolor="black", lw=0.3)
        yticks.append(base + 0.9)
        ylabels.append(label)
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xlabel("µs from the step's first kernel (profiler timestamps; each bar is one kernel)")
    return ax


def tma_pipeline_schedule(stages: int, boxes: int, latency_us: float, transfer_us: float,
                          consume_us: float) -> list[dict]:
    """When each box of one block's weight stream is issued, lands and is consumed, in a model of
    the producer/consumer pipeline of kernels/tma_gemv.cu with ``stages`` shared-memory slots:

    - the producer issues box i as soon as its slot is free: at once for the first ``stages`` boxes,
      else when the consumers have finished box i - stages (the ``empty`` barrier);
    - box i lands ``latency_us`` after its issue, and no sooner than ``transfer_us`` after box i - 1
      landed (the block's share of the memory bandwidth: bytes per box / bytes per µs);
    - the consumers start box i when it has landed (the ``full`` barrier) and they are done with
      box i - 1, and take ``consume_us``.

    Returns one dict per box: issue, land, start, end (µs). Steady state: one box per
    max(consume, transfer, (latency + consume) / stages) µs (a slot is busy for its copy's round
    trip and the consumers' work on it)."""
    if stages < 1 or boxes < 1 or min(latency_us, transfer_us, consume_us) < 0:
        raise ValueError("need stages >= 1, boxes >= 1 and non-negative times")
    rows: list[dict] = []
    for i in range(boxes):
        issue = rows[i - stages]["end"] if i >= stages else 0.0
        land = issue + latency_us
        if i:
            issue = max(issue, rows[i - 1]["issue"])
            land = max(issue + latency_us, rows[i - 1]["land"] + transfer_us)
        start = max(land, rows[i - 1]["end"] if i else 0.0)
        rows.append({"issue": issue, "land": land, "start": start, "end": start + consume_us})
    return rows


def tma_pipeline(stages: int, boxes: int, latency_us: float, transfer_us: float, consume_us: float,
                 box_bytes: int, *, ax=None, title: str = ""):
    """:func:`tma_pipeline_schedule` drawn: per box, the copy in flight (issue to land, in its
    stage's lane) and the consumers' work on it; the title gives the block's steady rate."""
    ax = ax or plt.gca()
    sched = tma_pipeline_schedule(stages, boxes, latency_us, transfer_us, consume_us)
    for i, r in enumerate(sched):
        lane = i % stages
        ax.broken_barh([(r["issue"], r["land"] - r["issue"])], (stages - lane + 0.6, 0.8),
                       facecolors=COLORS["weights"], alpha=0.35 + 0.5 * (i % 2), edgecolor="black", lw=0.3)
        ax.broken_barh([(r["start"], r["end"] - r["start"])], (0, 0.8), facecolors=COLORS["mlp"],
                       edgecolor="black", lw=0.3)
        if i < 2 * stages:
            ax.text(r["issue"], stages - lane + 1.0, f" box {i}", va="center", fontsize=6)
    span = stages * max(1, (len(sched) // 2) // stages)  # whole rounds of the ring, from the end
    period = (sched[-1]["end"] - sched[-1 - span]["end"]) / span if len(sched) > span else float("nan")
    rate = box_bytes / period / 1e3 if period > 0 else float("inf")  # bytes per µs -> GB/s
    ax.set_yticks([0.4] + [stages - s + 1.0 for s in range(stages)],
                  ["consumer warps\n(mma on the box)"] + [f"stage {s}: copy in flight" for s in range(stages)], fontsize=7)
    ax.set_xlabel("µs from the block's first issue")
    ax.set_title((title + ": " if title else "") + f"{stages} stage(s): one {box_bytes // 1024} KB box every "
                 f"{period:.2f} µs = {rate:.1f} GB/s per block", fontsize=8)
    return rate


def stamped_timeline(rows: Sequence[dict], *, ax=None, title: str = ""):
    """Kernels from global-timer stamps (:func:`labkit.bench.chain.timeline`): per kernel a hatched
    bar from its first program's start to the first that got past ``griddepcontrol.wait`` (waiting
    for the previous kernel), then a solid bar to its last program's end (streaming its weight)."""
    ax = ax or plt.gca()
    for i, r in enumerate(rows):
        y = len(rows) - 1 - i
        wait = max(0.0, r["first_past_wait_us"] - r["first_start_us"])
        if wait > 0:
            ax.broken_barh([(r["first_start_us"], wait)], (y, 0.8), facecolors="white", edgecolor=COLORS["norm"],
                           hatch="////", lw=0.5)
        ax.broken_barh([(r["first_past_wait_us"], r["last_end_us"] - r["first_past_wait_us"])], (y, 0.8),
                       facecolors=COLORS["mlp"] if "mlp" in r["op"] else COLORS["projections"], edgecolor="black", lw=0.3)
    ax.set_yticks([len(rows) - 1 - i + 0.4 for i in range(len(rows))],
                  [f"{r['op']} ({r['bytes'] / 1e6:.1f} MB)" for r in rows], fontsize=6)
    ax.set_xlabel("µs from the first kernel's start (GPU global timer)")
    ax.set_title(title, fontsize=9)
    return ax
