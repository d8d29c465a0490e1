"""python -m labkit strip-notebooks: papermill's injected cell goes, kernelspec and language_info
become what JupyterLab writes with this environment's kernel, the file ends as JupyterLab's server
saves it, and nothing else changes; a second run changes nothing."""

import json

from labkit.__main__ import main
from labkit.lab.notebooks import INJECTED, _nbformat_json, colab_cells, lab_metadata, strip_notebook


def _notebook(metadata: dict) -> dict:
    cell = {"cell_type": "code", "execution_count": 3, "id": "a1", "metadata": {"tags": ["parameters"]},
            "outputs": [{"name": "stdout", "output_type": "stream", "text": ["kept\n"]}], "source": ["X = 1"]}
    injected = {**cell, "id": "b2", "metadata": {"tags": [INJECTED]}, "outputs": [], "source": ["X = 2"]}
    return {"cells": [cell, injected], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def test_strip_normalises_metadata_and_drops_the_injected_cell(tmp_path):
    old = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
           "language_info": {"name": "python", "version": "0.0.1"}, "papermill": {"duration": 1.5}}
    path = tmp_path / "00_x.ipynb"
    path.write_text(_nbformat_json(_notebook(old)), encoding="utf-8")  # no final newline, as some were committed
    done = strip_notebook(path)
    assert done[0] == "removed the injected-parameters cell" and "normalised kernelspec and language_info" in done
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert {k: nb["metadata"][k] for k in ("kernelspec", "language_info")} == lab_metadata()
    assert nb["metadata"]["papermill"] == {"duration": 1.5}  # the run's own record stays
    assert [c["id"] for c in nb["cells"]] == ["a1"] and nb["cells"][0]["outputs"][0]["text"] == ["kept\n"]
    assert strip_notebook(path) == [] and path.read_text(encoding="utf-8") == text


def test_strip_leaves_the_colab_cells_as_colab_cells_makes_them(tmp_path):
    path = tmp_path / "03_x.ipynb"
    nb = _notebook(lab_metadata())
    ran = colab_cells(path.name)
    for cell in ran:  # what a papermill run leaves on them
        cell["metadata"]["papermill"] = {"duration": 0.01, "status": "completed"}
    ran[1].update(execution_count=1, outputs=[{"name": "stdout", "output_type": "stream", "text": ["x\n"]}])
    nb["cells"] = ran + nb["cells"][:1]
    path.write_text(_nbformat_json(nb) + "\n", encoding="utf-8")
    assert strip_notebook(path) == ["left the Colab cells un-run", "wrote it as JupyterLab saves it"]
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    assert cells[:2] == colab_cells(path.name)
    assert cells[2]["execution_count"] == 3 and cells[2]["outputs"]  # other cells keep what the run gave
    assert strip_notebook(path) == []


def test_lab_metadata_is_the_kernel_make_lab_installs():
    meta = lab_metadata()
    assert meta["kernelspec"] == {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    assert meta["language_info"]["name"] == "python" and meta["language_info"]["version"].count(".") == 2


def test_the_command_reports_what_it_did(tmp_path, capsys):
    path = tmp_path / "00_x.ipynb"
    path.write_text(_nbformat_json(_notebook(lab_metadata())) + "\n", encoding="utf-8")
    assert main(["strip-notebooks", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: removed the injected-parameters cell\n"
    assert main(["strip-notebooks", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: none\n"
