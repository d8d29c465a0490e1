"""``python -m labkit bench ladder``: every rung of the decode ladder, both models, in one run, to
``data/bench/<gpu>/ladder.json`` (read back by :mod:`labkit.lab.ladder`, the headline figures'
one source).

Each row is :func:`labkit.bench.decode.time_decode` (greedy steps after a prompt, CUDA events,
warm-up, median of the repeats) of one (model, rung, batch), written as a "decode" row with two
more fields: ``rung`` (:data:`labkit.lab.ladder.RUNGS`) and ``tuning``. Every rung but "tuned" is
made and run inside :func:`labkit.tuning.heuristics_only` (``tuning: "heuristic"``), so that the
climb shows what each optimisation buys by itself; "tuned" is fused+graph+pdl with the GPU's tuning
file (``tuning``: the file). The peer ("transformers") is :mod:`labkit.bench.decode`'s.

A rung this device cannot make has a row with no figure and ``absent``, the reason as the decoder
refuses it (PDL before Hopper, :class:`labkit.ops.features.MissingFeature`; on a CPU, CUDA graphs;
"tuned" where the GPU has no tuning file): never a number from elsewhere. A rung that fails while
running has its ``error``, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import shlex
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import resources, tuning
from ..lab.ladder import LADDER_NAME, RUNGS, TUNED_IMPL
from ..ops.features import MissingFeature
from .decode import PEERS, DecodeResult, time_decode

GPU_MODELS = ("lfm2-350m", "qwen3.5-0.8b")
CPU_MODELS = ("tiny-lfm2", "tiny-qwen3.5")  # random weights at tiny sizes: Triton's interpreter is slow
HEURISTIC = "heuristic"


@dataclass
class LadderResult(DecodeResult):
    rung: str = ""
    tuning: str = HEURISTIC
    absent: str | None = None  # why this device has no figure for the rung (its refusal, verbatim)


def impl_of(rung: str) -> str:
    return TUNED_IMPL if rung == "tuned" else rung


def tuning_file(device: str) -> Path | None:
    """The GPU's tuning file if there is one (None on a CPU or for a GPU without a file)."""
    name = tuning.gpu_name(device)
    if name is None:
        return None
    path = tuning.tuning_path(name)
    return path if path.exists() else None


def _shown(path: Path) -> str:
    root = resources.checkout()
    try:
        return path.relative_to(root).as_posix() if root else str(path)
    except ValueError:
        return str(path)


def refusal(model, impl: str, batch: int, max_len: int) -> str | None:
    """Why ``impl`` cannot be made for ``model`` on its device (the decoder's own message), or None.
    A missing feature is a refusal anywhere; on a device that is not a CUDA GPU, so is any error
    at construction (the graph rungs need CUDA graphs). Elsewhere a construction error is left to
    :func:`time_decode`, which records it as a failure."""
    if impl in PEERS:
        return None
    from ..decode.registry import make_decoder

    try:
        make_decoder(impl, model, model.new_cache(batch, max_len))
    except MissingFeature as exc:
        return f"MissingFeature: {exc}"
    except Exception as exc:  # noqa: BLE001 - see the docstring
        if model.device.type == "cuda":
            return None
        return f"{type(exc).__name__}: {exc}"
    return None


def measure_rung(model, rung: str, batch: int, prompt: int, new_tokens: int, repeats: int, facts) -> LadderResult:
    impl = impl_of(rung)
    device = str(model.device)
    if rung == "tuned":
        path = tuning_file(device)
        if path is None:
            why = (f"no tuning file for this device ({tuning.untuned_message(tuning.gpu_name(device))})"
                   if tuning.gpu_name(device) else "a CPU has no tuning file: its kernels always use the heuristics")
            return LadderResult(model.cfg.name, impl, batch, prompt, new_tokens, rung=rung, tuning="none", absent=why)
        label, settings = _shown(path), nullcontext()
    else:
        label, settings = HEURISTIC, tuning.heuristics_only()
    with settings:
        why = refusal(model, impl, batch, prompt + new_tokens + 1)
        if why is not None:
            return LadderResult(model.cfg.name, impl, batch, prompt, new_tokens, rung=rung, tuning=label, absent=why)
        res = time_decode(model, impl, batch, prompt, new_tokens, repeats, warmup=1, facts=facts)
    return LadderResult(**asdict(res), rung=rung, tuning=label)


def _print(r: LadderResult) -> None:
    head = f"{r.model:>14} {r.rung:>16} B={r.batch:<3}"
    if r.absent:
        print(f"{head} absent: {r.absent}")
    elif r.error:
        print(f"{head} FAILED {r.error}")
    else:
        pct = f"{r.pct_of_roofline:5.1f}% of roofline" if r.pct_of_roofline is not None else ""
        print(f"{head} {r.tokens_per_s:10.1f} tok/s {r.step_ms:8.3f} ms/step ({r.tuning}) {pct}")


def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from ..lab.notebooks import cpu_environment
    from .cli import _models, positive_int, results_name
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench ladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=None,
                   help=f"presets, random weights (default: {' '.join(GPU_MODELS)} on a GPU, {' '.join(CPU_MODELS)} on a CPU)")
    p.add_argument("--rungs", nargs="+", default=list(RUNGS), choices=RUNGS, metavar="RUNG",
                   help=f"default: every rung ({', '.join(RUNGS)})")
    p.add_argument("--batch", nargs="+", type=positive_int, default=[1, 16])
    # the batch curve of the best rung (notebook 06) is part of the same run, so that its batch 1
    # and 16 are the ladder's own rows and no second file times them again
    p.add_argument("--tuned-batch", nargs="*", type=positive_int, default=[2, 4, 8, 32, 64, 128, 256],
                   help="more batches for the tuned rung only (default: 2 4 8 32 64 128 256 on a GPU; none on a CPU)")
    p.add_argument("--prompt", type=positive_int, default=128)
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--device", default="auto")
    p.add_argument("--name", type=results_name, default=LADDER_NAME, help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if not device.startswith("cuda"):
        cpu_environment()  # Triton's kernels run in its interpreter here
    models = args.models or list(GPU_MODELS if device.startswith("cuda") else CPU_MODELS)
    facts = device_facts(device)
    command = shlex.join(["python", "-m", "labkit", "bench", "ladder", *argv])
    rows: list[LadderResult] = []
    t0 = time.perf_counter()
    tuned_batches = args.tuned_batch if device.startswith("cuda") and "tuned" in args.rungs else []
    built = list(_models(models, device, torch.bfloat16))
    # the ladder itself first, the tuned rung's batch curve after it: a run cut short by a time
    # limit keeps the whole ladder
    plan = [(model, b, rung) for model in built for b in args.batch for rung in RUNGS if rung in args.rungs]
    plan += [(model, b, "tuned") for model in built for b in sorted(set(tuned_batches) - set(args.batch))]
    for model, b, rung in plan:
        rows.append(measure_rung(model, rung, b, args.prompt, args.new_tokens, args.repeats, facts))
        _print(rows[-1])
        # rewritten as it grows: a run stopped by a time limit keeps what it measured
        path = write_results(args.name, "decode", rows, facts, command=command, data_dir=args.data_dir)
    print(f"{time.perf_counter() - t0:.0f} s; wrote {path}")
    failed = [r for r in rows if r.error]
    if failed:
        print(f"{len(failed)} of {len(rows)} rows FAILED (first: {failed[0].model} {failed[0].rung}: {failed[0].error})")
    return 1 if failed else 0
