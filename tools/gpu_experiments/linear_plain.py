"""Round-B driver for branch linear-plain (issue 14): does labkit.ops.linear's batch-1 loop, now
loading weights first (the first K tile before the input, the norm's reduction and, with preload,
the PDL wait), stream like the plain GEMV inside the chained step? Run by linear-plain.sh.

  --warm i/N     compile (and check) shard i of every variant, N processes in parallel;
  --stage chain  time every variant over the whole chain (checked first), results to --res;
  --stage decode decode tok/s with the new kernel (tuned table, and plain blockings at batch 1).

Variants (name -> GEMV, PDL placement, configs):
  main      the kernel as on main (tools/gpu_experiments/linear_plain_main_kernel.py), same-run baseline
  new       this branch's kernel, tuned table;   +pre: the preload placement
  newplain  this branch's kernel with the plain GEMV's blocking at every key (4 rows x min(1024, K), 4 warps)
  plain     labkit.ops.plain_gemv (no fusions), the yardstick
  new-normafter  batch 16: lin.NORM_AFTER_DOT (rstd applied after the tl.dot loop, no pass before it)
  new+pre-head16x1024 / -head8x1024  the LM head alone in one K tile per program (as many tiles as now / 2x)
  new+pre-lateres  the residual loaded after the K loop (lin.RESIDUAL_FIRST = False), as on main
  torch     batch 16: the chain's "torch", now labkit.ops.linear.linear_unfused (one-kernel norm, cuBLAS,
            one-kernel epilogue: what a tuning-file dispatch to cuBLAS runs), per key
Every variant is checked against its reference (labkit.bench.chain.Chain.check) before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import linear_plain_main_kernel as old  # noqa: E402

from labkit import build  # noqa: E402
from labkit.bench import chain as ch  # noqa: E402
from labkit.ops import linear as lin  # noqa: E402
from labkit.ops.launch import next_pow2  # noqa: E402

MODELS = os.environ.get("MODELS", "lfm2-350m qwen3.5-0.8b").split()


def _old_linear(x, weight, *, config=None, workspace=None, placement=None, **kw):
    """main's kernel behind the chain's GEMV signature (its own config / workspace / placement classes)."""
    cfg = None if config is None else old.LinearConfig(**dataclasses.asdict(config))
    ws = None if workspace is None else old.LinearWorkspace(workspace.partials, workspace.counters)
    pl = None if placement is None else old.PdlPlacement(placement.preload, placement.release)
    return old.linear(x, weight, config=cfg, workspace=ws, placement=pl, **kw)


ch.register_gemv("linear-main", _old_linear, fused=True, configs=True)


def head_blocking(model, block_n: int, block_k: int, warps: int) -> dict:
    """Only the LM head's key (logits, batch 1) set to ``block_n x block_k``; the rest from the table."""
    head = ch.chain_ops(model)[-1]
    return {head.key(1): lin.LinearConfig(1, block_n, min(block_k, next_pow2(head.case.weight.shape[1])), 1,
                                          num_warps=warps, num_stages=1)}


def plain_blocking(model, batch: int = 1) -> dict:
    """The plain GEMV's blocking (4 whole rows per program, K tiles of min(1024, K), 4 warps) at every key."""
    return {key: lin.LinearConfig(1, 4, min(1024, next_pow2(key.k)), 1, num_warps=4, num_stages=1)
            for key in ch.groups(ch.chain_ops(model), batch)}


NOPRE, PRE = "no-preload+early", "preload+early"
AFTER = {"NORM_AFTER_DOT": True}  # module flags of labkit.ops.linear a variant sets (else the defaults below)
LATE_RES = {"RESIDUAL_FIRST": False}
FLAGS = {"NORM_AFTER_DOT": False, "RESIDUAL_FIRST": True}
# (tag, gemv, pdl, placement, plain blocking? (or the LM head's (block_n, block_k, warps)), batch, flags)
VARIANTS = [  # most telling first: a step that runs out of time keeps the rows before it
    ("new+pre", "linear", True, PRE, False, 1, {}),
    ("new", "linear", True, NOPRE, False, 1, {}),
    ("main", "linear-main", True, NOPRE, False, 1, {}),
    ("plain", "plain", True, None, False, 1, {}),
    ("new-normafter", "linear", True, NOPRE, False, 16, AFTER),
    ("torch", "torch", False, None, False, 16, {}),
    ("new", "linear", True, NOPRE, False, 16, {}),
    ("cublas", "cublas", False, None, False, 16, {}),
    ("newplain+pre", "linear", True, PRE, True, 1, {}),
    ("new+pre-head16x1024", "linear", True, PRE, (16, 1024, 8), 1, {}),
    ("new+pre-head8x1024", "linear", True, PRE, (8, 1024, 4), 1, {}),
    ("new+pre-lateres", "linear", True, PRE, False, 1, LATE_RES),
    ("newplain", "linear", True, NOPRE, True, 1, {}),
]
GROUPS_FOR = {("new+pre", 1), ("newplain+pre", 1), ("new-normafter", 16), ("torch", 16)}


def _chain_args(model, v):
    tag, gemv, pdl, pl, plainb, batch, flags = v
    for name, value in (FLAGS | flags).items():  # read at launch time
        setattr(lin, name, value)
    if isinstance(plainb, tuple):  # (block_n, block_k, warps) of the LM head only
        configs = head_blocking(model, *plainb)
    else:
        configs = plain_blocking(model, batch) if plainb else None
    return dict(batch=batch, gemv=gemv, pdl=pdl, placement=pl and ch.parse_placement(pl), configs=configs)


def warm(shard: int, shards: int) -> None:
    t0 = time.perf_counter()
    jobs = [(m, b) for m in MODELS for b in (1, 16)]
    if shard < len(jobs):  # the decode step's own kernels (mixers, greedy head, prefill)
        from labkit.bench.decode import time_decode

        name, batch = jobs[shard]
        try:
            model = build(name, dtype=torch.bfloat16, device="cuda", seed=0)
            r = time_decode(model, "fused+graph+pdl", batch, prompt=32, new_tokens=4, repeats=1)
            print(f"warm decode {name} B={batch}: compiled{' FAILED ' + r.error if r.error else ''}", flush=True)
            del model
        except Exception as e:  # noqa: BLE001
            print(f"warm decode: {type(e).__name__}: {e}"[:300])
    if shard < len(jobs) and shards > 2 * len(jobs):
        print(f"shard {shard}/{shards}: {time.perf_counter() - t0:.0f} s", flush=True)
        return  # enough shards: the chain's kernels are compiled by the others
    first = len(jobs) if shards > 2 * len(jobs) else 0
    i = -1
    for name in MODELS:
        model = build(name, dtype=torch.bfloat16, device="cuda", seed=0)
        ops = ch.chain_ops(model)
        for v in VARIANTS:
            i += 1
            if first + i % (shards - first) != shard:
                continue
            a = _chain_args(model, v)
            try:
                ch.Chain(model, ops, a["batch"], a["gemv"], pdl=a["pdl"], placement=a["placement"],
                         configs=a["configs"]).check(False)
            except Exception as e:  # noqa: BLE001
                print(f"warm {name} {v}: {type(e).__name__}: {e}"[:300])
        del model
        torch.cuda.empty_cache()
    print(f"shard {shard}/{shards}: {time.perf_counter() - t0:.0f} s", flush=True)


def dump(res: Path, name: str, obj) -> None:
    res.mkdir(parents=True, exist_ok=True)
    (res / f"{name}.json").write_text(json.dumps(obj, indent=1, default=str) + "\n")


def stage_chain(res: Path) -> None:
    rows = []
    for name in MODELS:
        model = build(name, dtype=torch.bfloat16, device="cuda", seed=0)
        for v in VARIANTS:
            a = _chain_args(model, v)
            print(f"[{v[0]}]", end=" ", flush=True)
            r = ch.run_chain(model, a["batch"], a["gemv"], pdl=a["pdl"], placement=a["placement"],
                             configs=a["configs"], per_group=(v[0], a["batch"]) in GROUPS_FOR, repeats=10)
            rows.append(dataclasses.asdict(r) | {"tag": v[0]})
            for g in r.groups:
                if "us_per_kernel" in g:
                    k = g["key"]
                    print(f"      n={k['n']:6} k={k['k']:5} rb={k['row_blocks']} x{g['kernels']:2} "
                          f"{g['bytes_per_kernel'] / 1e6:7.2f} MB {g['us_per_kernel']:7.2f} us  {g['config']}")
            dump(res, "chain", rows)
        del model
        torch.cuda.empty_cache()


def best_batch1(res: Path) -> str:
    """The fastest batch-1 variant of this kernel over both presets' chains (main's defaults if none ran)."""
    tot: dict = {}
    for sub in ("lfm2", "qwen"):
        path = res / sub / "chain.json"
        for r in json.loads(path.read_text()) if path.exists() else []:
            if r["batch"] == 1 and r["tag"] in ("new", "new+pre", "newplain", "newplain+pre") and not r["error"]:
                tot.setdefault(r["tag"], []).append(r["ms"])
    tot = {k: sum(v) for k, v in tot.items() if len(v) == 2}
    return min(tot, key=tot.get) if tot else "new"


def stage_decode(res: Path) -> None:
    from labkit import fused
    from labkit.backends import release_pooled
    from labkit.bench.decode import time_decode

    tuned = fused.tuned_linear_config

    def plain_config(m, n, k, *, row_blocks=1, argmax=False, device=None):
        if m == 1:
            return lin.LinearConfig(1, 4, min(1024, next_pow2(k)), 1, num_warps=4, num_stages=1)
        return tuned(m, n, k, row_blocks=row_blocks, argmax=argmax, device=device)

    rows = []
    models = {name: build(name, dtype=torch.bfloat16, device="cuda", seed=0) for name in MODELS}
    best = best_batch1(res)
    print(f"best batch-1 chain variant (both presets' total): {best}", flush=True)
    _, _, _, pl_best, plainb, _, _ = next(v for v in VARIANTS if v[0] == best and v[5] == 1)
    runs = [(1, pl_best, "plain-blocking" if plainb else "tuned", False), (16, NOPRE, "tuned", True)]
    if (pl_best, plainb) != (NOPRE, False):
        runs.append((1, NOPRE, "tuned", False))  # main's defaults, with this branch's kernel
    runs.append((16, NOPRE, "tuned", False))
    lin.RESIDUAL_FIRST = FLAGS["RESIDUAL_FIRST"]
    for batch, pl, blocking, norm_after in runs:
        for name, model in models.items():
            lin.PDL_PLACEMENT = ch.parse_placement(pl)
            lin.NORM_AFTER_DOT = norm_after
            fused.tuned_linear_config = plain_config if blocking == "plain-blocking" else tuned
            release_pooled(model)
            r = time_decode(model, "fused+graph+pdl", batch, prompt=32, new_tokens=64, repeats=3)
            rows.append(dataclasses.asdict(r) | {"placement": pl, "blocking": blocking, "norm_after_dot": norm_after})
            print(f"decode {name:>14} B={batch:<3} fused+graph+pdl {pl:18} {blocking:15} norm_after={norm_after!s:5} "
                  f"{r.tokens_per_s or 0:9.1f} tok/s {r.error or ''}", flush=True)
            dump(res, "decode", rows)
    fused.tuned_linear_config = tuned


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--warm")
    p.add_argument("--stage")
    p.add_argument("--res", type=Path)
    a = p.parse_args()
    if a.warm:
        i, n = map(int, a.warm.split("/"))
        warm(i, n)
        return 0
    a.res.mkdir(parents=True, exist_ok=True)
    if a.stage == "chain":
        stage_chain(a.res)
    elif a.stage == "decode":
        stage_decode(a.res)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # round A saw finished processes hang on exit; nothing is left to clean up
