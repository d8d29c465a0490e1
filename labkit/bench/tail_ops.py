"""A prefix-cache hit's tail, op by op: its MLP gate|up (cuBLAS then the SwiGLU kernel, against one
skinny GEMM with SwiGLU in its epilogue: :func:`labkit.ops.prefill_fusions.gate_up_swiglu`) and its
attention after the cached prefix (SDPA's bottom-right causal form, against the key-split kernels of
:mod:`labkit.ops.tail_attention`).

    python -m labkit bench tail-ops --models qwen3.5-0.8b lfm2-350m --rows 16 64 [--sweep] --name tail-ops
    python -m labkit bench tail-ops --rows --prompt 4096 1024 512 --name prompt-gate-up --write-tuning

``--prompt TOKENS`` also times the gate|up of a whole prompt: cuBLAS then the SwiGLU kernel against
the tiled Triton GEMM with SwiGLU in its epilogue (:mod:`labkit.ops.gemm_swiglu`, pointer and
persistent TMA forms), at each blocking of :func:`_prompt_configs`, and cuBLAS's GEMM alone;
``--write-tuning`` writes the winner and the length it pays from as the GPU's ``prompt_gate_up``
settings (:func:`prompt_gate_up_entry`), which the fused prefill then takes.

Each form runs as a chain over every layer's own weights (random, the preset's shapes: more bytes
than L2 holds, as in a tail's replay, where each layer reads its weights once) or, for attention,
every attention layer's own keys and values (``--prefix`` cached tokens, the tail's rows as new
tokens), captured in one CUDA graph and replayed; the figure is the median replay divided by the
layers, so a kernel's launch gap inside the graph is in it. The floor beside each: the layer's
weight (or key and value) bytes at the GPU's measured copy bandwidth. ``--sweep`` also times the
skinny GEMM's blockings (one K split: split-K's partial sums were slower at 64 rows in the sweep
that chose the default) and reports the fastest. Each form's output is checked against the
reference: ``swiglu_ref(F.linear(x, w))``, :func:`labkit.ops.mixers.attend_ref`.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

SWEEP = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=st)
         for bn, bk in ((16, 128), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64), (128, 128))
         for w, st in ((4, 3), (4, 4), (8, 3))]


@dataclass
class TailOpRow:
    op: str  # "gate_up", "attention" (a tail's) or "prompt_gate_up"
    model: str
    rows: int  # new tokens (attention: per sequence, batch 1); a prompt's tokens
    layers: int
    floor_us: float  # one layer's weights (attention: keys and values in use) at the measured copy bandwidth
    shape: dict = field(default_factory=dict)
    baseline_us: float | None = None  # cuBLAS then swiglu_rows; SDPA's attend_continuing
    # gate_up_swiglu (the GPU's tail_gate_up settings); attend_tail; gemm_swiglu's fastest blocking
    fused_us: float | None = None
    settings: dict = field(default_factory=dict)
    rel_err: float | None = None  # the fused form against the reference, layer 0
    baseline_rel_err: float | None = None
    sweep: list = field(default_factory=list)  # {settings, us, rel_err} per blocking, fastest first
    error: str | None = None


def _chain_us(calls) -> float:
    """Microseconds per call of the chain (measure's median replay, divided by its calls)."""
    from ..lab.timing import measure

    return measure(calls, repeats=15, warmup=2).ms * 1000


def _gate_up_case(model: str, rows: int, seed: int, device: str = "cuda") -> tuple:
    """(K, W, layers, every layer's random gate|up weight [2W, K], the input [rows, K]), bf16, at the
    preset's shapes (weights scaled by 1/sqrt(K), as a trained model's projections keep activations)."""
    from ..config import PRESETS

    cfg = PRESETS[model]
    K, W, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    gen = torch.Generator(device=device).manual_seed(seed)
    weights = [(torch.randn(2 * W, K, device=device, generator=gen) * K**-0.5).to(torch.bfloat16) for _ in range(L)]
    return K, W, L, weights, torch.randn(rows, K, device=device, generator=gen).to(torch.bfloat16)


def bench_gate_up(model: str, rows: int, copy_bytes_per_s: float, sweep: bool = False) -> TailOpRow:
    from .. import tuning
    from ..ops.mixers import swiglu_ref
    from ..ops.prefill_fusions import gate_up_swiglu, swiglu_rows
    from .decode import _error
    from .ops import rel_err

    K, W, L, weights, x = _gate_up_case(model, rows, seed=0)
    row = TailOpRow("gate_up", model, rows, L, 2 * W * K * 2 / copy_bytes_per_s * 1e6, dict(hidden=K, width=W))
    want = swiglu_ref(F.linear(x, weights[0]))
    try:
        row.baseline_us = _chain_us([lambda w=w: swiglu_rows(F.linear(x, w)) for w in weights])
        row.baseline_rel_err = rel_err(swiglu_rows(F.linear(x, weights[0])), want)
        row.settings = dict(tuning.settings("tail_gate_up", x.device))
        row.rel_err = rel_err(gate_up_swiglu(x, weights[0], **row.settings), want)
        row.fused_us = _chain_us([lambda w=w: gate_up_swiglu(x, w, **row.settings) for w in weights])
        for blocking in SWEEP if sweep else []:
            s = {**row.settings, **blocking, "max_rows": max(rows, 1)}
            try:
                err = rel_err(gate_up_swiglu(x, weights[0], **s), want)
                us = _chain_us([lambda w=w: gate_up_swiglu(x, w, **s) for w in weights])
                row.sweep.append(dict(settings=blocking, us=us, rel_err=err))
            except Exception as exc:  # a blocking that does not fit (shared memory): recorded
                row.sweep.append(dict(settings=blocking, error=_error(exc)))
        row.sweep.sort(key=lambda r: r.get("us", float("inf")))
    except Exception as exc:
        row.error = _error(exc)
    return row


def bench_attention(model: str, rows: int, prefix: int, copy_bytes_per_s: float) -> TailOpRow:
    from ..config import PRESETS
    from ..ops.mixers import attend_continuing, attend_ref
    from ..ops.tail_attention import attend_tail
    from .decode import _error
    from .ops import rel_err

    cfg = PRESETS[model]
    dt, dev = torch.bfloat16, torch.device("cuda")
    nh, nkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    L = cfg.layer_types.count("attention")
    used = prefix + rows
    gen = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(1, rows, nh, D, device=dev, generator=gen).to(dt).transpose(1, 2)
    kv = [tuple(torch.randn(1, nkv, used, D, device=dev, generator=gen).to(dt) for _ in range(2)) for _ in range(L)]
    positions = (prefix + torch.arange(rows, device=dev))[None]
    key_positions = torch.arange(used, device=dev)[None]
    row = TailOpRow("attention", model, rows, L, 2 * nkv * used * D * 2 / copy_bytes_per_s * 1e6,
                    dict(prefix=prefix, heads=nh, kv_heads=nkv, head_dim=D))
    try:
        want = attend_ref(q.float(), kv[0][0].float(), kv[0][1].float(), positions, key_positions)
        sdpa = lambda k, v: attend_continuing(q, k, v, positions, key_positions, start=prefix)  # noqa: E731
        mine = lambda k, v: attend_tail(q, k, v, positions, key_positions, start=prefix)  # noqa: E731
        row.baseline_rel_err = rel_err(sdpa(*kv[0]).float(), want)
        row.rel_err = rel_err(mine(*kv[0]).float(), want)
        row.baseline_us = _chain_us([lambda k=k, v=v: sdpa(k, v) for k, v in kv])
        row.fused_us = _chain_us([lambda k=k, v=v: mine(k, v) for k, v in kv])
    except Exception as exc:
        row.error = _error(exc)
    return row


def _prompt_configs() -> list:
    """The prompt GEMM's blockings: the pointer form's fastest of its earlier sweep (prompt-gate-up.json,
    2026-12-06), then the persistent TMA form's (shared memory per stage: x, gate and up tiles)."""
    from ..ops.gemm_swiglu import GemmConfig

    pointer = [GemmConfig(128, 128, 32, 8, 8, stages) for stages in (4, 5, 6)]
    persistent = [GemmConfig(bm, bn, bk, 8, warps, stages, persistent=True, flatten=flat, split_store=split)
                  for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 32, 8, 6),
                                                    (128, 64, 64, 4, 4), (128, 64, 64, 8, 5), (64, 128, 64, 4, 4),
                                                    (256, 64, 64, 8, 3))
                  for flat in (True, False) for split in (False, True)]
    return pointer + persistent


def bench_prompt_gate_up(model: str, tokens: int, copy_bytes_per_s: float) -> TailOpRow:
    """The gate|up of a ``tokens``-row prompt: cuBLAS then the SwiGLU kernel against
    :func:`labkit.ops.gemm_swiglu.gemm_swiglu` at each blocking of :func:`_prompt_configs` (``sweep``,
    fastest first; ``fused_us`` the fastest); cuBLAS's GEMM alone beside them (``shape["gemm_us"]``)."""
    from dataclasses import asdict

    from ..ops.gemm_swiglu import gemm_swiglu
    from ..ops.mixers import swiglu_ref
    from ..ops.prefill_fusions import swiglu_rows
    from .decode import _error
    from .ops import rel_err

    K, W, L, weights, x = _gate_up_case(model, tokens, seed=2)
    row = TailOpRow("prompt_gate_up", model, tokens, L, 2 * W * K * 2 / copy_bytes_per_s * 1e6,
                    dict(hidden=K, width=W, flops_per_layer=2 * tokens * 2 * W * K))
    try:
        want = swiglu_ref(F.linear(x, weights[0]))
        row.baseline_us = _chain_us([lambda w=w: swiglu_rows(F.linear(x, w)) for w in weights])
        row.shape["gemm_us"] = _chain_us([lambda w=w: F.linear(x, w) for w in weights])
        row.baseline_rel_err = rel_err(swiglu_rows(F.linear(x, weights[0])), want)
        for c in _prompt_configs():
            try:
                err = rel_err(gemm_swiglu(x, weights[0], c), want)
                us = _chain_us([lambda w=w: gemm_swiglu(x, w, c) for w in weights])
                row.sweep.append(dict(settings=asdict(c), us=us, rel_err=err))
            except Exception as exc:  # a tile that does not fit (shared memory): recorded
                row.sweep.append(dict(settings=asdict(c), error=_error(exc)))
        row.sweep.sort(key=lambda r: r.get("us", float("inf")))
        best = row.sweep[0]
        row.fused_us, row.rel_err, row.settings = best.get("us"), best.get("rel_err"), best["settings"]
    except Exception as exc:
        row.error = _error(exc)
    return row


def prompt_gate_up_entry(rows: list[TailOpRow], *, source: str, results: str, date: str) -> dict | None:
    """The tuning file's ``prompt_gate_up`` entry that ``rows`` (the prompt rows of one run, every
    model at every length) measure, or None if no blocking ran at every model's longest prompt.

    The blocking: the smallest geometric mean, over the models, of its time at the longest prompt
    over cuBLAS + SwiGLU's. ``min_rows``: the shortest measured length from which that blocking beat
    cuBLAS + SwiGLU for every model at that length and every longer one measured (0, never, where it
    lost at the longest); prompts shorter than ``min_rows`` stay on cuBLAS."""
    from ..tuning.kernel_settings import SPECS

    rows = [r for r in rows if r.op == "prompt_gate_up" and not r.error]
    if not rows:
        return None
    longest = max(r.rows for r in rows)
    at = {(r.model, r.rows): r for r in rows}
    models = sorted({r.model for r in rows})

    def us(model: str, tokens: int, settings: dict) -> float | None:
        r = at.get((model, tokens))
        return None if r is None else next((s["us"] for s in r.sweep if s["settings"] == settings and "us" in s), None)

    def ratio(model: str, tokens: int, settings: dict) -> float:
        t = us(model, tokens, settings)
        return float("inf") if t is None else t / at[(model, tokens)].baseline_us

    first = next(r for r in rows if r.rows == longest)
    candidates = [s["settings"] for s in first.sweep if all(us(m, longest, s["settings"]) is not None for m in models)]
    if not candidates:
        return None
    geomean = lambda c: math.prod(ratio(m, longest, c) for m in models) ** (1 / len(models))  # noqa: E731
    best = min(candidates, key=geomean)
    min_rows = 0
    for tokens in sorted({r.rows for r in rows}, reverse=True):
        if any((m, tokens) not in at or ratio(m, tokens, best) >= 1 for m in models):
            break
        min_rows = tokens
    figures = "; ".join(
        f"{m} at {t:,} rows {us(m, t, best):.1f} us against {at[(m, t)].baseline_us:.1f}"
        for m in models for t in sorted({r.rows for r in rows}, reverse=True) if us(m, t, best) is not None)
    measured = (f"a chain over every layer's gate|up weights in a CUDA graph, median of 15 replays: the blocking "
                f"with the smallest geometric mean over the models of its time over cuBLAS + SwiGLU's at "
                f"{longest:,} rows; {figures} (cuBLAS + SwiGLU); "
                + (f"min_rows {min_rows}: from there on it won at every measured length"
                   if min_rows else "min_rows 0 (never): it did not beat cuBLAS + SwiGLU for every model"))
    values = {"min_rows": min_rows, **{k: v for k, v in best.items() if k in SPECS["prompt_gate_up"]}}
    return {"values": values, "source": source, "date": date, "results": results, "measured": measured}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ..config import PRESETS
    from ..lab.hw import device_facts
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="python -m labkit bench tail-ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3.5-0.8b", "lfm2-350m"], choices=list(PRESETS))
    p.add_argument("--rows", nargs="*", type=positive_int, default=[16, 64], help="the tail's new tokens (none: no tail ops)")
    p.add_argument("--prefix", type=positive_int, default=4096, help="cached tokens before the tail (attention)")
    p.add_argument("--sweep", action="store_true", help="also time the skinny GEMM's blockings")
    p.add_argument("--prompt", nargs="*", type=positive_int, default=[], metavar="TOKENS",
                   help="also the gate|up of a prompt of each TOKENS rows: cuBLAS + SwiGLU against labkit.ops.gemm_swiglu")
    p.add_argument("--name", type=results_name, help="also write data/bench/<gpu>/<name>.json")
    p.add_argument("--write-tuning", action="store_true",
                   help="with --prompt and --name: write the winner as this GPU's prompt_gate_up settings "
                        "(data/tuning/<gpu>.json; prompt_gate_up_entry says how it is chosen)")
    args = p.parse_args(argv)
    if args.write_tuning and not (args.prompt and args.name):
        p.error("--write-tuning needs --prompt (what it measures) and --name (the results its entry cites)")
    if not torch.cuda.is_available():
        p.error("the tail benchmark times CUDA graphs: it needs a CUDA GPU")
    facts = device_facts("cuda")
    rows = []
    print(f"{'op':>9} {'model':>13} {'rows':>4} {'floor us':>8} {'baseline':>8} {'fused':>7} {'best of sweep':>13}  rel err")
    for model in args.models:
        for m in args.rows:
            for r in (bench_gate_up(model, m, facts.copy_bytes_per_s, args.sweep),
                      bench_attention(model, m, args.prefix, facts.copy_bytes_per_s)):
                rows.append(r)
                if r.error:
                    print(f"{r.op:>9} {model:>13} {m:>4} FAILED {r.error}")
                    continue
                best = next((s for s in r.sweep if "us" in s), None)
                print(f"{r.op:>9} {model:>13} {m:>4} {r.floor_us:8.2f} {r.baseline_us:8.2f} {r.fused_us:7.2f} "
                      f"{best['us'] if best else float('nan'):13.2f}  {r.rel_err:.1e}"
                      + (f"  {best['settings']}" if best else ""))
        for tokens in args.prompt:
            r = bench_prompt_gate_up(model, tokens, facts.copy_bytes_per_s)
            rows.append(r)
            if r.error:
                print(f"{r.op:>9} {model:>13} {tokens:>4} FAILED {r.error}")
            else:
                flops = r.shape["flops_per_layer"]
                print(f"   prompt {model:>13} {tokens}: cuBLAS + SwiGLU {r.baseline_us:.1f} us "
                      f"({flops / r.baseline_us / 1e6:.0f} TFLOP/s of the GEMM's; the GEMM alone "
                      f"{r.shape['gemm_us']:.1f}), fused {r.fused_us:.1f} us ({flops / r.fused_us / 1e6:.0f}) {r.settings}")
                for c in r.sweep:
                    print(f"      {c.get('us', float('nan')):7.1f} us  {c['settings']}  {c.get('error', '')}")
    if args.name:
        argv = sys.argv[1:] if argv is None else argv
        command = shlex.join(["python", "-m", "labkit", "bench", "tail-ops", *argv])
        path = write_results(args.name, "tail-ops", rows, facts, command=command, data_dir=DATA_DIR)
        print(path)
        if args.write_tuning:
            write_prompt_tuning(rows, facts, command, path)
    return 1 if any(r.error for r in rows) else 0


def write_prompt_tuning(rows: list[TailOpRow], facts, command: str, results: Path) -> None:
    """The run's :func:`prompt_gate_up_entry` into this GPU's tuning file (its other entries kept)."""
    import datetime as dt

    from .. import resources, tuning

    root = resources.checkout()
    try:
        cited = results.resolve().relative_to(root).as_posix() if root else str(results)
    except ValueError:  # results written outside the repository: cite the path as given
        cited = str(results)
    entry = prompt_gate_up_entry(rows, source=command, results=cited, date=dt.date.today().isoformat())
    if entry is None:
        print("no blocking ran at every model's longest prompt: the tuning file is left as it was")
        return
    path = tuning.update_tuning_file(tuning.tuning_path(facts.name), facts.name, settings={"prompt_gate_up": entry})
    print(f"{path}: prompt_gate_up {entry['values']}")


if __name__ == "__main__":
    raise SystemExit(main())
