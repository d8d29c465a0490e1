"""Where labkit's files are: the tuning tables, the shipped checkpoints, the CUDA sources, the notebooks
and the committed results. One function per kind of file, so that every module asks here instead of
counting ``parent`` steps from its own location.

Two places can hold them:

- an installed package (``pip install .``, not editable): the build copies what the product reads at
  run time into the package, ``labkit/_data/{tuning,checkpoints,kernels}`` (setup.py, :data:`SHIPPED`);
- a checkout (the repository, used in place or through an editable install): the repository's own
  folders beside ``labkit/``, ``data/{tuning,checkpoints,bench}``, ``kernels/``, ``notebooks/``.

The installed copy wins where it exists. The bench results and the notebooks are the lab's and are
not installed: asking for them without a checkout raises :class:`MissingResource`, naming what is
absent and how to get it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # in a checkout: the repository, which holds labkit/, data/, kernels/, notebooks/
INSTALLED_DIR = PACKAGE_DIR / "_data"  # what the build copied into an installed package (absent in a checkout)

# The files the build copies into the package: installed name -> (folder of the checkout, patterns).
# setup.py reads this table, so that what is shipped and where it is looked for are written once.
SHIPPED: dict[str, tuple[str, tuple[str, ...]]] = {
    "tuning": ("data/tuning", ("*.json",)),
    "checkpoints": ("data/checkpoints", ("**/*",)),
    "kernels": ("kernels", ("*.cu", "*.cuh", "*.cpp")),  # the .cpp is the torch binding cuda builds with them
}


class MissingResource(FileNotFoundError):
    """A file location labkit needs is neither in the installed package nor in a checkout."""


def checkout() -> Path | None:
    """The repository labkit runs from, or None for an installed package (nothing beside it is ours)."""
    return REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "kernels").is_dir() else None


def _shipped(name: str, what: str) -> Path:
    installed = INSTALLED_DIR / name
    if installed.is_dir():
        return installed
    root = checkout()
    if root is not None:
        return root / SHIPPED[name][0]
    raise MissingResource(
        f"{what} are missing: labkit at {PACKAGE_DIR} has no {installed} (its build copies them there) and "
        f"is not in a checkout; reinstall it from the repository with `pip install .` (or `pip install -e .`)")


def _checkout_only(relative: str, what: str) -> Path:
    root = checkout()
    if root is None:
        raise MissingResource(
            f"{what} ({relative}/ of the repository) are not installed with the package: labkit at {PACKAGE_DIR} "
            "is installed without its checkout; run this from a clone of the repository "
            "(`pip install -e .` there), or give the command a directory of your own where it takes one")
    return root / relative


def tuning_dir() -> Path:
    """The measured kernel settings, one file per GPU."""
    return _shipped("tuning", "the tuning tables (data/tuning/*.json)")


def checkpoints_dir() -> Path:
    """The shipped checkpoints, one directory each."""
    return _shipped("checkpoints", "the shipped checkpoints (data/checkpoints/)")


def kernels_dir() -> Path:
    """The CUDA C++ sources (``.cu``/``.cuh`` and the torch binding) that :mod:`labkit.cuda` builds."""
    return _shipped("kernels", "the CUDA sources (kernels/*.cu, *.cuh)")


def bench_dir() -> Path:
    """``data/bench``: the committed results, per GPU (a checkout only)."""
    return _checkout_only("data/bench", "the bench results")


def notebooks_dir() -> Path:
    """The workbook's notebooks (a checkout only)."""
    return _checkout_only("notebooks", "the notebooks")
