"""labkit installs (``pip install .``, not editable) and runs from the installed copy alone.

From a copy of the repository: an sdist, then a wheel built from that sdist (so MANIFEST.in and
setup.py's copy step are both exercised), installed with pip into a fresh venv. The venv sees the
packages of the interpreter running this test (torch, ...) through a .pth file that appends its
site-packages AFTER the venv's own; .pth files of a directory added that way are not processed, so an
editable labkit installed there stays invisible and the venv imports only the wheel's labkit (checked:
``labkit.__file__`` must be inside the venv). From a directory outside the repository it then loads a
shipped checkpoint, generates with the reference backend (the same tokens as the checkout's labkit),
reads the H200 tuning table, finds the CUDA sources, and finds no checkout (the lab's bench results
say so when asked for). Offline: no build isolation, no index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

import labkit

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT = "byte-lfm2-6m"
PROMPT = "def fibonacci(n):"
NEW_TOKENS = 8

# Runs in the fresh venv, from outside the repository; prints one JSON line of what it found.
CHECK = f"""
import json, torch
import labkit
from labkit import cuda, resources, tuning
from labkit.tokenizer import ByteTokenizer

model = labkit.load(labkit.checkpoint_path({CHECKPOINT!r}), dtype=torch.float32)
ids = torch.tensor([ByteTokenizer().encode({PROMPT!r})])
tokens = labkit.generate(model, ids, {NEW_TOKENS}, backend="reference", progress=False).tokens[0].tolist()
table = tuning.linear_table(tuning.tuning_path("NVIDIA H200"))  # the tuning table's most basic reader
try:
    resources.bench_dir()
    bench = None
except resources.MissingResource as exc:
    bench = str(exc)
from labkit.distributed.cli import labkit_importable

print(json.dumps({{
    "labkit": labkit.__file__,
    "checkpoint": str(labkit.checkpoint_path({CHECKPOINT!r})),
    "tokens": tokens,
    "linear_entries": len(table),
    "tuning_dir": str(resources.tuning_dir()),
    "kernels": [str(p) for p in cuda.kernel_sources()],
    "checkout": resources.checkout() and str(resources.checkout()),
    "bench_error": bench,
    "child_pythonpath": labkit_importable({{}}).get("PYTHONPATH"),
}}))
"""


# Without PYTHONPATH (a checkout on it, with its labkit.egg-info, would look installed to pip) and
# without LABKIT_CHECKPOINTS (the shipped copy is what is checked).
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LABKIT_CHECKPOINTS")}


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> str:
    out = subprocess.run(cmd, cwd=cwd, env={**ENV, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def _copy_repo(dest: Path) -> Path:
    """The repository as a clean clone has it (no builds, caches or installs)."""
    junk = shutil.ignore_patterns(".git", ".venv", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache",
                                  "_data", ".ipynb_checkpoints")
    shutil.copytree(REPO, dest, ignore=junk)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(fresh venv's python, the wheel, the copied source) with labkit installed from an sdist of a
    copy of this checkout."""
    tmp = tmp_path_factory.mktemp("install")
    src = _copy_repo(tmp / "src")
    dist = tmp / "dist"
    build = f"from setuptools import build_meta as b; print(b.build_sdist({str(dist)!r}))"
    sdist = dist / _run([sys.executable, "-c", build], cwd=src).strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("data/tuning/nvidia-h200.json") for n in names), "the sdist lacks the tuning tables"
    assert not any("/data/bench/" in n for n in names), "the sdist ships the bench results"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(dist), str(sdist)], cwd=tmp, timeout=180)
    wheel = next(dist.glob("labkit-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    python = venv / "bin" / "python"
    # Installed before the .pth below exists: pip then sees no other labkit that it could touch.
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          str(wheel)], cwd=tmp, timeout=180)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp).strip())
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (site / "zz_outer_site_packages.pth").write_text("".join(f"{p}\n" for p in ours if p))
    return python, wheel, src


def test_the_wheel_ships_what_the_product_reads(installed):
    _, wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("labkit/_data/tuning/nvidia-h200.json", f"labkit/_data/checkpoints/{CHECKPOINT}/model.safetensors",
                 f"labkit/_data/checkpoints/{CHECKPOINT}/config.json", "labkit/_data/kernels/tma_gemv.cu",
                 "labkit/_data/kernels/torch_binding.cpp"):
        assert name in names, f"the wheel lacks {name}"
    assert not any(n.startswith(("data/", "kernels/", "notebooks/")) or "/bench/nvidia" in n for n in names)


def test_installed_package_runs_outside_the_repository(installed, tmp_path):
    python, _, _ = installed
    out = json.loads(_run([str(python), "-c", CHECK], cwd=tmp_path).strip().splitlines()[-1])
    venv = python.parent.parent
    inside = lambda p: Path(p).resolve().is_relative_to(venv.resolve())  # noqa: E731
    assert inside(out["labkit"]), f"the venv imported labkit from {out['labkit']}, not its installed copy"
    assert inside(out["checkpoint"]) and inside(out["tuning_dir"]), out
    assert out["kernels"] and all(inside(p) and p.endswith(".cu") for p in out["kernels"]), out["kernels"]
    assert out["linear_entries"] > 0
    assert out["checkout"] is None
    assert out["bench_error"] and "data/bench" in out["bench_error"], out["bench_error"]
    assert out["child_pythonpath"] is None, "an installed labkit puts its site-packages on the ranks' PYTHONPATH"

    model = labkit.load(labkit.checkpoint_path(CHECKPOINT), dtype=torch.float32)
    ids = torch.tensor([labkit.ByteTokenizer().encode(PROMPT)])
    expected = labkit.generate(model, ids, NEW_TOKENS, backend="reference", progress=False).tokens[0].tolist()
    assert out["tokens"] == expected, "the installed package generates other tokens than the checkout"


def test_the_editable_install_still_builds(installed, tmp_path):
    """``make test`` installs with ``pip install -e``: its wheel maps labkit to the checkout, which
    then finds data/ and kernels/ in place (no labkit/_data copy)."""
    _, _, src = installed
    build = f"from setuptools import build_meta as b; print(b.build_editable({str(tmp_path)!r}))"
    wheel = tmp_path / _run([sys.executable, "-c", build], cwd=src).strip().splitlines()[-1]
    names = zipfile.ZipFile(wheel).namelist()
    assert not any("_data" in n for n in names), names
    assert not (src / "labkit" / "_data").exists(), "the editable build copied the data into the checkout"
