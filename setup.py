"""The build step that makes labkit installable: the metadata is pyproject.toml's; this file only adds
the files the product reads at run time (the tuning tables, the shipped checkpoints, the CUDA sources)
to the built package, as ``labkit/_data/<name>/``, copied from where they live in the repository
(``data/``, ``kernels/``: the top level stays as it is). What is copied is ``labkit.resources.SHIPPED``,
the table that also tells the installed package where to look, read here from the file itself (the
build must not import labkit, which needs torch).

An editable install (``pip install -e .``) copies nothing: labkit then runs from the checkout and finds
the repository's folders in place.
"""

import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
RESOURCES = runpy.run_path(str(ROOT / "labkit" / "resources.py"))


def shipped_files() -> list[tuple[Path, Path]]:
    """(source in the repository, destination relative to the package) for every shipped file."""
    installed = Path(RESOURCES["INSTALLED_DIR"]).name
    pairs = []
    for name, (folder, patterns) in RESOURCES["SHIPPED"].items():
        src = ROOT / folder
        found = sorted({p for pattern in patterns for p in src.glob(pattern) if p.is_file()})
        if not found:
            raise SystemExit(f"labkit's build: nothing matches {patterns} in {src}; the package would ship "
                             f"without its {name}")
        pairs += [(p, Path(installed) / name / p.relative_to(src)) for p in found]
    return pairs


class BuildWithData(build_py):
    """build_py, then the shipped files into ``<build_lib>/labkit/_data``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for src, rel in shipped_files():
            dest = Path(self.build_lib) / "labkit" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)

    def get_outputs(self, include_bytecode=True):
        extra = [] if getattr(self, "editable_mode", False) else [
            str(Path(self.build_lib) / "labkit" / rel) for _, rel in shipped_files()]
        return super().get_outputs(include_bytecode) + extra


setup(cmdclass={"build_py": BuildWithData})
