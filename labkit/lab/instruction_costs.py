"""Where a persistent decode step's time goes, from its stamped timeline
(``python -m labkit bench persistent-timeline``): how tiles are dealt to programs, what each
instruction adds to the step, and the fitted cost model

    t_added ≈ a + b · (rounds − 1) + c · t_bytes,   rounds = the most tiles any one program runs,

where t_bytes is the instruction's bytes at the copy bandwidth.
"""

from __future__ import annotations

import numpy as np

from ..ops.persistent_decode import LINEAR_OPS

KINDS = {"conv_in": "in_proj + conv", "proj_in": "in_proj", "gate_up": "gate_up + SwiGLU", "head_argmax": "LM head + argmax",
         "head_logits": "LM head", "gdn": "GDN step", "attention": "attention"}


def tiles_per_program(rows, programs: int) -> np.ndarray:
    """[instructions, programs] tile counts: tile t of instruction i runs on program (f_i + t) mod G,
    f_i the tiles of all earlier instructions mod G."""
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")
    out, first = [], 0
    for r in rows:
        counts = np.zeros(programs, dtype=int)
        np.add.at(counts, (first + np.arange(r["tiles"])) % programs, 1)
        out.append(counts)
        first = (first + r["tiles"]) % programs
    return np.array(out)


def kind(row) -> str:
    """The instruction's kind, for grouping (the residual projections split into out_proj and down)."""
    if row["op"] == "residual":
        return "down + residual" if "down" in row["instruction"] else "out_proj + residual"
    return KINDS.get(row["op"], row["op"])


def added_per_kind(rows, deal: np.ndarray) -> dict[str, dict]:
    """Per kind: count ``n``, ``added`` µs (how much later each instruction's last tile ends than the
    previous one's), ``roof`` µs (bytes at the copy bandwidth) and the most ``rounds`` of one of them."""
    prev, acc = 0.0, {}
    for r, d in zip(rows, deal):
        a = acc.setdefault(kind(r), {"n": 0, "added": 0.0, "roof": 0.0, "rounds": 0})
        a["n"] += 1
        a["added"] += r["last_end_us"] - prev
        a["roof"] += r["roofline_us"]
        a["rounds"] = max(a["rounds"], int(d.max()))
        prev = r["last_end_us"]
    return acc


def instruction_points(rows, deal: np.ndarray, model: str = "") -> list[dict]:
    """Every instruction as a point: kind, rounds, added µs, t_bytes µs, whether a projection
    (``linear``) and whether the LM head."""
    pts, prev = [], 0.0
    for r, d in zip(rows, deal):
        pts.append({"model": model, "instruction": r["instruction"], "kind": kind(r), "rounds": int(d.max()),
                    "added": r["last_end_us"] - prev, "t_bytes": r["roofline_us"], "linear": r["op"] in LINEAR_OPS,
                    "head": r["op"].startswith("head")})
        prev = r["last_end_us"]
    return pts


def fit_costs(points) -> tuple[float, float, float, float]:
    """Least squares of ``added`` on (1, rounds − 1, t_bytes): returns (a, b, c, R²)."""
    if len(points) < 3:
        raise ValueError(f"the fit has three unknowns: need at least 3 points, got {len(points)}")
    x = np.array([[1.0, p["rounds"] - 1, p["t_bytes"]] for p in points])
    y = np.array([p["added"] for p in points])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    r2 = 1 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    return float(coef[0]), float(coef[1]), float(coef[2]), float(r2)


def predict(a: float, b: float, c: float, rounds: int, t_bytes: float) -> float:
    """The fitted model's µs for one instruction."""
    return a + b * (rounds - 1) + c * t_bytes


def revised_step_us(points, a: float, b: float, c: float) -> float:
    """A whole step by the revised model: every projection (the LM head included) by the fit, every
    other instruction (embed, the mixers) at its measured added time, which the model does not explain."""
    return float(sum(predict(a, b, c, p["rounds"], p["t_bytes"]) if p["linear"] else p["added"] for p in points))
