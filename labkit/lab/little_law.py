"""Little's law for a memory stream: bytes in flight = bandwidth x latency, with the latencies a
pointer chase measures (``python -m labkit bench latency``) and the figure that draws them.

A chase times one load at a time on an idle GPU: the shortest round trip there is. A stream at full
bandwidth queues its requests in the memory system, so each one takes longer, and Little's law then
asks for more bytes in flight. The idle latency therefore gives a floor on the bytes a kernel must
keep in flight; a latency under load gives the figure to size a kernel for.
"""

from __future__ import annotations

import math


def bytes_in_flight(latency_ns: float, bytes_per_s: float) -> float:
    """Bytes that must be requested and not yet returned, at every moment, to sustain ``bytes_per_s``
    when each request takes ``latency_ns`` to come back."""
    if not (latency_ns > 0 and bytes_per_s > 0):
        raise ValueError(f"latency and bandwidth must be positive, got {latency_ns} ns and {bytes_per_s} B/s")
    return latency_ns * 1e-9 * bytes_per_s


def latency_ns(rows, pattern: str, style: str, size: int | None = None) -> float:
    """The chase's ns per load for one (pattern, style) at table size ``size`` (None: the largest table);
    an absent row is an error naming what is there."""
    ok = [r for r in rows if r["pattern"] == pattern and r["style"] == style and not r["error"]
          and (size is None or r["nbytes"] == size)]
    if not ok:
        have = sorted({(r["pattern"], r["style"], r["nbytes"]) for r in rows if not r["error"]})
        raise KeyError(f"no latency row for {pattern}/{style} at {size or 'the largest'} bytes; have {have}")
    return max(ok, key=lambda r: r["nbytes"])["ns_per_load"]


def blocks_to_cover(bytes_per_sm: float, stages: int, box_bytes: int) -> int:
    """Resident blocks per SM whose ``stages`` boxes in flight add up to ``bytes_per_sm``."""
    if stages < 1 or box_bytes < 1:
        raise ValueError(f"stages and box bytes must be positive, got {stages} and {box_bytes}")
    return max(1, math.ceil(bytes_per_sm / (stages * box_bytes)))


def plot_latency(ax, committed, live=(), l2_bytes: float | None = None, live_label: str = "this run"):
    """ns per dependent load against table size: random chains as lines, stride chains as stars;
    the committed rows filled, this run's rows open."""
    for rows, where, filled in ((committed, "H200, committed", True), (live, live_label, False)):
        for style, color in (("pointer", "#2e86c1"), ("descriptor", "#d9534f")):
            pts = sorted((r["nbytes"], r["ns_per_load"]) for r in rows
                         if r["pattern"] == "random" and r["style"] == style and not r["error"])
            if pts:
                ax.plot([p[0] / 2**20 for p in pts], [p[1] for p in pts], "o-" if filled else "s--", color=color,
                        mfc=color if filled else "white", label=f"random chain, {style} loads ({where})")
            st = [(r["nbytes"], r["ns_per_load"]) for r in rows
                  if r["pattern"] == "stride" and r["style"] == style and not r["error"]]
            if st:
                ax.scatter([p[0] / 2**20 for p in st], [p[1] for p in st], marker="*", s=110, color=color,
                           edgecolor="black" if filled else color, zorder=3,
                           label=f"stride chain, {style} loads ({where})")
    ax.set(xscale="log", xlabel="table size (MiB; one chain through all of it)", ylabel="ns per dependent load",
           ylim=(0, None), title="load latency by memory level: one warp, one load at a time")
    if l2_bytes:
        ax.axvline(l2_bytes / 2**20, color="grey", ls=":", lw=1)
        ax.text(l2_bytes / 2**20, ax.get_ylim()[1] * 0.92, " L2 size", fontsize=8, color="grey")
    ax.legend(fontsize=8, loc="upper left")
    return ax
