"""``python -m labkit tune``: tune every kernel that has a setting on the GPU at hand and write the
winners, with their provenance, into ``data/tuning/<gpu-slug>.json``, which :mod:`labkit.tuning`
reads at run time. With no options it runs every section within one time budget
(``--time-limit-s``, default 540 s, so the whole run stays under ten minutes on an H200):

- ``linear``: the projections' blockings at batch buckets 1, 16, 32 and 64 (batches 2-15 share
  bucket 16: the ``tl.dot`` loop pads the batch to 16 rows; past 64, bucket 64's tiles), tuned
  inside the chained step with programmatic dependent launch as the fused rung runs them
  (:func:`run_chain`; without PDL on a GPU older than sm_90), the LM head included; past batch 1
  the same sub-chain run unfused through cuBLAS is timed too, and dispatched to where it wins;
- ``gated_delta_decode``, ``attention_decode``, ``chunk_delta_rule``: their launch settings
  (:mod:`labkit.bench.tune_kernels`);
- ``persistent_decode``: the persistent step's settings (:mod:`labkit.bench.tune_persistent`).

Every candidate is checked against its reference before it is timed; the settings the GPU runs
today are always the first candidate, so a section never makes what it measures slower. A
progress bar follows the sections; ``--sections`` picks some, and ``data/bench/<gpu>/tune-run.json``
records what each took (a run of some sections, ``tune-run-<sections>.json``). The older single
modes remain: ``--alone`` (each projection alone in a CUDA graph, :func:`run`), ``--chain``
(:func:`run_chain` only) and ``--persistent``.

:func:`run` sweeps each distinct projection of the presets' decode steps (one key per batch
bucket, outputs, K, row blocks; the LM head is left out: its greedy and logits paths must keep one
summation order): each candidate :class:`~labkit.ops.linear.LinearConfig` is first checked
against the reference at that blocking, then timed as ``bench ops`` times the projection (alone in
a CUDA graph, its weights cold in L2). The file is rewritten after every key, so a run cut short
by the time limit (or killed) leaves every key it finished; entries of an earlier file for keys
this run did not reach are kept with their own date and source.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import random
import shlex
import time
from pathlib import Path
from typing import Callable

import torch

from .. import tuning
from ..config import PRESETS
from ..model import HybridLM, build
from .ops import LinearCase, check_linear, linear_cases, time_linear
from .results import provenance

BOUND = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}
METHOD_NOTE = ("Each candidate blocking was checked against linear_ref, then timed alone in a CUDA graph, rotating over "
               "copies of the weight so that it streams from HBM (labkit.bench.ops.time_linear); 'us' is the median "
               "per call, for the first of 'ops'. The heuristic's own choice is one of the candidates.")


def candidates(m: int, n: int, k: int, row_blocks: int, sms: int) -> list:
    """Blockings to try. GEMV loop (m == 1): each thread keeps 8..64 float32 accumulators, K split
    only as far as it takes to give ~4 programs per SM; tl.dot loop: tiles up to 16K elements per
    row block, and at least 64 programs."""
    from ..ops.linear import LinearConfig, m_bucket, next_pow2

    found = []
    if m == 1:
        for bk in sorted({512, 1024, min(4096, next_pow2(k))}):
            iters = math.ceil(k / bk)
            for bn in (1, 2, 4, 8):
                for nw in (2, 4, 8):
                    if not 8 <= bn * bk * row_blocks / (32 * nw) <= 64:
                        continue
                    splits = [d for d in (1, 2, 3, 4, 6, 8, 9) if iters % d == 0]
                    fill = [d for d in splits if math.ceil(n / bn) * d >= 4 * sms]
                    for sk in sorted({1, *(fill[:1] or splits[-1:])}):
                        found.append(LinearConfig(1, bn, bk, sk, nw, 1))
    else:
        bucket = m_bucket(m)
        found = [LinearConfig(bucket, bn, bk, sk, nw, 3) for bn in (16, 32, 64) for bk in (128, 256)
                 for sk in (1, 2, 4, 8) for nw in (4, 8)
                 if k % (bk * sk) == 0 and math.ceil(n / bn) * sk >= 64 and bn * bk * row_blocks <= 16384]
    return found


def head_candidates(m: int, n: int, k: int) -> list:
    """Blockings for the LM head: tiles of at least 8 rows, since its greedy path reduces one
    (max, argmax) per tile afterwards (tall tiles keep that reduction short)."""
    from ..ops.linear import LinearConfig

    if m > 1:
        return [c for c in candidates(m, n, k, 1, 1) if c.block_n >= 16]
    return [LinearConfig(1, bn, bk, 1, nw, 1) for bn in (8, 16, 32) for bk in (256, 512, 1024) for nw in (4, 8)
            if bk <= max(256, k) and 8 <= bn * bk / (32 * nw) <= 64]


def _time_us(model: HybridLM, case: LinearCase, batch: int, config) -> float:
    return time_linear(model, case, batch, "triton", config=config).us


def tune_case(
    model: HybridLM,
    case: LinearCase,
    batch: int,
    *,
    sms: int,
    timer: Callable[[HybridLM, LinearCase, int, object], float] = _time_us,
    max_candidates: int | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """One tuning-file entry for ``case`` at ``batch``: every candidate checked, then timed. A
    blocking that computes a wrong result is listed under ``rejected`` (a kernel bug to fix); one
    that cannot be compiled or launched (registers, shared memory) under ``skipped``."""
    from ..ops.linear import linear_config, tuning_key

    n, k = case.outputs, case.weight.shape[1]
    heuristic = linear_config(batch, n, k, row_blocks=case.row_blocks)  # no table: the heuristic itself
    tried = [heuristic] + [c for c in candidates(batch, n, k, case.row_blocks, sms) if c != heuristic]
    tried = tried[:max_candidates] if max_candidates else tried
    bound = BOUND[case.weight.dtype]
    timed, rejected, skipped = [], [], []
    t0 = time.perf_counter()
    for config in tried:
        try:
            err = check_linear(model, case, batch, config=config)
        except Exception as e:  # noqa: BLE001 - compile/launch limits of one blocking: try the others
            if config == heuristic:
                raise
            skipped.append({"config": tuning.config_to_dict(config), "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        if not err <= bound:  # a kernel that is wrong at some blocking: reported, never chosen
            rejected.append({"config": tuning.config_to_dict(config), "rel_err": err})
            log(f"  !! {case.name} B={batch} {config}: relative error {err:.2e} > {bound:.0e}")
            continue
        timed.append((timer(model, case, batch, config), config))
    if not timed or timed[0][1] != heuristic:
        raise RuntimeError(f"{model.cfg.name} {case.name} B={batch}: the heuristic's own blocking {heuristic} "
                           f"fails its check; see the rejected candidates: {rejected}")
    heuristic_us = timed[0][0]
    best_us, best = min(timed, key=lambda t: t[0])
    log(f"  {model.cfg.name} B={batch} {case.name:34} heuristic {heuristic_us:7.2f} µs, tuned {best_us:7.2f} µs "
        f"({len(timed)} configs, {time.perf_counter() - t0:.0f} s)  {best}")
    entry = {
        "key": tuning.key_to_dict(tuning_key(batch, n, k, row_blocks=case.row_blocks)),
        "config": tuning.config_to_dict(best),
        "heuristic": tuning.config_to_dict(heuristic),
        "us": {"heuristic": round(heuristic_us, 3), "tuned": round(best_us, 3)},
        "ops": [f"{model.cfg.name} {case.name}"],
        "candidates": len(timed),
    }
    if rejected:
        entry["rejected"] = rejected
    if skipped:
        entry["skipped"] = skipped
    return entry


def linear_entries(doc: dict, path: Path) -> dict:
    """An existing file's linear entries by key (kept for the keys a run does not reach)."""
    return {tuning.key_from_dict(e["key"], str(path)): e for e in doc.get("linear", [])}


def other_sections(doc: dict) -> dict:
    """The sections of an existing file that the linear tuning does not write (the TMA table and
    the kernels' settings), kept as they are, each with its own provenance."""
    return {k: doc[k] for k in ("settings", "tma") if k in doc}


def write_settings(path: Path, facts, command: str, **settings: dict) -> Path:
    """The ``settings`` entries (kernel -> entry) into the tuning file at ``path``, the file's other
    entries kept, with this run's provenance at its top as a linear run writes it (device, versions,
    date, command): a file that only a settings run made would otherwise name no command."""
    top = {k: v for k, v in provenance(facts, command).items() if k != "gpu"}  # the file's gpu is facts.name
    return tuning.update_tuning_file(path, facts.name, settings=settings, **top)


def run(models: list[str], batches: list[int], *, out_dir: Path = tuning.TUNING_DIR, time_limit_s: float | None = None,
        fresh: bool = False, max_candidates: int | None = None, device: str = "cuda", gpu_name: str | None = None,
        command: str | None = None, timer: Callable = _time_us,
        log: Callable[[str], None] = print) -> tuple[Path, list[dict], int]:
    """Tune every key of ``models`` at ``batches`` on ``device`` into ``out_dir/<gpu-slug>.json``
    (``gpu_name``: the device's own name unless given); returns the file, the entries measured and
    how many keys the time limit left untuned."""
    from ..lab.hw import device_facts
    from ..ops.launch import num_sms
    from ..ops.linear import tuning_key

    facts = device_facts(device, measure=False)
    name = gpu_name or facts.name
    path = tuning.tuning_path(name, out_dir)
    old_doc = tuning.read_tuning_file(path) if path.exists() else {}
    kept = {} if fresh else linear_entries(old_doc, path)
    doc = {"format": tuning.FORMAT, **provenance(facts, command), "gpu": name, "notes": [METHOD_NOTE],
           **other_sections(old_doc), "linear": []}
    dtype = torch.bfloat16 if facts.kind == "cuda" else torch.float32  # the CPU interpreter: for tests
    measured: dict = {}
    left: set = set()
    t0 = time.perf_counter()
    for preset in models:
        model = build(preset, dtype=dtype, device=device, seed=0)
        for batch in batches:
            for case in linear_cases(model, lm_head=False):
                key = tuning_key(batch, case.outputs, case.weight.shape[1], row_blocks=case.row_blocks)
                if key in measured:  # another op of the same shape: one entry serves both
                    measured[key]["ops"].append(f"{preset} {case.name}")
                elif time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                    left.add(key)
                    continue
                else:
                    entry = tune_case(model, case, batch, sms=num_sms(), timer=timer, max_candidates=max_candidates,
                                      log=log)
                    measured[key] = entry | {"date": _dt.date.today().isoformat(), "source": doc["command"]}
                    kept.pop(key, None)
                if kept:
                    doc["notes"] = [METHOD_NOTE, f"{len(kept)} entries kept from the previous file, each with "
                                                 "the date and source of the run that measured it."]
                tuning.write_tuning_file(path, doc | {"linear": list(measured.values()) + list(kept.values())})
        del model
        if facts.kind == "cuda":
            torch.cuda.empty_cache()
    return path, list(measured.values()), len(left)


CHAIN_NOTE = ("Entries with method 'chain' were tuned inside the chained step (labkit.bench.chain.sweep_key): each "
              "candidate checked against linear_ref, then timed as the sub-chain of every projection sharing its key, "
              "back to back in one CUDA graph with weight copies past L2, launched as the step launches them "
              "(pdl/placement as recorded); 'us' is per kernel. The LM head's greedy key (argmax) gets the logits "
              "key's configuration, so that both paths sum in the same order. At batch >= 16, 'us.torch' is the same "
              "sub-chain run unfused (linear_unfused: one-kernel norm, cuBLAS matmul, one-kernel epilogue); 'impl': 'torch' where that beat the best "
              "blocking by more than 3%, and the fused backend then runs it so (labkit.decode.fused). "
              "'us.cublas' (batch >= 16): the bare cuBLAS matmul of the same weights, no norm and no epilogue: "
              "the yardstick a projection should not be slower than.")


def chain_candidates(model: HybridLM, group: list, batch: int, max_candidates: int | None = None) -> tuple[list, object, object]:
    """(candidates, current, heuristic) for one key of the chain: the configuration the table gives
    now first, then the heuristic's, at batch 1 (not for the LM head) then the plain GEMV's blocking (4 rows x min(1024, K),
    4 warps: :mod:`labkit.ops.plain_gemv`, the chain's yardstick), then :func:`candidates`
    (:func:`head_candidates` for the LM head) in a fixed shuffled order."""
    from ..ops.launch import num_sms
    from ..ops.linear import LinearConfig, linear_config, next_pow2

    case = group[0].case
    n, k, rb = case.outputs, case.weight.shape[1], case.row_blocks
    current = tuning.linear_config(batch, n, k, row_blocks=rb, device=model.device)
    heuristic = linear_config(batch, n, k, row_blocks=rb)
    # not for the LM head: its greedy path reduces one winner per tile, which 4-row tiles would make 4x as many
    plain = [LinearConfig(1, 4, min(1024, next_pow2(k)), 1, 4, 1)] if batch == 1 and group[0].layer >= 0 else []
    more = candidates(batch, n, k, rb, num_sms()) if group[0].layer >= 0 else head_candidates(batch, n, k)
    random.Random(0).shuffle(more)  # a cut list (max_candidates, a deadline) still spans every block shape
    tried = list(dict.fromkeys([current, heuristic, *plain, *more]))
    return (tried[:max_candidates] if max_candidates else tried), current, heuristic


DISPATCH_MARGIN = 0.03  # the unfused path must win by more than run-to-run noise


def time_unfused(model: HybridLM, group: list, batch: int, repeats: int = 10, gemv: str = "torch") -> float | None:
    """Microseconds per projection of ``group``'s sub-chain run unfused (labkit.bench.chain's "torch"
    GEMV: norm, cuBLAS, epilogue), checked first; None if its check fails. ``gemv="cublas"``: the
    bare cuBLAS matmul of the same weights (no norm, no epilogue, not checked: the yardstick)."""
    from .chain import BOUND, Chain, copies_for

    sub = Chain(model, group, batch, gemv, copies=copies_for(sum(o.case.nbytes for o in group), model.device))
    if gemv == "torch" and not max(sub.check(every_layer=False).values()) <= BOUND[model.dtype]:
        return None
    return sub.time_ms(repeats) * 1e3 / len(sub.bound)


def run_chain(models: list[str], batches: list[int], *, pdl: bool, placement=None, out_dir: Path = tuning.TUNING_DIR,
              time_limit_s: float | None = None, max_candidates: int | None = None, repeats: int = 10,
              command: str | None = None, device: str = "cuda", gpu_name: str | None = None,
              log: Callable[[str], None] = print) -> tuple[Path, list[dict]]:
    """Tune every key of ``models``' chained steps (LM head included) at ``batches`` inside the
    chain (:func:`labkit.bench.chain.sweep_key`), keeping the table's current configuration and the
    heuristic's among the candidates (first), and write them into ``out_dir/<gpu-slug>.json``; the
    time limit is shared evenly by (model, batch), and within it by key."""
    from ..lab.hw import device_facts
    from .chain import chain_ops, groups, placement_name, sweep_key

    facts = device_facts(device, measure=False)
    placement = placement or tuning.pdl_placement(device)  # the tuning file's, else the heuristic
    name = gpu_name or facts.name
    dtype = torch.bfloat16 if facts.kind == "cuda" else torch.float32  # the CPU interpreter: for tests
    path = tuning.tuning_path(name, out_dir)
    old_doc = tuning.read_tuning_file(path) if path.exists() else {}
    kept = linear_entries(old_doc, path)
    notes = [n for n in old_doc.get("notes", [METHOD_NOTE])
             if n != CHAIN_NOTE and not (any(b > 1 for b in batches) and "no entries yet" in n)] + [CHAIN_NOTE]
    doc = {"format": tuning.FORMAT, **provenance(facts, command), "gpu": name, "notes": notes,
           **other_sections(old_doc), "linear": []}
    measured: dict = {}
    share = None if time_limit_s is None else time_limit_s / (len(models) * len(batches))
    for preset in models:
        model = build(preset, dtype=dtype, device=device, seed=0)
        ops = chain_ops(model)
        for batch in batches:
            by_key = groups(ops, batch)
            t_mb = time.perf_counter()
            for i, (key, group) in enumerate(by_key.items()):
                tried, current, heuristic = chain_candidates(model, group, batch, max_candidates)
                deadline = None if share is None else t_mb + share * (i + 1) / len(by_key)
                found = sweep_key(model, group, batch, tried, pdl=pdl, placement=placement, repeats=repeats,
                                  deadline=deadline, log=log)
                timed = found["timed"]
                us_of = {c: us for us, c in timed}
                best_us, best = min(timed, key=lambda t: t[0])
                log(f"  {preset} B={batch} {'/'.join(sorted({o.case.name for o in group})):40} x{len(group):<3} "
                    f"current {us_of[current]:7.2f} us, best {best_us:7.2f} us ({len(timed)}/{len(tried)} timed)  {best}")
                entry = {
                    "key": tuning.key_to_dict(key), "config": tuning.config_to_dict(best),
                    "heuristic": tuning.config_to_dict(heuristic),
                    "us": {"heuristic": round(us_of.get(heuristic, float("nan")), 3), "previous": round(us_of[current], 3),
                           "tuned": round(best_us, 3)},
                    "ops": [f"{preset} {name}" for name in sorted({o.case.name for o in group})],
                    "candidates": len(timed), "method": "chain", "pdl": placement_name(placement) if pdl else None,
                    "date": _dt.date.today().isoformat(), "source": doc["command"],
                }
                if batch > 1:  # the yardstick: cuBLAS alone on the same weights (the bar)
                    entry["us"]["cublas"] = round(time_unfused(model, group, batch, repeats, gemv="cublas"), 3)
                if batch > 1 and group[0].layer >= 0:  # the measured dispatch: unfused cuBLAS, if it wins
                    torch_us = time_unfused(model, group, batch, repeats)
                    if torch_us is not None:
                        entry["us"]["torch"] = round(torch_us, 3)
                        if torch_us < best_us * (1 - DISPATCH_MARGIN):
                            entry["impl"] = "torch"
                            log(f"    -> dispatched to torch (norm + cuBLAS + epilogue): {torch_us:7.2f} us")
                if entry["us"]["heuristic"] != entry["us"]["heuristic"]:  # not reached: no figure
                    del entry["us"]["heuristic"]
                for extra in ("rejected", "skipped"):
                    if found[extra]:
                        entry[extra] = found[extra]
                keys = [key]
                if group[0].layer < 0:  # the LM head: its greedy path must sum as its logits path does
                    keys.append(key._replace(argmax=True))
                for kk in keys:
                    if kk in measured:  # the same shape in another preset: keep the faster figure's config
                        if measured[kk]["us"]["tuned"] <= best_us:
                            measured[kk]["ops"] += entry["ops"]
                            continue
                    measured[kk] = dict(entry, key=tuning.key_to_dict(kk))
                    kept.pop(kk, None)
                tuning.write_tuning_file(path, doc | {"linear": list(measured.values()) + list(kept.values())})
        del model, ops
        if facts.kind == "cuda":
            torch.cuda.empty_cache()
    return path, list(measured.values())


SECTIONS = ("linear", "gated_delta_decode", "attention_decode", "chunk_delta_rule", "persistent_decode")
# each section's share of the time budget (time a section leaves unused passes to the next)
SHARES = {"linear": 0.5, "gated_delta_decode": 0.04, "attention_decode": 0.08, "chunk_delta_rule": 0.13,
          "persistent_decode": 0.25}
ALL_BATCHES = (1, 16, 32, 64)
# settings sections the full run leaves alone, and why (a test checks every kernel is in one or the other)
UNTUNED = {
    "linear": "the PDL placement of the projections: python -m labkit bench chain --placements ... measures it "
              "(data/bench/<gpu>/chain.json); the full run tunes the linear section's blockings instead",
    "norm_rope": "a prefill kernel of a few microseconds per layer; its form (rotated_only) was chosen by measurement",
    "fused_prefill": "when to capture a prefill graph (a policy over prompt lengths, not a kernel's speed)",
    "gdn_inputs": "swept by python -m labkit bench prefill-profile --sweep-gdn-inputs (each setting timed alone at a "
                  "4,096-token prefill, checked for the same bits); write its winner into the GPU's file by hand",
    "tail_gate_up": "swept by python -m labkit bench tail-ops --sweep (a hit tail's gate|up at 16 and 64 rows, each "
                    "blocking checked against the reference); write its winner into the GPU's file by hand",
    "prompt_gate_up": "swept by python -m labkit bench tail-ops --rows --prompt 4096 1024 --write-tuning (a prompt's "
                      "gate|up, each blocking checked against the reference, cuBLAS + SwiGLU beside it), which writes "
                      "its winner and min_rows into the GPU's file",
}


def run_all(models: list[str], *, sections: tuple[str, ...] = SECTIONS, batches: tuple[int, ...] = ALL_BATCHES,
            time_limit_s: float = 540.0, out_dir: Path = tuning.TUNING_DIR, data_dir: Path | None = None,
            max_candidates: int | None = None, command: str = "python -m labkit tune") -> tuple[Path, list[dict]]:
    """Every section in turn within ``time_limit_s``; returns the tuning file and one summary row
    per section (also written to ``data_dir/<gpu>/tune-run.json``, or for a run of some sections
    ``tune-run-<sections>.json``: the full run's record, which notebook 06 reads, stays whole)."""
    from tqdm.auto import tqdm

    from ..lab.hw import device_facts
    from ..ops.features import features
    from .results import DATA_DIR, write_document
    from .tune_kernels import tune_kernel
    from .tune_persistent import run as run_persistent

    facts = device_facts("cuda", measure=False)
    path = tuning.tuning_path(facts.name, out_dir)
    start = time.perf_counter()
    used = 0.0
    summary: list[dict] = []
    bar = tqdm(total=len(sections), desc="labkit tune", unit="section")
    log = bar.write
    for name in sections:
        used += SHARES[name]
        deadline = start + time_limit_s * used / sum(SHARES[s] for s in sections)
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        row: dict = {"section": name}
        try:
            if name == "linear":
                _, entries = run_chain(models, list(batches), pdl=features("cuda").pdl, out_dir=out_dir,
                                       time_limit_s=max(0.0, deadline - t0), max_candidates=max_candidates,
                                       command=command, log=log)
                row |= {"entries": len(entries),
                        "torch_dispatched": sum(e.get("impl") == "torch" for e in entries),
                        "speedup_geomean": _geomean([e["us"]["previous"] / e["us"]["tuned"] for e in entries])}
            elif name == "persistent_decode":
                _, rows = run_persistent(models, batch=1, out_dir=out_dir, time_limit_s=max(0.0, deadline - t0),
                                         max_candidates=max_candidates, command=command, log=log)
                row |= {"candidates": len(rows)}
            else:
                entry = tune_kernel(name, deadline=deadline, command=command, log=log)
                write_settings(path, facts, command, **{name: entry})
                row |= {"candidates": len(entry["candidates"]), "values": entry["values"]}
        except Exception as exc:  # noqa: BLE001 - one section's failure is reported; the others still run
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(f"  {name} FAILED: {row['error']}")
        row["seconds"] = round(time.perf_counter() - t0, 1)
        summary.append(row)
        tuning.forget()  # the next section reads what this one wrote
        bar.update(1)
    bar.close()
    total = round(time.perf_counter() - start, 1)
    print(f"tuned {len(sections)} sections in {total} s (budget {time_limit_s:.0f} s); wrote {path}")
    record = "tune-run" if set(sections) == set(SECTIONS) else "-".join(("tune-run", *sections))
    write_document(record, "tune-run", {"seconds": total, "time_limit_s": time_limit_s, "models": models,
                                        "sections": summary}, facts, command,
                   DATA_DIR if data_dir is None else data_dir)
    return path, summary


def _geomean(xs: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, xs)) / len(xs)), 4) if xs else None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="labkit tune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"])
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
                   help="what the full run tunes (default: all of them)")
    p.add_argument("--batches", nargs="+", type=int, default=None,
                   help=f"linear batches (default {' '.join(map(str, ALL_BATCHES))}; with --alone/--chain 1 16)")
    p.add_argument("--time-limit-s", type=float, help="start no new key after this many seconds "
                   "(the full run's budget: default 540)")
    p.add_argument("--alone", action="store_true", help="only the projections, each alone in a CUDA graph (run)")
    p.add_argument("--out-dir", type=Path, default=tuning.TUNING_DIR, help="where <gpu-slug>.json goes")
    p.add_argument("--fresh", action="store_true", help="drop the entries of an existing file instead of keeping them")
    p.add_argument("--max-candidates", type=int, help="try at most this many blockings per key (the heuristic's first)")
    p.add_argument("--chain", action="store_true",
                   help="tune inside the chained step (labkit.bench.chain), LM head included, instead of each op alone")
    p.add_argument("--pdl", action="store_true", help="with --chain: launch with programmatic dependent launch")
    p.add_argument("--placement", default=None,
                   help="with --chain --pdl: e.g. preload+early (default: the tuning file's, else the heuristic)")
    p.add_argument("--persistent", action="store_true",
                   help="choose the persistent decode step's settings instead (labkit.bench.tune_persistent), "
                        "timed at the first of --batches")
    args = p.parse_args(argv)
    for name in args.models:
        if name not in PRESETS:
            raise SystemExit(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    if not torch.cuda.is_available():
        print("labkit tune times kernels on a CUDA GPU, and there is none here "
              "(the CPU interpreter has its own fixed configuration)")
        return 2
    command = shlex.join(["python", "-m", "labkit", "tune", *argv])
    if not (args.persistent or args.chain or args.alone):
        _, summary = run_all(args.models, sections=tuple(args.sections), batches=tuple(args.batches or ALL_BATCHES),
                             time_limit_s=540.0 if args.time_limit_s is None else args.time_limit_s,
                             out_dir=args.out_dir, max_candidates=args.max_candidates, command=command)
        return 1 if any("error" in r for r in summary) else 0
    args.batches = args.batches or [1, 16]
    if args.persistent:
        from .tune_persistent import run as run_persistent

        path, rows = run_persistent(args.models, batch=args.batches[0], out_dir=args.out_dir,
                                    time_limit_s=args.time_limit_s, max_candidates=args.max_candidates,
                                    command=shlex.join(["python", "-m", "labkit", "tune", *argv]))
        return 0 if path is not None else 1
    if args.chain:
        from .chain import parse_placement

        placement = parse_placement(args.placement) if args.placement else None
        path, entries = run_chain(args.models, args.batches, pdl=args.pdl, placement=placement, out_dir=args.out_dir,
                                  time_limit_s=args.time_limit_s, max_candidates=args.max_candidates,
                                  command=shlex.join(["python", "-m", "labkit", "tune", *argv]))
        print(f"wrote {len(entries)} chain-tuned entries to {path}")
        return 1 if any(e.get("rejected") for e in entries) else 0
    path, entries, left = run(args.models, args.batches, out_dir=args.out_dir, time_limit_s=args.time_limit_s,
                              fresh=args.fresh, max_candidates=args.max_candidates,
                              command=shlex.join(["python", "-m", "labkit", "tune", *argv]))
    if entries:
        print(f"wrote {len(entries)} entries to {path}" + (f"; the time limit left {left} keys untuned" if left else ""))
    else:
        print(f"nothing measured (time limit {args.time_limit_s} s); {path} is unchanged")
    rejected = [e for e in entries if e.get("rejected")]
    for e in rejected:
        print(f"FAILED checks at some blockings of {e['ops'][0]} (batch bucket {e['key']['m_bucket']}): {e['rejected']}")
    return 1 if rejected else 0
