"""What the tuning file's batch-1 projection winners say about a GEMV's speed (notebook 06).

Two models of a winner's achieved bandwidth, each from numbers the notebook shows:

* Little's law: bandwidth = min(copy bandwidth, bytes requested in flight / memory latency);
* a fixed cost per kernel: time = fixed + bytes / stream bandwidth, so bandwidth = bytes / time.

The first asks whether a blocking keeps enough bytes requested; the second whether a kernel is
long enough to hide what it pays before and after its stream.
"""

from __future__ import annotations

import math
from typing import Any

BF16_BYTES = 2


def weight_bytes(key: dict[str, Any]) -> int:
    """Bytes of bf16 weights one projection of a tuning-file key streams (every row block)."""
    return key["n"] * key["row_blocks"] * key["k"] * BF16_BYTES


def requested_per_sm(key: dict[str, Any], config: dict[str, Any], sms: int) -> float:
    """Bytes a blocking's programs have requested per SM with every program resident: one
    [block_n, block_k] tile per row block per program, over every program of the launch."""
    if sms < 1:
        raise ValueError(f"sms must be >= 1, got {sms}")
    tile = config["block_n"] * config["block_k"] * key["row_blocks"] * BF16_BYTES
    programs = (math.ceil(key["n"] / config["block_n"]) * config["split_k"]
                * math.ceil(min(key["m_bucket"], 64) / config["block_m"]))
    return tile * programs / sms


def batch1_winners(tuning_file: dict[str, Any], sms: int) -> list[dict[str, Any]]:
    """The batch-1 chain-timed projection winners (LM heads' argmax variants left out), largest
    first: ops, us (the winner's time in its chain), bytes, achieved bytes/s, requested per SM, cfg."""
    pts = []
    for e in tuning_file["linear"]:
        k, c = e["key"], e["config"]
        if k["m_bucket"] != 1 or k["argmax"] or e.get("method") != "chain":
            continue
        us = e["us"]["tuned"]
        nbytes = weight_bytes(k)
        pts.append(dict(ops=", ".join(e["ops"]), us=us, bytes=nbytes, bytes_per_s=nbytes / (us * 1e-6),
                        requested_per_sm=requested_per_sm(k, c, sms), cfg=c))
    if not pts:
        raise ValueError("the tuning file has no batch-1 chain-timed projection: run `python -m labkit tune`")
    return sorted(pts, key=lambda p: -p["bytes"])


def littles_law_bytes_per_s(requested_per_sm: float, sms: int, latency_s: float, copy_bytes_per_s: float) -> float:
    """Bandwidth Little's law allows with these bytes requested on every SM."""
    if latency_s <= 0:
        raise ValueError(f"latency must be > 0, got {latency_s}")
    return min(copy_bytes_per_s, requested_per_sm * sms / latency_s)


def fixed_cost_bytes_per_s(nbytes: float, fixed_s: float, stream_bytes_per_s: float) -> float:
    """Bandwidth of a kernel that pays ``fixed_s`` besides streaming ``nbytes``."""
    if fixed_s < 0 or stream_bytes_per_s <= 0:
        raise ValueError(f"need fixed >= 0 and a positive bandwidth, got {fixed_s}, {stream_bytes_per_s}")
    return nbytes / (fixed_s + nbytes / stream_bytes_per_s)


def candidates_table(entry: dict[str, Any], geomean_ratio, limit: int = 12) -> tuple[str, int]:
    """A markdown table of a swept kernel's candidates (fastest first, the winner in bold) and how
    many candidates there were. ``geomean_ratio(us, base_us)`` scores a candidate against the first."""
    cands = [c for c in entry["candidates"] if not c.get("error")]
    if not cands:
        raise ValueError("every candidate of this kernel failed: nothing to tabulate")
    base = cands[0]["us"]
    score = {id(c): geomean_ratio(c["us"], base) for c in cands if set(c["us"]) == set(base)}
    win = entry["values"]
    rows = ["| settings | " + " | ".join(base) + " | vs first |", "| --- |" + " ---: |" * (len(base) + 1)]
    for c in sorted((c for c in cands if id(c) in score), key=lambda c: score[id(c)])[:limit]:
        mark = "**" if all(win.get(k) == v for k, v in c["values"].items()) else ""
        rows.append(f"| {mark}{', '.join(f'{k}={v}' for k, v in c['values'].items())}{mark} | "
                    + " | ".join(f"{c['us'][k]:.1f}" for k in base) + f" | {score[id(c)]:.3f} |")
    return "\n".join(rows), len(entry["candidates"])


def projection_growth_us(tuning_file: dict[str, Any], groups: list[dict[str, Any]], bucket: int) -> float:
    """Extra µs per step when a batch-1 step's projections run at batch bucket ``bucket``: for each
    group of a batch-1 chain (``chain.json``: key and kernels per step), the tuning file's time of
    what the step runs at that bucket (the fused kernel, or cuBLAS where it won) minus its batch-1 time."""
    def runs_us(key):
        e = next((e for e in tuning_file["linear"] if e["key"] == key), None)
        if e is None:
            raise KeyError(f"the tuning file has no entry for {key}: run `python -m labkit tune`")
        return e["us"]["torch"] if e.get("impl") == "torch" else e["us"]["tuned"]

    return sum(g["kernels"] * (runs_us(dict(g["key"], m_bucket=bucket)) - runs_us(g["key"])) for g in groups)


def heuristic_speedup(tuning_file: dict[str, Any], bucket: int) -> float:
    """Geometric mean over a batch bucket's projections of heuristic time / tuned time, as the
    tuning file records them: the most the linear tuning can buy a step at that batch."""
    pairs = [(e["us"]["heuristic"], e["us"]["tuned"]) for e in tuning_file["linear"]
             if e["key"]["m_bucket"] == bucket and "heuristic" in e["us"]]
    if not pairs:
        raise KeyError(f"the tuning file has no projection with a heuristic time at batch bucket {bucket}")
    return math.exp(sum(math.log(h / t) for h, t in pairs) / len(pairs))
