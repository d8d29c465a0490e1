"""``python -m labkit train-tiny ...``: the options of ``TrainOptions`` plus ``--export-corpus``."""

from __future__ import annotations

import argparse
import sys

from ..shipped import checkpoints_dir
from .configs import byte_config
from .corpus import export_corpus
from .options import TrainOptions
from .run import run_training


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m labkit train-tiny",
                                description=sys.modules[__package__].__doc__.split("\n\n")[0])
    TrainOptions.add_arguments(p)
    p.add_argument("--export-corpus", metavar="DIR", help="copy this Python's corpus files to DIR and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser()
    a = p.parse_args(argv)
    if a.export_corpus:
        m = export_corpus(a.export_corpus)
        print(f"{m['files']} files, {m['bytes'] / 1e6:.1f} MB of Python {m['python_version']} stdlib -> {a.export_corpus}")
        return 0
    if a.family is None:
        p.error("--family is required")
    name = a.name or byte_config(a.family, a.size).name
    run_training(TrainOptions.from_namespace(a, out=a.out or str(checkpoints_dir() / name)), argv=argv)
    return 0
