"""The command line refuses bad input up front, and a run that fails says so in its exit status and
prints the real error (issue 24: "CLIs ..."). In-process through ``labkit.__main__.main``."""

import json

import nbformat
import pytest

from labkit.__main__ import main


def _notebook(path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("SAVE_RESULTS = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(source)]
    nbformat.write(nb, str(path))


def test_notebooks_only_matching_nothing_exits_nonzero_naming_the_notebooks(tmp_path, capsys):
    assert main(["notebooks", "--only", "99", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "99" in err and "00_model_and_roofline.ipynb" in err and "04_tma_and_async.ipynb" in err


def test_a_failing_notebook_prints_its_exception_not_papermills_separator(tmp_path, monkeypatch, capsys):
    from papermill.exceptions import PapermillExecutionError

    from labkit.lab import notebooks

    _notebook(tmp_path / "07_broken.ipynb", "raise ValueError('the cache is 3 tokens short')")

    def fails(*args, **kwargs):  # what papermill raises for a cell that raised
        raise PapermillExecutionError(1, 2, "raise ValueError(...)", "ValueError", "the cache is 3 tokens short",
                                      ["\x1b[0;31mValueError\x1b[0m: the cache is 3 tokens short"])

    monkeypatch.setattr("papermill.execute_notebook", fails)
    rows = notebooks.run_notebooks(tmp_path / "out", directory=tmp_path)
    notebooks.print_summary(rows)
    out = capsys.readouterr().out
    assert "ValueError: the cache is 3 tokens short" in out and "-----" not in out
    assert "cell 1" in rows[0]["error"]


def _decode(tmp_path, *extra: str) -> list[str]:
    return ["bench", "decode", "--models", "tiny-lfm2", "--batch", "1", "--repeats", "1", "--prompt", "3",
            "--new-tokens", "2", "--wall-calls", "--impls", "reference", "--data-dir", str(tmp_path), "--name", "d",
            *extra]


@pytest.mark.parametrize("argv, named", [
    (["--impls", "refrence"], ["--impls", "refrence", "reference"]),
    (["--batch", "0"], ["--batch", "0"]),
    (["--repeats", "0"], ["--repeats", "0"]),
    (["--new-tokens", "-1"], ["--new-tokens", "-1"]),
    (["--name", "../../x"], ["--name", "../../x"]),
    (["--name", "a/b"], ["--name", "a/b"]),
])
def test_bench_decode_refuses_bad_arguments_before_running(tmp_path, capsys, argv, named):
    with pytest.raises(SystemExit) as exit_:
        main(_decode(tmp_path, *argv))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert all(n in err for n in named), err
    assert not list(tmp_path.rglob("*.json")) and not (tmp_path.parent / "x.json").exists()


def test_results_are_not_written_outside_the_results_folder(tmp_path):
    from labkit.bench.results import write_results
    from labkit.lab.hw import device_facts

    with pytest.raises(ValueError, match=r"\.\./x"):
        write_results("../x", "decode", [], device_facts("cpu", measure=False), data_dir=tmp_path / "data")
    assert not list(tmp_path.rglob("*.json"))


def test_a_run_where_a_row_failed_exits_nonzero(tmp_path, monkeypatch):
    from labkit.bench import cli

    def failing(model, impl, batch, *args, **kwargs):
        return cli.DecodeResult(model.cfg.name, impl, batch, 3, 2, error="RuntimeError: planted")

    monkeypatch.setattr(cli, "time_decode", failing)
    assert main(_decode(tmp_path)) == 1
    (path,) = tmp_path.glob("*/d.json")  # the failed row is still written
    assert json.loads(path.read_text())["results"][0]["error"] == "RuntimeError: planted"


@pytest.mark.parametrize("doc, named", [
    ({"kind": "decode", "results": [{"model": "m", "impl": "reference", "batch": 1}]}, "tokens_per_s"),
    ({"kind": "prefill", "results": [{"model": "m", "impl": "reference", "batch": 1}]}, "tokens"),
    ({"kind": "decode"}, "results"),
])
def test_bench_table_names_the_malformed_file_and_its_missing_field(tmp_path, capsys, doc, named):
    gpu = tmp_path / "nvidia-h200"
    gpu.mkdir()
    (gpu / "good.json").write_text(json.dumps({"kind": "decode", "gpu": "g", "results": []}))
    (gpu / "broken.json").write_text(json.dumps(doc))
    assert main(["bench", "table", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "broken.json" in err and repr(named) in err


def test_bench_table_names_a_file_that_is_not_json(tmp_path, capsys):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cut.json").write_text('{"kind": "decode", "resu')
    assert main(["bench", "table", "--data-dir", str(tmp_path)]) == 2
    assert "cut.json" in capsys.readouterr().err
