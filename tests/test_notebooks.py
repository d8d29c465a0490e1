"""Every notebook runs end to end with papermill on a CPU: tiny presets, Triton's interpreter.

The notebooks assert their own checks, so a failing check fails here. (CI also runs nbval over the
committed notebooks, comparing the outputs of cells marked NBVAL_CHECK_OUTPUT.)
"""

import pytest

from labkit.notebooks import notebook_paths, run_notebooks

pytest.importorskip("papermill")

NOTEBOOKS = notebook_paths()


def test_there_are_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"{i:02d}" for i in range(len(NOTEBOOKS))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_cpu(path, tmp_path):
    (row,) = run_notebooks(tmp_path, parameters={"DEVICE": "cpu"}, only=[path.name])
    assert row["error"] is None, row["error"]
    assert (tmp_path / path.name).exists()
