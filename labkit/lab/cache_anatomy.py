"""Chapter 03's anatomy figure: what each kind of layer keeps, counted from the cache's buffers
(:func:`labkit.cache.bytes_by_kind`, on the meta device: nothing is allocated)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..cache import LAYER_KINDS, bytes_by_kind

STYLES = {"attention KV": "-", "conv window": ":", "GDN conv window": "--", "GDN state": "-."}


def cache_bytes_figure(presets: dict, contexts=(256, 1024, 4096, 16384, 65536), batches=(1, 4, 16, 64),
                       batch_context: int = 4096, width: float = 10.0):
    """Left: MiB per sequence by what holds them against context (batch 1); right: the whole cache in
    GiB against batch at ``batch_context`` tokens. Log-log: both span orders of magnitude. Returns the figure."""
    if not presets:
        raise ValueError("no presets to draw")
    fig, (left, right) = plt.subplots(1, 2, figsize=(width, 3.8))
    for name, cfg in presets.items():
        for kind in LAYER_KINDS:
            ys = [bytes_by_kind(cfg, 1, n)[kind] / 2**20 for n in contexts]
            if any(ys):
                left.plot(contexts, ys, STYLES.get(kind, "-"), marker="o", label=f"{name}: {kind}")
        totals = [sum(bytes_by_kind(cfg, b, batch_context).values()) / 2**30 for b in batches]
        right.plot(batches, totals, marker="o", label=name)
    left.set(xscale="log", yscale="log", xlabel="context (tokens), batch 1", ylabel="MiB (bf16 weights)")
    left.set_title("cache bytes per sequence, by what holds them", fontsize=10)
    left.legend(fontsize=8)
    right.set(xscale="log", yscale="log", xlabel="batch", ylabel="GiB")
    right.set_title(f"whole cache at {batch_context:,} tokens", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
