"""The ``settings`` section's tuners: the decode mixers' and the chunked delta rule's launch settings.

Each kernel named here has a few launch settings (:mod:`labkit.tuning.kernel_settings`); a
tuner lists candidate values, checks every candidate against the kernel's plain-torch reference
on fresh random inputs, times the passing ones alone in a CUDA graph (:func:`labkit.lab.timing.measure`:
CUDA events, median of replays, operands rotated past L2) over a few cases (batches, context
lengths, prompt lengths), and keeps the candidate with the smallest geometric mean of its times
relative to the first candidate, which is always the settings the GPU runs today (its file's
values over the heuristic): a run never makes the measured cases slower than they were.

- ``gated_delta_decode``: the rule that picks value columns per program (``block_v`` where that
  gives ``programs_per_sm`` programs per SM, else ``narrow_block_v``) at batches 1, 16 and 64;
  every (batch, columns) pair is timed once however many rules lead to it;
- ``attention_decode``: ``min_chunk`` / ``max_chunks`` (positions per program) at batches 1 and 16,
  caches of 2,048 and 8,192 slots nearly full;
- ``chunk_delta_rule``: the walk's ``block_v``, ``num_warps``, ``num_stages``, the output
  kernel's ``output_block_v`` and the single-chunk kernel's ``single_block_v`` (a prefix-cache
  hit's tail), one setting at a time from the current values (coordinate descent: each try is a
  compile), at T = 4,096 and 16,384 and a 64-token tail, one sequence of 16 heads x 128.

``release_early`` (PDL) is not tuned here: it only matters inside the chained step.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from .. import tuning
from ..tuning import kernel_settings

BOUND = 1e-2  # bf16 kernels against their float32-accumulating reference (as bench ops checks them)


@dataclass
class Trial:
    values: dict
    err: float | None = None
    us: dict = field(default_factory=dict)  # case -> microseconds
    error: str | None = None

    def row(self) -> dict:
        out = {"values": self.values, "rel_err": self.err, "us": {k: round(v, 3) for k, v in self.us.items()}}
        return out | ({"error": self.error} if self.error else {})


def geomean_ratio(us: dict, base: dict) -> float:
    """Geometric mean over the cases of ``us[case] / base[case]`` (1.0: as fast as ``base``)."""
    return math.exp(sum(math.log(us[c] / base[c]) for c in base) / len(base))


def best_trial(trials: list[Trial]) -> Trial:
    """The passing trial with the smallest geometric-mean time relative to the first (which must
    pass: it is what the GPU runs today)."""
    base = trials[0]
    if base.error or not base.us:
        raise RuntimeError(f"the current settings {base.values} fail their own check: {base.error}")
    ok = [t for t in trials if not t.error and set(t.us) == set(base.us)]
    return min(ok, key=lambda t: geomean_ratio(t.us, base.us))


@dataclass
class KernelTuner:
    """One kernel's sweep: ``trials(device, deadline, log)`` yields checked and timed trials, the
    current settings first; ``cases`` says what was timed."""

    kernel: str
    cases: str
    trials: Callable[[str, float | None, Callable[[str], None]], list[Trial]]


def _current(kernel: str, device: str) -> dict:
    return dict(tuning.settings(kernel, device))


def _pinned(kernel: str, device: str) -> dict:
    """The values ``device``'s tuning file names for ``kernel`` (none: every setting its heuristic)."""
    return kernel_settings.named(kernel, tuning.device_document(device))


def _run_trial(values: dict, check: Callable[[], float], timings: Iterable[tuple[str, Callable[[], float]]]) -> Trial:
    t = Trial(dict(values))
    try:
        t.err = check()
        if not t.err <= BOUND:  # NaN fails too
            t.error = f"relative error {t.err:.3g} > {BOUND}"
            return t
        for case, timer in timings:
            t.us[case] = timer()
    except Exception as exc:  # noqa: BLE001 - one candidate's compile or launch limit: the others still run
        t.error = f"{type(exc).__name__}: {exc}"[:240]
    return t


def _fold(trial: Trial, got: Trial, case: str, how: str) -> bool:
    """Add one case's measurement (``got``, shared by every rule that leads to the same launch) to
    ``trial``; False, with the trial marked failed, where that launch failed its check or its timing."""
    trial.err = max(trial.err or 0.0, got.err if got.err is not None else float("inf"))
    if got.error:
        trial.error = f"{case}, {how}: {got.error}"
        return False
    trial.us[case] = got.us["x"]
    return True


# -- Gated DeltaNet decode step ------------------------------------------------------------------------
GDN_PRESET = "qwen3.5-0.8b"
GDN_BATCHES = (1, 16, 64)
GDN_RULES = [dict(block_v=bv, narrow_block_v=nb, programs_per_sm=p)
             for bv in (16, 32, 64) for nb in (8, 16, 32) for p in (1, 2, 4) if nb <= bv]


def _gdn_trials(device: str, deadline: float | None, log: Callable[[str], None]) -> list[Trial]:
    from ..model import build
    from ..ops.gated_delta_decode import GdnDims, gdn_block_v
    from .ops import check_gdn, time_gdn

    model = build(GDN_PRESET, dtype=torch.bfloat16, device=device, seed=0)
    cfg = model.cfg
    dims = GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
    current = _current("gated_delta_decode", device)
    rule_keys = ("block_v", "narrow_block_v", "programs_per_sm")
    rules = [{k: current[k] for k in rule_keys}] + [r for r in GDN_RULES if r != {k: current[k] for k in rule_keys}]
    seen: dict[tuple[int, int], Trial] = {}  # (batch, columns) -> its measurement
    trials = []
    for rule in rules:
        if trials and deadline is not None and time.perf_counter() > deadline:
            break
        t = Trial(dict(rule))
        for b in GDN_BATCHES:
            bv = gdn_block_v(b, dims, **rule)
            if (b, bv) not in seen:
                seen[b, bv] = _run_trial({"batch": b, "block_v": bv}, lambda: check_gdn(model, b, block_v=bv),
                                         [("x", lambda: time_gdn(model, b, block_v=bv).us)])
            if not _fold(t, seen[b, bv], f"B={b}", f"block_v={bv}"):
                break
        trials.append(t)
        log(f"  gated_delta_decode {rule}: " + (t.error or ", ".join(f"{c} {u:.2f} µs" for c, u in t.us.items())))
    return trials


# -- attention decode step ---------------------------------------------------------------------------
ATTENTION_PRESETS = ("lfm2-350m", "qwen3.5-0.8b")
ATTENTION_CASES = ((1, 2048), (1, 8192), (16, 2048), (16, 8192))  # (batch, cache slots)
ATTENTION_RULES = [dict(min_chunk=c, max_chunks=n) for c in (64, 128, 256, 512) for n in (16, 32, 64, 128)]


def _attention_trials(device: str, deadline: float | None, log: Callable[[str], None]) -> list[Trial]:
    from ..model import build
    from ..ops.attention_decode import attention_chunk
    from .ops import check_attention, time_attention

    current = _current("attention_decode", device)
    now = {k: current[k] for k in ("min_chunk", "max_chunks")}
    rules = [now] + [r for r in ATTENTION_RULES if r != now]
    models = {p: build(p, dtype=torch.bfloat16, device=device, seed=0) for p in ATTENTION_PRESETS}
    seen: dict[tuple, Trial] = {}  # (preset, batch, slots, chunk) -> its measurement
    trials = []
    for rule in rules:
        if trials and deadline is not None and time.perf_counter() > deadline:
            break
        t = Trial(dict(rule))
        for (preset, model), (b, slots) in itertools.product(models.items(), ATTENTION_CASES):
            chunk, _ = attention_chunk(slots, model.cfg.head_dim, **rule)
            if (preset, b, slots, chunk) not in seen:
                seen[preset, b, slots, chunk] = _run_trial(
                    {"chunk": chunk}, lambda: check_attention(model, b, slots, chunk=chunk),
                    [("x", lambda: time_attention(model, b, slots, chunk=chunk).us)])
            if not _fold(t, seen[preset, b, slots, chunk], f"{preset} B={b} slots={slots}", f"chunk={chunk}"):
                break
        trials.append(t)
        log(f"  attention_decode {rule}: " + (t.error or f"{sum(t.us.values()):.1f} µs over {len(t.us)} cases"))
    return trials


# -- chunked delta rule (prefill) ----------------------------------------------------------------------
# 64: a prefix-cache hit's tail, one chunk, which runs the single-chunk kernel (the other settings
# do not touch it, nor single_block_v the longer prompts)
CHUNK_LENGTHS = (4096, 16384, 64)
# The cases each setting changes: the 64-token tail runs the single-chunk kernel alone, which only
# single_block_v changes, and the long prompts never run it. A trial times only the cases its
# setting changes and carries the others' times over from the settings it varies (the same launches):
# timed again, the tail's ~15 us with its run-to-run noise of 1-2 us outweighed a 5% gain on the long
# prompts in the geometric mean (the H100's first run, 2026-12-06: output_block_v 128 at 0.185 /
# 0.697 ms against 0.194 / 0.735 for 64 lost on a tail of 17 against 15 us, a kernel it does not run).
CHUNK_CASES_OF = {"single_block_v": ("T=64",)}
CHUNK_SHAPE = (16, 128)  # heads, head dim: Qwen3.5-0.8B's linear-attention layers
CHUNK_CHOICES = {"block_v": (16, 32), "num_warps": (4, 8), "num_stages": (1, 2, 3), "output_block_v": (64, 128),
                 "single_block_v": (16, 32, 64, 128)}
# several chunks and a partial one, short enough for the step-by-step reference; and a partial chunk
# alone, which takes the single-chunk kernel
CHECK_LENGTHS = (333, 61)


def _chunk_trials(device: str, deadline: float | None, log: Callable[[str], None]) -> list[Trial]:
    from ..lab.timing import measure
    from ..ops.chunk_delta_rule import chunk_delta_rule
    from ..ops.delta_rule import delta_rule_recurrent_ref
    from .gdn_prefill import _inputs
    from .ops import rel_err

    small = [_inputs(1, t, *CHUNK_SHAPE, seed=3, device=device) for t in CHECK_LENGTHS]
    refs = [delta_rule_recurrent_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"]) for x in small]
    big = {t: _inputs(1, t, *CHUNK_SHAPE, device=device) for t in CHUNK_LENGTHS}
    current = _current("chunk_delta_rule", device)

    def trial(values: dict, base: Trial | None = None, setting: str | None = None) -> Trial:
        """``values`` checked and timed; with ``base`` (the trial whose ``setting`` it varies), only the
        cases that setting changes are timed and the others' times are ``base``'s (CHUNK_CASES_OF)."""
        kw = {k: values[k] for k in CHUNK_CHOICES}
        cases = [f"T={t}" for t in CHUNK_LENGTHS]
        if base is not None:
            cases = list(CHUNK_CASES_OF.get(setting, [c for c in cases if c not in CHUNK_CASES_OF["single_block_v"]]))

        def check() -> float:
            errs = []
            for x, (ref_o, ref_s) in zip(small, refs):
                o, s = chunk_delta_rule(**x, **kw)
                errs += [rel_err(o, ref_o), rel_err(s, ref_s)]
            return max(errs)

        timings = [(f"T={t}", lambda t=t: measure(lambda: chunk_delta_rule(**big[t], **kw), device=device,
                                                  graph=True, repeats=10).us)
                   for t in CHUNK_LENGTHS if f"T={t}" in cases]
        got = _run_trial(values, check, timings)
        log(f"  chunk_delta_rule {kw}: " + (got.error or ", ".join(f"{c} {u / 1e3:.3f} ms" for c, u in got.us.items())))
        if base is not None and not got.error:
            got.us = {c: got.us.get(c, base.us[c]) for c in base.us}  # in base's order
        return got

    best = trial({k: current[k] for k in CHUNK_CHOICES})
    trials = [best]
    for name, choices in CHUNK_CHOICES.items():  # one setting at a time, from the best so far
        for v in choices:
            if v == best.values[name] or (deadline is not None and time.perf_counter() > deadline):
                continue
            t = trial(best.values | {name: v}, best, name)
            trials.append(t)
            if not t.error and geomean_ratio(t.us, best.us) < 0.98:  # beyond run-to-run noise
                best = t
    return trials


TUNERS = {
    "gated_delta_decode": KernelTuner("gated_delta_decode", "Qwen3.5-0.8B's GDN step at batches 1, 16, 64",
                                      _gdn_trials),
    "attention_decode": KernelTuner("attention_decode", "both presets' attention step at batches 1 and 16, "
                                    "2,048 and 8,192 cache slots", _attention_trials),
    "chunk_delta_rule": KernelTuner("chunk_delta_rule", "one sequence of T = 4,096, 16,384 and 64, 16 heads x 128",
                                    _chunk_trials),
}


def tune_kernel(kernel: str, *, device: str = "cuda", deadline: float | None = None, command: str = "",
                log: Callable[[str], None] = print) -> dict:
    """``kernel``'s settings entry: the winner's values (only the settings swept; the others keep
    the file's, and those the file does not name stay unnamed: a heuristic value written here would
    freeze it as if measured, past any later change of the heuristic), how it was measured, and
    every trial."""
    tuner = TUNERS[kernel]
    t0 = time.perf_counter()
    trials = tuner.trials(device, deadline, log)
    best = best_trial(trials)
    speedup = 1 / geomean_ratio(best.us, trials[0].us)
    log(f"  {kernel}: {best.values} ({speedup:.3f}x the current settings; {len(trials)} candidates, "
        f"{time.perf_counter() - t0:.0f} s)")
    return {
        "values": {**_pinned(kernel, device), **best.values},
        "source": command or "python -m labkit tune",
        "date": _dt.date.today().isoformat(),
        "measured": (f"labkit.bench.tune_kernels: {tuner.cases}; each candidate checked against its reference "
                     f"(relative error <= {BOUND}), then timed alone in a CUDA graph (median of replays); the "
                     f"winner has the smallest geometric-mean time relative to the settings before the run "
                     f"(the first candidate), here {speedup:.3f}x faster"),
        "candidates": [t.row() for t in trials],
    }


__all__ = ["TUNERS", "Trial", "best_trial", "geomean_ratio", "tune_kernel"]
