"""Where labkit's files are: the tuning tables, the shipped checkpoints, the CUDA sources, the notebooks
and the committed results.

In a checkout they are the repository's own folders (``data/``, ``kernels/``, ``notebooks/``) beside
``labkit/``. One function per kind of file, so that every module asks here instead of counting
``parent`` steps from its own location.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # the checkout that holds labkit/, data/, kernels/, notebooks/


def data_dir() -> Path:
    """``data/``: bench results per GPU, tuning tables per GPU, shipped checkpoints."""
    return REPO_ROOT / "data"


def tuning_dir() -> Path:
    return data_dir() / "tuning"


def checkpoints_dir() -> Path:
    return data_dir() / "checkpoints"


def bench_dir() -> Path:
    return data_dir() / "bench"


def kernels_dir() -> Path:
    """The CUDA C++ sources (``.cu``/``.cuh``) that :mod:`labkit.cuda` builds."""
    return REPO_ROOT / "kernels"


def notebooks_dir() -> Path:
    return REPO_ROOT / "notebooks"
