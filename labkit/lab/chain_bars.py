"""The whole-chain benchmark's rows (``python -m labkit bench chain``: every projection of a step
and the LM head, weights only, one CUDA graph) as labelled bars, one panel per model."""

from __future__ import annotations

import re

PLAIN = "plain Triton GEMV, pointer loads"
COLOURS = {"linear": "#2e86c1", "cuda-tma": "#d9534f"}


def chain_label(r: dict) -> str:
    """A chain.json row's name on the page: which GEMV, and its PDL placement."""
    if r["gemv"] == "linear":
        return "labkit linear" + (f" + PDL {r['placement']}" if r["pdl"] else ", no PDL")
    m = re.fullmatch(r"tma-(\d+)x(\d+)s(\d+)", r["gemv"])
    name = {"plain": PLAIN, "plain-tma": "plain Triton GEMV, TMA descriptors 32x256, 3 stages",
            "cuda-tma": "CUDA + TMA kernel", "cublas": "cuBLAS", "step": "labkit linear, the step's fusions"}.get(
        r["gemv"], r["gemv"])
    if m:
        name = f"plain Triton GEMV, TMA descriptors {m[1]}x{m[2]}, {m[3]} stages"
    return name + (" + PDL" if r["pdl"] else "")


def chain_rows(chain_rows_, tma_chain_rows, model: str, batch: int = 1) -> list[tuple[str, float, str]]:
    """(label, ms, colour) per chain of ``model`` at ``batch``, fastest first; the CUDA kernel's chains
    come from tma-chain.json where chain.json has none."""
    rows = [(chain_label(r), r["ms"], COLOURS.get(r["gemv"], "#e8a33d" if "tma" in r["gemv"] else "#7f8c8d"))
            for r in chain_rows_ if r["model"] == model and r["batch"] == batch]
    if not any(r["gemv"] == "cuda-tma" for r in chain_rows_):
        rows += [("CUDA + TMA kernel, " + r["impl"].removeprefix("cuda-tma ").replace("+pdl", "+ PDL"), r["ms"], "#d9534f")
                 for r in tma_chain_rows if r["model"] == model and r["batch"] == batch and r["impl"].startswith("cuda-tma")]
    if not rows:
        raise ValueError(f"no chain rows for {model} at batch {batch}")
    return sorted(rows, key=lambda t: t[1])


def plot_chain(ax, rows, floor_ms: float, title: str):
    """Bars of ``rows`` (from :func:`chain_rows`) with the bytes-at-copy-bandwidth floor."""
    ax.barh(range(len(rows)), [ms for _, ms, _ in rows], color=[c for _, _, c in rows])
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    ax.axvline(floor_ms, color="black", ls="--", lw=1)
    ax.text(floor_ms, len(rows) - 0.5, " bytes / copy bandwidth", fontsize=8)
    for i, (_, ms, _) in enumerate(rows):
        ax.text(ms, i, f" {ms:.3f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="ms per chain (one CUDA graph)", xlim=(0, max(ms for _, ms, _ in rows) * 1.22), title=title)
    return ax
