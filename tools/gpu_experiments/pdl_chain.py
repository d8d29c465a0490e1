"""Round-A driver for branch pdl-chain (run by tools/gpu_experiments/pdl-chain.sh on the H200).

  --warm i/N   compile (and check) shard i of every kernel variant the run will time, so that N
               processes fill Triton's disk cache in parallel before the timed run;
  --stage S    placements | tune | final | decode: one part of the timed run, results to --res.

Every variant is checked against its reference (labkit.bench.chain.Chain.check) before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

from labkit import build, tuning
from labkit.bench import chain as ch
from labkit.bench import tune as tn
from labkit.ops import launch
from labkit.ops import linear as lin

import os

# PDLC_DRY=1: a CPU dry run of the whole flow on the tiny presets with a stand-in timer
DRY = os.environ.get("PDLC_DRY") == "1"
MODELS = ["tiny-lfm2", "tiny-qwen3.5"] if DRY else ["lfm2-350m", "qwen3.5-0.8b"]
DEVICE, DTYPE = ("cpu", torch.float32) if DRY else ("cuda", torch.bfloat16)
if DRY:
    ch.Chain.time_ms = lambda self, repeats=20: 1e-3 * len(self.bound) * (1 + hash(str(self.configs)) % 7)
    ch.copies_for = lambda nbytes, device: 1
    from labkit.ops import plain_gemv as _pg

    for _n in ("gdc_wait", "gdc_launch_dependents"):
        setattr(lin, _n, lambda: None)
        setattr(_pg, _n, lambda: None)
PL_B1 = ["preload+end", "no-preload+end", "preload+early", "no-preload+early", "preload+after_wait"]
PL_B16 = ["preload+end", "preload+early", "preload+after_wait"]


def variants(batch: int) -> list[tuple[str, bool, str | None]]:
    out = [("linear", False, "preload+end")]  # without PDL the placement has no effect
    out += [("linear", True, p) for p in (PL_B1 if batch == 1 else PL_B16)]
    if batch == 1:
        out += [("plain", False, None), ("plain", True, None), ("plain-tma", False, None), ("plain-tma", True, None),
                ("tma-16x256s4", True, None), ("tma-64x128s4", True, None)]
    return out + [("cublas", False, None)] + ([("torch", False, None)] if batch > 1 else [])


def tune_jobs(model, batch):
    for key, group in ch.groups(ch.chain_ops(model), batch).items():
        for cfg in tn.chain_candidates(model, group, batch, MAX_CAND)[0]:
            yield key, group, cfg


MAX_CAND = 16


def _tma(block_n: int, block_k: int, stages: int, warps: int = 4):
    def run(x, weight, *, out=None, pdl=False, **_):
        from labkit.ops.plain_gemv import plain_gemv

        return plain_gemv(x, weight, out=out, block_n=block_n, block_k=min(block_k, 1 << (weight.shape[1] - 1).bit_length()),
                          style="descriptor", num_warps=warps, num_stages=stages, pdl=pdl)
    return run


# more TMA-descriptor blockings than the built-in one (32 x 256, 3 stages)
ch.register_gemv("tma-16x256s4", _tma(16, 256, 4), fused=False, batch1=True)
ch.register_gemv("tma-64x128s4", _tma(64, 128, 4, 8), fused=False, batch1=True)


def warm(shard: int, shards: int) -> None:
    i = -1
    t0 = time.perf_counter()
    jobs = [(m, b) for m in MODELS for b in (1, 16)]
    if shard < len(jobs) and not DRY:  # the decode step's own kernels (mixers, greedy head, prefill)
        from labkit.bench.decode import time_decode

        name, batch = jobs[shard]
        try:
            model = build(name, dtype=DTYPE, device=DEVICE, seed=0)
            for impl in ("fused+graph", "fused+graph+pdl"):
                r = time_decode(model, impl, batch, prompt=32, new_tokens=4, repeats=1)
                # not a measurement: other warm-up processes share the GPU meanwhile
                print(f"warm decode {name} B={batch} {impl}: compiled{' FAILED ' + r.error if r.error else ''}")
            del model
        except Exception as e:  # noqa: BLE001
            print(f"warm decode: {type(e).__name__}: {e}"[:300])
    if shard == 0 and not DRY:  # the timeline's stamped kernels
        try:
            model = build(MODELS[0], dtype=DTYPE, device=DEVICE, seed=0)
            for pdl in (False, True):
                ch.timeline(model, [o for o in ch.chain_ops(model) if 0 <= o.layer < 3], pdl=pdl, replays=1)
            del model
        except Exception as e:  # noqa: BLE001
            print(f"warm timeline: {type(e).__name__}: {e}"[:300])
    for name in MODELS:
        model = build(name, dtype=DTYPE, device=DEVICE, seed=0)
        ops = ch.chain_ops(model)
        for batch in (1, 16):
            for gemv, pdl, pl in variants(batch):
                i += 1
                if i % shards != shard:
                    continue
                try:
                    ch.Chain(model, ops, batch, gemv, pdl=pdl, placement=pl and ch.parse_placement(pl)).check(False)
                except Exception as e:  # noqa: BLE001
                    print(f"warm {name} B={batch} {gemv} {pdl} {pl}: {type(e).__name__}: {e}"[:300])
            for pdl in (True,):
                for key, group, cfg in tune_jobs(model, batch):
                    i += 1
                    if i % shards != shard:
                        continue
                    try:
                        ch.Chain(model, group[:1], batch, "linear", pdl=pdl, configs={key: cfg}).check(False)
                    except Exception as e:  # noqa: BLE001
                        print(f"warm tune {name} B={batch} {cfg}: {type(e).__name__}: {e}"[:300])
        del model
        if not DRY:
            torch.cuda.empty_cache()
    print(f"shard {shard}/{shards}: {i + 1} jobs seen, {time.perf_counter() - t0:.0f} s")


def dump(res: Path, name: str, obj) -> None:
    (res / f"{name}.json").write_text(json.dumps(obj, indent=1, default=str) + "\n")


def stage_placements(res: Path, groups_for: set) -> None:
    rows = []
    for name in MODELS:
        model = build(name, dtype=DTYPE, device=DEVICE, seed=0)
        for batch in (1, 16):
            for gemv, pdl, pl in variants(batch):
                per_group = (gemv, pdl, pl) in groups_for or (gemv, pdl) in (("plain", False), ("cublas", False),
                                                                             ("torch", False))
                r = ch.run_chain(model, batch, gemv, pdl=pdl, placement=pl and ch.parse_placement(pl),
                                 per_group=per_group)
                rows.append(dataclasses.asdict(r) | {"placement_arg": pl})
                dump(res, "placements", rows)
        del model
        if not DRY:
            torch.cuda.empty_cache()


def stage_timeline(res: Path) -> None:
    model = build(MODELS[0], dtype=DTYPE, device=DEVICE, seed=0)
    ops = [o for o in ch.chain_ops(model) if 0 <= o.layer < 3]
    out = {}
    for pdl in (False, True):
        rows = ch.timeline(model, ops, pdl=pdl)
        out["pdl" if pdl else "plain"] = rows
        print(f"timeline pdl={pdl}")
        for r in rows:
            print(f"  {r['op']:34} {r['bytes'] / 1e6:6.1f} MB start {r['first_start_us']:7.2f}..{r['last_start_us']:7.2f}"
                  f" past wait {r['first_past_wait_us']:7.2f} end {r['last_end_us']:7.2f} us")
    dump(res, "timeline", out)


def best_placement(res: Path, batch: int = 1) -> str:
    rows = json.loads((res / "placements.json").read_text())
    tot: dict = {}
    for r in rows:
        if r["gemv"] == "linear" and r["pdl"] and r["batch"] == batch and not r["error"]:
            tot.setdefault(r["placement_arg"], []).append(r["ms"])
    tot = {k: sum(v) for k, v in tot.items() if len(v) == len(MODELS)}
    return min(tot, key=tot.get) if tot else "preload+early"


def stage_final(res: Path, tag: str, placement: str) -> None:
    rows = []
    for name in MODELS:
        model = build(name, dtype=DTYPE, device=DEVICE, seed=0)
        for batch in (1, 16):
            for gemv, pdl in [("linear", False), ("linear", True)] + ([("step", True)] if batch > 1 else []):
                r = ch.run_chain(model, batch, gemv, pdl=pdl, placement=ch.parse_placement(placement))
                rows.append(dataclasses.asdict(r))
                dump(res, f"final-{tag}", rows)
        del model
        if not DRY:
            torch.cuda.empty_cache()


def stage_decode(res: Path, placements: list[str], batches: list[int]) -> None:
    from labkit.decode.registry import release_pooled
    from labkit.bench.decode import time_decode

    rows = []
    models = {name: build(name, dtype=DTYPE, device=DEVICE, seed=0) for name in MODELS}
    for batch in batches:  # batch 1 of both presets first: the targets
        for name, model in models.items():
            for impl, pls in (("fused+graph", placements[:1]), ("fused+graph+pdl", placements)):
                for pl in pls:
                    lin.PDL_PLACEMENT = ch.parse_placement(pl)
                    from labkit.ops import attention_decode, gated_delta_decode

                    for mod in (attention_decode, gated_delta_decode):  # the mixers follow the projections
                        mod.PDL_RELEASE_EARLY = lin.PDL_PLACEMENT.release == "early"
                    release_pooled(model)
                    r = time_decode(model, impl, batch, prompt=32, new_tokens=64, repeats=5)
                    d = dataclasses.asdict(r) | {"placement": pl}
                    rows.append(d)
                    print(f"decode {name:>14} B={batch:<3} {impl:16} {pl:22} {r.tokens_per_s or 0:9.1f} tok/s "
                          f"{r.error or ''}", flush=True)
                    dump(res, "decode", rows)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--warm")
    p.add_argument("--stage")
    p.add_argument("--res", type=Path)
    p.add_argument("--time-limit-s", type=float, default=60)
    p.add_argument("--placement")
    p.add_argument("--tag", default="tuned")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    a = p.parse_args()
    if a.warm:
        i, n = map(int, a.warm.split("/"))
        warm(i, n)
        return 0
    res = a.res
    res.mkdir(parents=True, exist_ok=True)
    if a.stage == "placements":
        stage_placements(res, {("linear", False, "preload+end"), ("linear", True, "preload+early"),
                               ("linear", True, "preload+end")})
    elif a.stage == "timeline":
        stage_timeline(res)
    elif a.stage == "best":
        print(best_placement(res))
    elif a.stage == "tune":
        out = res / "tuning"
        out.mkdir(exist_ok=True)
        shutil.copy(tuning.tuning_path("NVIDIA H200"), out / "nvidia-h200.json")
        cmd = (f"python -m labkit tune --chain --pdl --placement {a.placement} --max-candidates {MAX_CAND} "
               f"--time-limit-s {a.time_limit_s:g}")
        tn.run_chain(MODELS, a.batches, pdl=True, placement=ch.parse_placement(a.placement), out_dir=out,
                     time_limit_s=a.time_limit_s, max_candidates=MAX_CAND, command=cmd, device=DEVICE,
                     gpu_name="NVIDIA H200")
    elif a.stage == "final":
        stage_final(res, a.tag, a.placement)
    elif a.stage == "decode":
        stage_decode(res, a.placement.split(","), a.batches)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit at once: on the GPU machine (round A, 2026-12-01) warm-up processes printed their last
    # line and then never exited, which hung the script; nothing is left to clean up here.
    os._exit(code)
