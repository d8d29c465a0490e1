"""Round-B driver for branch linear-plain (issue 14), second run: this branch's defaults (the
weights-first batch-1 loop, PDL preload+early, the batch-1 table measured in the first run) against
main's kernel with main's placement and table, in the chained step (labkit.bench.chain) and in decode;
at batch 16, per key, this kernel against the unfused path (labkit.ops.linear.linear_unfused: one-kernel
norm, cuBLAS, one-kernel epilogue), and the step with the keys where the unfused path won dispatched to it.
Run by linear-plain-run2.sh (its second run, 06:07 UTC).

  --warm i/N     compile (and check) shard i of every variant, N processes in parallel;
  --stage chain  time every variant over the whole chain (checked first), results to --res;
  --stage decode decode tok/s (fused+graph+pdl at batch 1 and 16, with and without the dispatch).

Variants: new (this branch's defaults), main (tools/gpu_experiments/linear_plain_main_kernel.py with
main's table, tools/gpu_experiments/linear_plain_main_tuning.json, and main's no-preload+early), plain
(labkit.ops.plain_gemv, the yardstick), torch (linear_unfused), cublas (bare torch.mm), step-dispatch.
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


def main_table(model, batch: int) -> dict:
    """main's tuning table (tools/gpu_experiments/linear_plain_main_tuning.json) where it has the key,
    else main's heuristic (the same code): what main ran."""
    from labkit.tuning import linear_table

    table = linear_table(Path(__file__).resolve().parent / "linear_plain_main_tuning.json")
    out = {}
    for key in ch.groups(ch.chain_ops(model), batch):
        cfg = table.get(key) or old.linear_config(batch, key.n, key.k, row_blocks=key.row_blocks, argmax=key.argmax)
        out[key] = lin.LinearConfig(**dataclasses.asdict(cfg))
    return out


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
FLAGS = {"NORM_AFTER_DOT": lin.NORM_AFTER_DOT, "RESIDUAL_FIRST": lin.RESIDUAL_FIRST}  # the code's own
# (tag, gemv, pdl, placement, plain blocking? (or the LM head's (block_n, block_k, warps)), batch, flags)
VARIANTS = [  # most telling first: a step that runs out of time keeps the rows before it
    ("new", "linear", True, None, False, 1, {}),  # this branch's defaults: placement, tuning table
    ("main", "linear-main", True, NOPRE, "main", 1, {}),  # main's kernel, placement and table
    ("plain", "plain", True, None, False, 1, {}),
    ("new", "linear", True, None, False, 16, {}),
    ("torch", "torch", False, None, False, 16, {}),
    ("main", "linear-main", True, NOPRE, "main", 16, {}),
    ("cublas", "cublas", False, None, False, 16, {}),
    ("new-nopdl", "linear", False, None, False, 1, {}),
]
GROUPS_FOR = {("new", 1), ("new", 16), ("torch", 16)}
DISPATCH_MARGIN = 0.03  # as labkit.bench.tune: the unfused path must win by more than noise


def _chain_args(model, v):
    tag, gemv, pdl, pl, plainb, batch, flags = v
    for name, value in (FLAGS | flags).items():  # read at launch time
        setattr(lin, name, value)
    if isinstance(plainb, tuple):  # (block_n, block_k, warps) of the LM head only
        configs = head_blocking(model, *plainb)
    elif plainb == "main":
        configs = main_table(model, batch)
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
        keys = dispatch_keys(rows)
        print(f"dispatch to linear_unfused (batch 16, measured per key above): {sorted(k.n for k in keys)}", flush=True)
        if keys:
            with dispatching(keys):
                r = ch.run_chain(model, 16, "step", pdl=True, per_group=False, repeats=10)
            rows.append(dataclasses.asdict(r) | {"tag": "step-dispatch", "dispatch": [k._asdict() for k in keys]})
            dump(res, "chain", rows)
        del model
        torch.cuda.empty_cache()


def dispatch_keys(rows: list) -> set:
    """Batch-16 keys (not the LM head) where the unfused path's sub-chain beat this kernel's by more
    than DISPATCH_MARGIN, both timed in this run."""
    from labkit.ops.linear import TuningKey

    per = {}
    for r in rows:
        if r["batch"] == 16 and r["tag"] in ("new", "torch"):
            for g in r["groups"]:
                if "us_per_kernel" in g:
                    per.setdefault(TuningKey(**g["key"]), {})[r["tag"]] = g["us_per_kernel"]
    return {k for k, v in per.items() if len(v) == 2 and k.n < 32768 and v["torch"] < v["new"] * (1 - DISPATCH_MARGIN)}


class dispatching:
    """labkit.tuning.linear_impl says "torch" at ``keys`` (as a tuning-file entry with impl would)."""

    def __init__(self, keys: set) -> None:
        self.keys = keys

    def __enter__(self):
        from labkit import tuning
        from labkit.ops.linear import tuning_key

        self.saved = tuning.linear_impl

        def impl(m, n, k, *, row_blocks=1, device=None, **_):
            return "torch" if tuning_key(m, n, k, row_blocks=row_blocks) in self.keys else "triton"
        tuning.linear_impl = impl
        return self

    def __exit__(self, *exc):
        from labkit import tuning

        tuning.linear_impl = self.saved


def stage_decode(res: Path) -> None:
    """This branch's defaults: batch 1 with and without PDL, batch 16 with PDL, and batch 16 with the
    projections dispatched to linear_unfused where the chain stage measured that faster per key."""
    from labkit.backends import release_pooled
    from labkit.bench.decode import time_decode

    keys = set()
    for sub in ("lfm2", "qwen"):
        path = res / sub / "chain.json"
        if path.exists():
            keys |= dispatch_keys(json.loads(path.read_text()))
    print(f"dispatch keys (n): {sorted(k.n for k in keys)}", flush=True)
    rows = []
    models = {name: build(name, dtype=torch.bfloat16, device="cuda", seed=0) for name in MODELS}
    runs = [(1, "fused+graph+pdl", False), (16, "fused+graph+pdl", False), (16, "fused+graph+pdl", True),
            (1, "fused+graph", False)]
    for batch, impl, dispatch in runs:
        if dispatch and not keys:
            continue
        for name, model in models.items():
            release_pooled(model)
            with dispatching(keys if dispatch else set()):
                r = time_decode(model, impl, batch, prompt=32, new_tokens=64, repeats=3)
            rows.append(dataclasses.asdict(r) | {"dispatch": dispatch})
            print(f"decode {name:>14} B={batch:<3} {impl:16} dispatch={dispatch!s:5} "
                  f"{r.tokens_per_s or 0:9.1f} tok/s {r.error or ''}", flush=True)
            dump(res, "decode", rows)


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
