"""Every option of a training run, declared once.

The fields of ``TrainOptions`` (name, type, default, the command line's help) make the command
line (``add_arguments``), the keyword arguments of ``labkit.train.train``, the record's ``"args"``
(``recorded``) and the command the record and the model card quote (``command``). A switch that
is on by default (``progress``) is spelled ``--no-<name>`` on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .configs import FAMILIES, SIZES

COMMAND = ("python", "-m", "labkit.train")


def _option(default: Any = dataclasses.MISSING, help: str = "", choices: tuple[str, ...] | None = None,
            recorded: bool = True) -> Any:
    """A field of ``TrainOptions``: ``help`` is the command line's; ``recorded=False`` keeps it out
    of the record and its command (it changes how a run reports, not what it computes)."""
    return field(default=default, metadata={"help": help, "choices": choices, "recorded": recorded})


@dataclass(frozen=True)
class TrainOptions:
    family: str = _option(help="model family (required unless --export-corpus)", choices=FAMILIES)
    out: str | None = _option(None, "checkpoint directory; if not given, data/checkpoints/<name>")
    size: str = _option("6m", "model size: 6m (the shipped checkpoints) or tiny (CPU tests)", SIZES)
    name: str | None = _option(None, "model name; if not given, byte-<family>-<size>")
    steps: int = _option(1600, "most optimizer steps (more overfits the stdlib corpus)")
    batch: int = _option(128, "random crops per step")
    seq: int = _option(512, "bytes per training crop")
    lr: float = _option(2e-3, "peak learning rate")
    min_lr_ratio: float = _option(0.1, "learning rate at the end of the cosine decay, as a fraction of --lr")
    warmup: int = _option(200, "warmup steps (at most steps/10)")
    weight_decay: float = _option(0.1, "AdamW weight decay of the matrices")
    grad_clip: float = _option(1.0, "gradient norm clipping threshold")
    seed: int = _option(0, "seed of the initial weights and of the crops")
    device: str | None = _option(None, "cuda, cuda:1, cpu; if not given, cuda when available")
    time_budget_s: float | None = _option(None, "stop training after this many seconds (then evaluate and save)")
    eval_every: int = _option(250, "steps between held-out evaluations (0: only at the end)")
    eval_windows: int = _option(256, "held-out windows in the final evaluation")
    check_windows: int = _option(16, "held-out windows stored for the tests")
    log_every: int = _option(25, "steps between logged train losses")
    compile: bool = _option(False, "torch.compile the loss (compile time counts in the budget)")
    max_train_bytes: int = _option(64 << 20, "cap of the train stream (whole files)")
    max_heldout_bytes: int = _option(4 << 20, "cap of the held-out stream (whole files)")
    sample_tokens: int = _option(96, "bytes in the card's greedy sample")
    corpus_root: str | None = _option(None, "train on a corpus exported by --export-corpus instead of "
                                            "this Python's stdlib")
    progress: bool = _option(True, "plain log lines, no progress bar", recorded=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Path):  # paths are recorded as strings
                object.__setattr__(self, f.name, str(value))
            choices = f.metadata["choices"]
            if choices and value not in choices:
                raise ValueError(f"unknown {f.name} {value!r}; {f.name}: {', '.join(map(repr, choices))}")
        if self.steps < 1 or self.batch < 1 or self.seq < 2:
            raise ValueError("steps and batch must be >= 1 and seq >= 2")

    def recorded(self) -> dict[str, Any]:
        """The options that define the run, in declaration order (the record's ``"args"``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["recorded"]}

    def command(self) -> str:
        """The command line that repeats this run."""
        parts = list(COMMAND)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not f.metadata["recorded"] or value is None:
                continue
            if isinstance(value, bool):
                if value != f.default:
                    parts.append(_flag(f))
            else:
                parts += [_flag(f), str(value)]
        return shlex.join(parts)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = None if f.default is dataclasses.MISSING else f.default
            if hints[f.name] is bool:
                action = "store_false" if default else "store_true"
                parser.add_argument(_flag(f), dest=f.name, action=action, help=f.metadata["help"])
                continue
            shown = f" (default: {default})" if default is not None else ""
            parser.add_argument(_flag(f), type=_scalar(hints[f.name]), default=default,
                                choices=f.metadata["choices"], help=f.metadata["help"] + shown)

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, **overrides: Any) -> TrainOptions:
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
        return cls(**{**values, **overrides})


def _flag(f: dataclasses.Field) -> str:
    """``--name``; ``--no-name`` for a switch that is on by default."""
    return ("--no-" if f.default is True else "--") + f.name.replace("_", "-")


def _scalar(hint: Any) -> type:
    """``int`` of ``int | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint
