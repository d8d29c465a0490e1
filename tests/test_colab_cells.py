"""Every notebook opens in Colab: an "Open in Colab" badge and an install cell first, written from the
one repository constant (labkit.lab.notebooks.REPOSITORY, which pyproject.toml's [project.urls] must
agree with). The install cell does nothing off Colab (it runs in every CPU, papermill and nbval run),
and on Colab clones the repository and installs it without touching Colab's torch."""

import json
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

from labkit.lab import notebooks as nbs

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = nbs.notebook_paths()


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _install_source(name: str = "00_model_and_roofline.ipynb") -> str:
    return "".join(nbs.colab_cells(name)[1]["source"])


def test_one_repository_url():
    urls = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]
    assert urls["Repository"] == nbs.REPOSITORY
    assert nbs.REPOSITORY.startswith("https://github.com/") and nbs.REPOSITORY.count("/") == 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_starts_with_the_colab_cells(path):
    cells = _cells(path)
    assert nbs.has_colab_cells({"cells": cells}, path.name), (
        f"{path.name}: run `python -m labkit colab-cells` (its Colab cells are missing or stale)")
    badge, install = cells[:2]
    link = f"https://colab.research.google.com/github/labkit-workbook/labkit/blob/main/notebooks/{path.name}"
    assert nbs.colab_url(path.name) == link and f"]({link})" in "".join(badge["source"])
    assert nbs.REPOSITORY in "".join(install["source"])
    assert install["outputs"] == [] and install["execution_count"] is None
    # papermill injects its parameters after the one cell tagged parameters, which stays after these
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1 and tagged[0] >= 2


def test_adding_the_cells_is_idempotent_and_keeps_everything_else(tmp_path):
    src = NOTEBOOKS[0]
    path = tmp_path / src.name
    text = src.read_text(encoding="utf-8")
    ending = text[len(text.rstrip("\n")):]  # the file's own (none, here)
    original = json.loads(text)
    original["cells"] = original["cells"][2:]  # as the notebook was before
    path.write_text(nbs._nbformat_json(original) + ending, encoding="utf-8")
    assert nbs.add_colab_cells(path) is True
    once = path.read_text(encoding="utf-8")
    assert nbs.add_colab_cells(path) is False and path.read_text(encoding="utf-8") == once
    assert once == text  # what the committed notebook holds
    stale = json.loads(once)
    stale["cells"][1]["source"] = ["print('an old install cell')"]
    path.write_text(nbs._nbformat_json(stale) + ending, encoding="utf-8")
    assert nbs.add_colab_cells(path) is True and path.read_text(encoding="utf-8") == once
    path.write_text(json.dumps(original), encoding="utf-8")  # not nbformat's layout: refused, not rewritten
    with pytest.raises(ValueError, match="not laid out as nbformat writes it"):
        nbs.add_colab_cells(path)


def _forbid(*args, **kwargs):
    raise AssertionError(f"the install cell ran a command off Colab: {args}")


def test_the_install_cell_does_nothing_off_colab(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(subprocess, "check_call", _forbid)
    monkeypatch.setattr(subprocess, "run", _forbid)
    path_before, namespace = list(sys.path), {}
    exec(_install_source(), namespace)
    assert sys.path == path_before and "_clone" not in namespace


def test_on_colab_the_install_cell_clones_and_keeps_colab_s_torch(monkeypatch):
    import importlib.metadata
    import os

    calls, moved = [], []
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "check_call", lambda cmd: calls.append(cmd))
    monkeypatch.setattr(os.path, "isdir", lambda p: False)
    monkeypatch.setattr(os, "chdir", moved.append)
    monkeypatch.setattr(sys, "path", list(sys.path))
    exec(_install_source(), {})
    clone = nbs.COLAB_CLONE
    assert calls == [
        ["git", "clone", "--depth", "1", "-q", nbs.REPOSITORY, clone],
        [sys.executable, "-m", "pip", "install", "-q", "-e", f"{clone}[{nbs.COLAB_EXTRAS}]",
         f"torch=={importlib.metadata.version('torch')}"],
    ]
    assert sys.path[0] == clone and moved == [os.path.join(clone, "notebooks")]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert set(nbs.COLAB_EXTRAS.split(",")) <= set(extras)


def test_the_command_line_checks_and_writes(tmp_path, capsys):
    from labkit.__main__ import main

    assert main(["colab-cells", "--check"]) == 0
    bare = tmp_path / NOTEBOOKS[0].name
    nb = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    nb["cells"] = nb["cells"][2:]
    bare.write_text(nbs._nbformat_json(nb) + "\n", encoding="utf-8")
    assert main(["colab-cells", "--check", str(bare)]) == 1
    assert main(["colab-cells", str(bare)]) == 0 and main(["colab-cells", "--check", str(bare)]) == 0
    assert "missing or stale" in capsys.readouterr().out
