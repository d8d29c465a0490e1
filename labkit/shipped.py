"""The small trained checkpoints that ship with the workbook (``data/checkpoints/`` of the repository).

    model = labkit.load(labkit.checkpoint_path("byte-lfm2-6m"), dtype=torch.float32)
    tok = labkit.ByteTokenizer.from_checkpoint(labkit.checkpoint_path("byte-lfm2-6m"))

Both are byte-level models trained by ``python -m labkit.train`` on the Python standard library's
own source; each directory holds config.json + model.safetensors (transformers' format),
byte_tokenizer.json, training.json (the full record of the run) and a README.md model card.
They are found through :func:`labkit.resources.checkpoints_dir` (the installed package's copy, or
the checkout's ``data/checkpoints``); set ``LABKIT_CHECKPOINTS`` to look elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import resources


def checkpoints_dir() -> Path:
    env = os.environ.get("LABKIT_CHECKPOINTS")
    return Path(env).expanduser() if env else resources.checkpoints_dir()


# name -> what it is; the files are at checkpoints_dir() / name
CHECKPOINTS: dict[str, str] = {
    "byte-lfm2-6m": "LFM2 structure (gated short conv + GQA attention), 8 layers, hidden 256, byte vocab",
    "byte-qwen3.5-6m": "Qwen3.5 structure (3x Gated DeltaNet + 1 gated attention), 8 layers, hidden 256, byte vocab",
}


def checkpoint_path(name: str) -> Path:
    """Directory of a shipped checkpoint; raises FileNotFoundError (saying how to make it) if absent."""
    if name not in CHECKPOINTS:
        raise KeyError(f"unknown checkpoint {name!r}; shipped: {sorted(CHECKPOINTS)}")
    path = checkpoints_dir() / name
    if not (path / "config.json").exists():
        family = "lfm2" if "lfm2" in name else "qwen3.5"
        raise FileNotFoundError(
            f"checkpoint {name!r} is not at {path}; train it with "
            f"`python -m labkit.train --family {family} --out {path}` (see labkit/train/)"
        )
    return path


def load_model(name: str, dtype, device, seed: int = 0):
    """A model by name: a shipped checkpoint (:data:`CHECKPOINTS`, its trained weights, loaded with
    :func:`labkit.load`), else a preset (:data:`labkit.PRESETS`) with seeded random weights
    (:func:`labkit.build`, the same weights for the same seed on every machine)."""
    if name in CHECKPOINTS:
        from .checkpoint import load

        return load(checkpoint_path(name), dtype=dtype, device=device)
    from .model import build

    return build(name, dtype=dtype, device=device, seed=seed)


def available_checkpoints() -> list[str]:
    """Names of the shipped checkpoints present on this machine."""
    return [n for n in CHECKPOINTS if (checkpoints_dir() / n / "config.json").exists()]
