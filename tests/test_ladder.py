"""labkit.lab.ladder (the headline figures' one reader) over a temporary results folder, and the
``bench ladder`` command on the CPU at tiny sizes."""

import json

import pytest

from labkit.bench.results import ResultsFileError
from labkit.lab import ladder
from labkit.lab.ladder import RUNGS, LadderMissing, figure, fixed_cost_per_kernel, rows

GPU = "test-gpu"


def _row(model, rung, batch, tokens_per_s=100.0, **extra):
    impl = ladder.TUNED_IMPL if rung == "tuned" else rung
    measured = tokens_per_s is not None
    return {"model": model, "rung": rung, "impl": impl, "tuning": "heuristic", "batch": batch, "prompt": 128,
            "new_tokens": 64, "tokens_per_s": tokens_per_s, "step_ms": batch / tokens_per_s * 1e3 if measured else None,
            "pct_of_roofline": 1.0, "roofline_tokens_per_s": 100 * tokens_per_s if measured else None,
            "achieved_bytes_per_s": 1e9, "error": None, **extra}


def _write(tmp_path, name, doc):
    folder = tmp_path / "data" / "bench" / GPU
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(doc))
    return tmp_path / "data" / "bench"


def _ladder(tmp_path, results, kind="decode"):
    return _write(tmp_path, "ladder", {"gpu": "Test GPU", "date": "2026-12-03T00:00:00+00:00",
                                       "command": "python -m labkit bench ladder", "kind": kind, "results": results})


def test_rungs_climb_from_the_peer_to_tuned():
    assert RUNGS[0] == "transformers" and RUNGS[-1] == "tuned"
    assert RUNGS.index("fused+graph") < RUNGS.index("fused+graph+pdl") < RUNGS.index("persistent")


def test_figure_reads_one_row_with_its_file_and_command(tmp_path):
    data = _ladder(tmp_path, [_row("m", "fused", 1, 250.0), _row("m", "fused", 16, 900.0)])
    got = figure("m", "fused", 16, gpu=GPU, data_dir=data)
    assert got["tokens_per_s"] == 900.0 and got["batch"] == 16
    assert got["file"] == f"data/bench/{GPU}/ladder.json"
    assert got["command"] == "python -m labkit bench ladder" and got["date"].startswith("2026-12-03")
    assert set(ladder.FIGURE_KEYS) <= set(got)


def test_rows_come_in_ladder_order_then_model_then_batch(tmp_path):
    shuffled = [_row("b", "tuned", 1), _row("a", "reference", 16), _row("b", "reference", 1),
                _row("a", "reference", 1), _row("a", "transformers", 1)]
    got = [(r["rung"], r["model"], r["batch"]) for r in rows(GPU, data_dir=_ladder(tmp_path, shuffled))]
    assert got == [("transformers", "a", 1), ("reference", "a", 1), ("reference", "a", 16),
                   ("reference", "b", 1), ("tuned", "b", 1)]


def test_a_missing_file_names_the_command(tmp_path):
    with pytest.raises(LadderMissing, match=r"python -m labkit bench ladder") as info:
        figure("m", "fused", 1, gpu=GPU, data_dir=tmp_path / "data" / "bench")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, KeyError)


def test_a_missing_row_names_the_command(tmp_path):
    data = _ladder(tmp_path, [_row("m", "fused", 1)])
    with pytest.raises(LadderMissing, match=r"no row for m at rung 'fused', batch 16.*bench ladder"):
        figure("m", "fused", 16, gpu=GPU, data_dir=data)


def test_an_absent_rung_is_missing_with_its_reason_never_a_figure(tmp_path):
    why = "MissingFeature: backend fused+graph+pdl needs programmatic dependent launch"
    data = _ladder(tmp_path, [_row("m", "fused+graph+pdl", 1, None, absent=why),
                              _row("m", "fused", 1, error="RuntimeError: boom")])
    with pytest.raises(LadderMissing, match="needs programmatic dependent launch"):
        figure("m", "fused+graph+pdl", 1, gpu=GPU, data_dir=data)
    with pytest.raises(LadderMissing, match="boom"):
        figure("m", "fused", 1, gpu=GPU, data_dir=data)
    assert len(rows(GPU, data_dir=data)) == 2  # rows() keeps them, with their reasons


def test_an_unknown_rung_is_refused(tmp_path):
    data = _ladder(tmp_path, [_row("m", "fused", 1)])
    with pytest.raises(ValueError, match="unknown rung 'fast'"):
        figure("m", "fast", 1, gpu=GPU, data_dir=data)
    bad = _ladder(tmp_path, [_row("m", "fused", 1), {**_row("m", "fused", 1), "rung": "warp-speed"}])
    with pytest.raises(ResultsFileError, match="warp-speed"):
        rows(GPU, data_dir=bad)
    with pytest.raises(ResultsFileError, match="'decode' results file"):
        rows(GPU, data_dir=_ladder(tmp_path, [], kind="prefill"))


def _chain_doc(t0_us, bytes_per_s, sizes, pdl_t0=None):
    def group(nbytes, kernels, t0):
        return {"bytes_per_kernel": nbytes, "kernels": kernels, "us_per_kernel": t0 + nbytes / bytes_per_s * 1e6}

    def row(model, gemv, pdl, t0):
        return {"model": model, "batch": 1, "gemv": gemv, "pdl": pdl, "error": None,
                "groups": [group(n, k, t0) for n, k in sizes],
                "fit": {"t0_us": t0, "tb_per_s": bytes_per_s / 1e12, "r2": 1.0}}

    results = [row("a", "plain", False, t0_us), row("b", "plain", False, t0_us),
               row("a", "plain", True, pdl_t0 or t0_us / 2), row("a", "linear", False, 3 * t0_us)]
    return {"gpu": "Test GPU", "date": "2026-12-01T00:00:00+00:00", "command": "python -m labkit bench chain",
            "kind": "chain", "results": results}


def test_fixed_cost_is_the_plain_chains_intercept(tmp_path):
    data = _write(tmp_path, "chain", _chain_doc(1.5, 4e12, [(1 << 20, 16), (8 << 20, 10), (128 << 20, 1)]))
    got = fixed_cost_per_kernel(GPU, data_dir=data)
    assert got["us"] == pytest.approx(1.5) and got["bandwidth_bytes_per_s"] == pytest.approx(4e12)
    assert got["file"] == f"data/bench/{GPU}/chain.json" and "plain-Triton" in got["what"]
    assert set(got["per_model"]) == {"a", "b"}  # the PDL and "linear" chains are not this fit


def test_fixed_cost_names_the_chain_command_when_absent(tmp_path):
    with pytest.raises(LadderMissing, match="bench chain"):
        fixed_cost_per_kernel(GPU, data_dir=tmp_path)
    doc = _chain_doc(1.5, 4e12, [(1 << 20, 1), (2 << 20, 1)])
    doc["results"] = [r for r in doc["results"] if r["gemv"] != "plain" or r["pdl"]]
    with pytest.raises(LadderMissing, match="--gemvs plain"):
        fixed_cost_per_kernel(GPU, data_dir=_write(tmp_path, "chain", doc))


def test_the_committed_h200_fixed_cost_is_a_few_microseconds():
    got = fixed_cost_per_kernel()
    assert 0.5 < got["us"] < 5 and 2e12 < got["bandwidth_bytes_per_s"] < 6e12
    assert got["file"] == "data/bench/nvidia-h200/chain.json"
