"""Every notebook runs end to end with papermill on a CPU, as `make run` does there: the shipped
byte-level checkpoints (tiny random presets where they are absent), Triton's interpreter.

The notebooks assert their own checks, so a failing check fails here. The same run also shows that
a batch run writes nothing under data/ unless asked to (SAVE_RESULTS), and leaves no warnings,
progress bars or profiler lines in the outputs or on the terminal. (`make test` then runs nbval over the
notebooks that hold cells marked NBVAL_CHECK_OUTPUT, comparing those cells' outputs with the committed ones.)
"""

import json
from pathlib import Path

import pytest

from labkit.lab.notebooks import INJECTED, notebook_paths, run_notebooks

pytest.importorskip("papermill")

NOTEBOOKS = notebook_paths()
REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _tagged(cells: list[dict], tag: str) -> list[dict]:
    return [c for c in cells if tag in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    # numbered from 00, each number once; a gap is a chapter still to come (the README lists them)
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert numbers[0] == "00" and numbers == sorted(set(numbers))


def test_readme_claims_only_what_is_there():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"](notebooks/{path.name}) | written |" in readme, f"README's notebook table lacks {path.name}"
    if not list(REPO.glob("kernels/*.cu")):
        assert "kernels/" not in readme, "README promises kernels/ (CUDA C++ sources), and there are none yet"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_runs_with_its_own_defaults(path):
    """One `parameters` cell, and no papermill injected-parameters cell: opened in JupyterLab (or run
    by nbval), a committed notebook must run with its defaults: widgets on, nothing saved."""
    cells = _cells(path)
    assert not _tagged(cells, INJECTED), (
        f"{path.name} holds papermill's {INJECTED} cell; remove it with "
        f"`python -m labkit strip-notebooks {path.relative_to(path.parent.parent)}`")
    (params,) = _tagged(cells, "parameters")
    defaults: dict = {}
    exec("".join(params["source"]), {}, defaults)
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code" and c is not params)
    if "SAVE_RESULTS" in code:
        assert defaults.get("SAVE_RESULTS") is False, "results are written only when the caller asks"
    if "INTERACTIVE" in code:
        assert defaults.get("INTERACTIVE") is True, "a notebook opened in JupyterLab shows its widgets"


def _data_listing() -> dict[str, int]:
    return {str(p.relative_to(DATA)): p.stat().st_mtime_ns for p in sorted(DATA.rglob("*"))}


def _stderr_outputs(path: Path) -> list[str]:
    return [f"cell {i}: {''.join(o['text'])[:300]!r}"
            for i, c in enumerate(_cells(path)) for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stderr"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_cpu(path, tmp_path, capfd):
    data_before = _data_listing()
    (row,) = run_notebooks(tmp_path, parameters={"DEVICE": "cpu"}, only=[path.name])
    assert row["error"] is None, row["error"]
    out = tmp_path / path.name
    assert _data_listing() == data_before, "a run without SAVE_RESULTS=True changed data/"
    assert not _tagged(_cells(out), INJECTED), "run_notebooks' outputs are ready to commit"
    # warnings, tqdm bars, profiler lines: in the outputs, and on the kernel's own stderr (the terminal)
    assert not _stderr_outputs(out), "\n".join(_stderr_outputs(out))
    terminal = capfd.readouterr().err
    assert not terminal.strip(), terminal[-2000:]


def test_auto_models_and_loading_by_name(monkeypatch, tmp_path):
    import torch

    import labkit
    from labkit.lab.notebooks import default_models, load_model

    assert default_models(on_gpu=True) == ["lfm2-350m", "qwen3.5-0.8b"]
    monkeypatch.setenv("LABKIT_CHECKPOINTS", str(tmp_path))  # no shipped checkpoints here
    assert default_models(on_gpu=False) == ["tiny-lfm2", "tiny-qwen3.5"]
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=3)
    labkit.save(model, tmp_path / "byte-lfm2-6m")  # stands in for the shipped checkpoint
    assert default_models(on_gpu=False) == ["byte-lfm2-6m"]
    loaded = load_model("byte-lfm2-6m", torch.float32, "cpu")
    assert torch.equal(loaded.lm_head_weight, model.lm_head_weight)
    random = load_model("tiny-lfm2", torch.float32, "cpu", seed=3)
    assert torch.equal(random.lm_head_weight, model.lm_head_weight)  # a preset: seeded random weights


def test_a_parameter_no_notebook_has_is_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match=r"\['SAVE_RESULT'\]"):
        run_notebooks(tmp_path, parameters={"DEVICE": "cpu", "SAVE_RESULT": True})  # a typo
    assert not list(tmp_path.iterdir())


def test_value_range_prints_one_value_where_the_extremes_print_the_same():
    from labkit.lab.notebooks import value_range

    assert value_range([8.21, 8.24], unit="%") == "8.2%"
    assert value_range([8.21, 8.26], unit="%") == "8.2% to 8.3%"
    assert value_range([-0.19, -0.21, -0.2], "{:+.0%}") == "-21% to -19%"
    assert value_range([1.5], "×{:.2f}") == "×1.50"
    with pytest.raises(ValueError):
        value_range([])
