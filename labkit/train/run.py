"""One training run, from options to a checkpoint directory with its record and model card.

Evaluation. Held-out loss in nats per token (= per byte but for the two specials per file) and
bits per byte, on ``eval_windows`` windows of ``seq + 1`` tokens at evenly spaced offsets of the
held-out stream: periodically in the training precision on 64 evenly spaced ones, and at the end in
float32 on all of them, from the saved bfloat16 weights reloaded with ``labkit.load``, i.e. the
model users get. A subset (``check_windows``) is stored in training.json with its loss, so a test
can recompute the figure on any machine without this machine's standard library.

Outputs in ``out``: config.json + model.safetensors (``labkit.save``, bfloat16),
byte_tokenizer.json, training.json (the record) and a README.md model card made from the record.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load, save
from ..resources import checkout
from ..config import ModelConfig
from ..model import HybridLM, empty_model
from ..tokenizer import ByteTokenizer
from .card import model_card
from .configs import byte_config
from .corpus import eval_windows, load_corpus, pack_windows
from .loop import LN2, Progress, fit, heldout_loss, init_for_training
from .options import TrainOptions

SAMPLE_PROMPT = "def fibonacci(n):"
PERIODIC_EVAL_WINDOWS = 64


def train(family: str, out: str | Path | None = None, *, config: ModelConfig | None = None,
          argv: list[str] | None = None, **options: Any) -> dict[str, Any]:
    """Train one model and save it to ``out``; ``options`` are the fields of ``TrainOptions``
    (their defaults and meaning are there). See ``run_training``."""
    return run_training(TrainOptions(family=family, out=out, **options), config=config, argv=argv)


def run_training(
    opts: TrainOptions, config: ModelConfig | None = None, argv: list[str] | None = None
) -> dict[str, Any]:
    """Train one model and save it to ``opts.out``; returns the run's record (also written as
    training.json), whose ``"history"`` holds the logged train losses and held-out evaluations.

    ``config`` overrides the (family, size) configuration; it must have the byte vocabulary.
    ``opts.out=None`` trains and evaluates without writing anything (and without the reload check).
    ``argv`` is the command line as typed, kept in the record beside the full command.
    """
    t_start = time.perf_counter()
    tok = ByteTokenizer()
    cfg = config or byte_config(opts.family, opts.size)
    if opts.name:
        cfg = cfg.replace(name=opts.name)
    if cfg.family != opts.family:
        raise ValueError(f"config family {cfg.family!r} differs from --family {opts.family!r}")
    if cfg.vocab_size != tok.vocab_size:
        raise ValueError(f"a byte-level model needs vocab_size {tok.vocab_size}, config has {cfg.vocab_size}")
    dev = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    opts = dataclasses.replace(opts, device=str(dev))  # the record names the device it ran on

    torch.manual_seed(opts.seed)
    corpus = load_corpus(opts.corpus_root, opts.max_train_bytes, opts.max_heldout_bytes)
    if corpus.train.numel() <= opts.seq + 1:
        raise ValueError(f"train stream ({corpus.train.numel()} tokens) is shorter than one crop of {opts.seq + 1}")
    windows = eval_windows(corpus.heldout, opts.eval_windows, opts.seq + 1)
    n_check = min(opts.check_windows, windows.shape[0])
    check_idx = torch.linspace(0, windows.shape[0] - 1, n_check).round().long().unique()
    check = windows[check_idx]
    # periodic evaluations use an evenly spaced subset, so they estimate the final figure (the first
    # windows alone come from the first few held-out files)
    periodic = windows[:: max(1, windows.shape[0] // PERIODIC_EVAL_WINDOWS)][:PERIODIC_EVAL_WINDOWS]

    model = init_for_training(empty_model(cfg, torch.float32, dev), opts.seed).requires_grad_(True).train()
    n_params = model.num_parameters()
    progress = Progress(opts.progress, opts.steps, cfg.name)
    progress.say(f"{cfg.name}: {n_params / 1e6:.2f} M parameters; corpus: Python {corpus.stats['python_version']} "
                 f"stdlib, {corpus.stats['train_files']} train files ({corpus.stats['train_tokens'] / 1e6:.1f} M "
                 f"tokens), {corpus.stats['heldout_files']} held-out files; device {dev}; "
                 f"batch {opts.batch} x seq {opts.seq}")
    t_setup = time.perf_counter() - t_start
    run = fit(model, corpus.train.to(dev), periodic, opts, progress)

    # Final evaluation in float32 of the weights as saved (bfloat16), reloaded the way users load them.
    t1 = time.perf_counter()
    model.eval().requires_grad_(False)
    out_path = Path(opts.out) if opts.out is not None else None
    if out_path is not None:
        save(model, out_path, dtype=torch.bfloat16, extra_config={"labkit_tokenizer": "byte_tokenizer.json"})
        tok.save(out_path)
        final = load(out_path, dtype=torch.float32, device=dev)
    else:
        final = _as_saved(model)
    full = heldout_loss(final, windows, opts.batch)
    check_loss = heldout_loss(final, check, opts.batch)
    sample_ids = _sample(final, tok, opts.sample_tokens)
    t_eval = time.perf_counter() - t1

    tokens_seen = run.steps * opts.batch * opts.seq
    record: dict[str, Any] = {
        "format": "labkit-train-record",
        "version": 1,
        "name": cfg.name,
        "family": cfg.family,
        "command": opts.command(),
        "argv": argv,
        "args": opts.recorded(),
        "model": {"config": cfg.to_dict(), "parameters": n_params, "saved_dtype": "bfloat16",
                  "checkpoint_bytes": (out_path / "model.safetensors").stat().st_size if out_path else None},
        "tokenizer": tok.to_dict(),
        "corpus": corpus.stats,
        "steps": run.steps,
        "stopped_by": run.stopped_by,
        "tokens_seen": tokens_seen,
        "epochs": tokens_seen / corpus.stats["train_tokens"],
        "warmup_steps": run.warmup_steps,
        "seconds": {"setup": round(t_setup, 2), "train": round(run.seconds, 2), "final_eval": round(t_eval, 2),
                    "total": round(time.perf_counter() - t_start, 2)},
        "steps_per_s": run.steps / run.seconds if run.seconds > 0 else None,
        "device": _device_info(dev),
        "autocast": "bfloat16" if run.autocast else None,
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "final": {
            "train_loss": run.train_loss,
            "train_bits_per_byte": run.train_loss / LN2 if run.train_loss is not None else None,
            "heldout_loss": full,
            "heldout_bits_per_byte": full / LN2,
            "heldout_windows": int(windows.shape[0]),
            "window_tokens": opts.seq + 1,
            "how": "float32 forward of the saved bfloat16 weights; mean next-token cross-entropy in nats",
        },
        "check": {
            "what": "held-out windows (a subset of the final evaluation's) and their loss, for tests",
            "window_indices": check_idx.tolist(),
            "windows": pack_windows(check),
            "loss": check_loss,
            "bits_per_byte": check_loss / LN2,
            "device": str(dev),
        },
        "sample": {"prompt": SAMPLE_PROMPT, "bos": True, "max_new_tokens": opts.sample_tokens, "greedy": True,
                   "backend": "reference", "dtype": "float32", "device": "cpu", "stop_tokens": [tok.EOS],
                   "tokens": sample_ids, "text": tok.decode(sample_ids)},
        "history": run.history,
    }
    progress.say(f"{cfg.name}: {run.steps} steps ({run.stopped_by}), {tokens_seen / 1e6:.1f} M tokens in "
                 f"{run.seconds:.0f} s; held-out {full:.4f} nats/byte = {full / LN2:.3f} bits/byte")
    if out_path is not None:
        (out_path / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        (out_path / "README.md").write_text(model_card(record))
    return record


def _as_saved(model: HybridLM) -> HybridLM:
    """A float32 copy of ``model`` with its weights rounded to bfloat16, as ``labkit.save`` stores them."""
    copy = empty_model(model.cfg, torch.float32, model.device)
    with torch.no_grad():
        for p, q in zip(copy.parameters(), model.parameters()):
            p.copy_(q.to(torch.bfloat16).float())
    return copy


def _sample(model: HybridLM, tok: ByteTokenizer, max_new_tokens: int) -> list[int]:
    """The card's sample: greedy, float32, reference backend, on the CPU (so anyone can reproduce it)."""
    from ..generate import generate

    prompt = torch.tensor([tok.encode(SAMPLE_PROMPT)])
    out = generate(model.to("cpu"), prompt, max_new_tokens, stop_tokens=[tok.EOS], progress=False)
    return out.tokens[0].tolist()


def _versions() -> dict[str, Any]:
    from .. import __version__

    v: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "labkit": __version__}
    from importlib import metadata

    for dist in ("transformers", "triton", "numpy", "safetensors"):
        try:  # the installed version, without importing the package (transformers takes seconds)
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    v["cuda"] = torch.version.cuda
    repo = checkout()
    if repo is None:  # an installed package: no commit to record
        return v
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
        if head.returncode == 0:
            v["git_commit"] = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:  # noqa: BLE001 - not a git checkout, or no git
        pass
    return v


def _device_info(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                "capability": f"{p.major}.{p.minor}"}
    return {"type": device.type, "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
