"""``python -m labkit tune --persistent``: choose the persistent decode step's settings on the GPU at hand.

The persistent rung's launch (programs per SM, warps, register cap, the projections' K tile and
output-tile bounds) trades bytes in flight against residency: every program must be resident at
once, and the heaviest tile sets the registers of all. So each candidate below is made into a
decoder for each preset (a candidate that does not fit on the GPU is refused by the decoder and
recorded), checked teacher-forced for a few steps on fresh tokens against the float32 truth (the
same weights widened, ``"reference"``) beside ``"fused"`` (:func:`close_enough`), then timed: the
median of greedy steps replayed from its CUDA graph (CUDA events, one step per run). The
candidate with the best geometric-mean speed-up over the heuristic (always the first candidate)
across the presets becomes the ``persistent_decode`` entry of ``data/tuning/<gpu>.json``, with
every candidate's figures as its provenance. Settings are per GPU, not per model or batch: the
presets share one choice, timed at ``--batch``.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import time
from pathlib import Path
from typing import Callable

import torch

from .. import tuning


def close_enough(err: float, peer_err: float) -> bool:
    """A bf16 step whose logits are ``err`` (relative) from the float32 truth passes when it is as
    close as a peer bf16 rung is (``peer_err``), within a factor 2: bf16 rounding alone moves the
    logits of a random 24-layer model by a few per cent, while a race or a tile never run moves them
    by far more. (A fixed bound against the peer's own logits refused every candidate for Qwen3.5,
    whose two bf16 rungs differ by 5%.)"""
    return err <= 2 * peer_err + 1e-3


CANDIDATES = [  # the heuristic first; then what the sm_90 compile said fits (python -m labkit compile-check)
    {},
    {"head_block_n": 8},  # the head's tile first: --max-candidates 3 answers the newest question alone
    {"head_block_n": 32},
    {"prefetch_tiles": 0},  # what the L2 prefetch of the next tile is worth
    {"prefetch_tiles": 2},
    {"prefetch_tiles": 4},
    {"block_k": 1024},  # a K=1024 tile's whole row requested before the wait
    {"max_block_n": 16},
    {"max_block_n": 4},
    {"num_warps": 4, "programs_per_sm": 4, "max_registers": 128},
    {"programs_per_sm": 1, "max_registers": 255},
]


def _check_and_time(model, truth_model, settings: dict, batch: int, steps: int, repeats: int) -> dict:
    from ..decode.persistent import PersistentDecoder
    from ..decode.registry import make_decoder
    from ..lab.timing import measure
    from .ops import rel_err

    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, 64), generator=gen).to(model.device)
    max_len = 64 + steps + repeats + 16
    t0 = time.perf_counter()
    try:
        dec = PersistentDecoder(model, model.new_cache(batch, max_len), settings=settings)
    except RuntimeError as e:  # the grid does not fit on this GPU
        return {"refused": str(e)}
    fused = make_decoder("fused", model, model.new_cache(batch, max_len))
    truth = make_decoder("reference", truth_model, truth_model.new_cache(batch, max_len))
    dec.prefill(ids), fused.prefill(ids), truth.prefill(ids)
    made_s = time.perf_counter() - t0
    worst, peer = 0.0, 0.0
    for _ in range(steps):
        token = torch.randint(0, model.cfg.vocab_size, (batch,), generator=gen).to(model.device)
        exact = truth.step(token)
        worst = max(worst, rel_err(dec.step(token), exact))
        peer = max(peer, rel_err(fused.step(token), exact))
    if not close_enough(worst, peer):
        return {"rejected": f"logits {worst:.3g} from the float32 truth, the fused rung's {peer:.3g}",
                "made_s": made_s}
    token = token[:1].expand(batch).contiguous()
    timing = measure(lambda: dec.step_greedy(token), device=model.device, graph=False, warmup=5, repeats=repeats)
    return {"us": timing.us, "rel_err": worst, "fused_rel_err": peer, "made_s": made_s, "settings": dict(dec.settings)}


def choose(rows: list[dict], models: list[str]) -> dict | None:
    """The row with the best geometric-mean speed-up over the first (the heuristic) across ``models``,
    each row given its ``speedup`` (None where a preset refused or failed it); None when the
    heuristic itself has no time for every preset."""
    base = rows[0]["presets"] if rows else {}
    if not rows or any("us" not in base.get(n, {}) for n in models):
        return None
    for row in rows:
        ok = all("us" in row["presets"].get(n, {}) for n in models)
        row["speedup"] = (math.exp(sum(math.log(base[n]["us"] / row["presets"][n]["us"]) for n in models) / len(models))
                          if ok else None)
    return max((r for r in rows if r["speedup"]), key=lambda r: r["speedup"])


def run(models: list[str], *, batch: int = 1, out_dir: Path = tuning.TUNING_DIR, time_limit_s: float | None = None,
        max_candidates: int | None = None, command: str = "",
        log: Callable[[str], None] = print) -> tuple[Path | None, list[dict]]:
    from ..lab.hw import device_facts
    from ..model import build
    from .results import provenance
    from .tune import write_settings

    start = time.perf_counter()
    rows: list[dict] = []
    built = {name: build(name, dtype=torch.bfloat16, device="cuda", seed=0) for name in models}
    truths = {name: copy.deepcopy(model).to(torch.float32) for name, model in built.items()}
    for cand in CANDIDATES[:max_candidates]:
        if rows and time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            break
        row = {"candidate": cand, "presets": {}}
        for name, model in built.items():
            got = _check_and_time(model, truths[name], cand, batch, steps=8, repeats=30)
            row["presets"][name] = got
            us = f"{got['us']:.1f} us" if "us" in got else got.get("refused") or got.get("rejected")
            log(f"{name:14s} B={batch} {cand or 'heuristic'}: {us}")
        rows.append(row)
    best = choose(rows, models)
    if best is None:
        log("the heuristic itself failed or did not run: nothing written")
        return None, rows
    values = best["presets"][models[0]]["settings"]
    facts = device_facts("cuda", measure=False)
    entry = {
        "values": values,
        "source": command or "python -m labkit tune --persistent",
        "measured": _dt.date.today().isoformat(),
        "method": (f"each candidate made into a PersistentDecoder per preset (bf16, random weights, batch {batch}), "
                   "checked for 8 teacher-forced steps against the float32 truth (within twice the fused rung's "
                   "error), then the median of "
                   "30 greedy graph replays (CUDA events); the winner has the best geometric-mean speed-up over "
                   "the heuristic (the first candidate)"),
        "candidates": rows,
        "provenance": provenance(facts, command),
    }
    path = write_settings(tuning.tuning_path(facts.name, out_dir), facts, command or "python -m labkit tune --persistent",
                          persistent_decode=entry)
    log(f"best: {best['candidate'] or 'the heuristic'} ({best['speedup']:.3f}x the heuristic); wrote {path}")
    return path, rows
