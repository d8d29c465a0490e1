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


# -- heuristic settings only, and the bench ladder command ---------------------------------------------
def test_heuristics_only_hides_the_tuning_file_without_a_warning(gpu_named):
    import warnings

    from labkit import tuning
    from labkit.ops import linear as linear_mod

    gpu_named("NVIDIA H200")
    assert tuning.device_table("cuda:0")  # the committed H200 file
    key = next(iter(tuning.device_table("cuda:0")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no UntunedGPUWarning inside the block
        with tuning.heuristics_only():
            assert tuning.device_table("cuda:0") is None and tuning.device_document("cuda:0") is None
            got = tuning.linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks, device="cuda:0")
            assert dict(tuning.settings("attention_decode", "cuda:0")) == dict(tuning.HEURISTICS["attention_decode"])
    assert got == linear_mod.linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks)
    assert tuning.device_table("cuda:0")  # back after the block


def test_every_rung_but_tuned_runs_with_the_heuristics(monkeypatch, tmp_path):
    import labkit
    from labkit import tuning
    from labkit.bench import ladder as bench_ladder
    from labkit.bench.decode import DecodeResult

    seen = {}

    def fake_time_decode(model, impl, batch, prompt, new_tokens, repeats, warmup, facts):
        seen[impl] = tuning._heuristics_only.get()
        return DecodeResult(model.cfg.name, impl, batch, prompt, new_tokens, tokens_per_s=1.0)

    monkeypatch.setattr(bench_ladder, "time_decode", fake_time_decode)
    monkeypatch.setattr(bench_ladder, "refusal", lambda *a: None)
    model = labkit.build("tiny-lfm2", seed=0)
    heuristic = bench_ladder.measure_rung(model, "fused+graph+pdl", 1, 4, 2, 1, None)
    assert seen == {"fused+graph+pdl": True} and heuristic.tuning == "heuristic" and heuristic.rung == "fused+graph+pdl"
    monkeypatch.setattr(bench_ladder, "tuning_file", lambda device: tuning.TUNING_DIR / "nvidia-h200.json")
    tuned = bench_ladder.measure_rung(model, "tuned", 1, 4, 2, 1, None)
    assert seen == {"fused+graph+pdl": False}  # the file's settings
    assert tuned.impl == "fused+graph+pdl" and tuned.tuning == "data/tuning/nvidia-h200.json"


def test_pdl_on_an_older_gpu_is_absent_with_the_decoders_reason():
    import labkit
    from labkit.bench import ladder as bench_ladder
    from labkit.ops.features import stand_in

    model = labkit.build("tiny-lfm2", seed=0)
    with stand_in("NVIDIA A100-SXM4-80GB", (8, 0)):
        row = bench_ladder.measure_rung(model, "fused+graph+pdl", 1, 4, 2, 1, None)
    assert row.tokens_per_s is None and row.error is None
    assert row.absent.startswith("MissingFeature") and "programmatic dependent launch" in row.absent


def test_bench_ladder_on_the_cpu_writes_rows_the_reader_reads(tmp_path, capsys):
    from labkit.__main__ import main

    data = tmp_path / "data" / "bench"
    argv = ["bench", "ladder", "--models", "tiny-lfm2", "--batch", "2", "--rungs", "transformers", "reference",
            "fused+graph", "tuned", "--prompt", "4", "--new-tokens", "2", "--repeats", "1", "--data-dir", str(data)]
    assert main(argv) == 0
    doc = json.loads((data / "cpu" / "ladder.json").read_text())
    assert doc["kind"] == "decode" and doc["command"].startswith("python -m labkit bench ladder --models tiny-lfm2")
    assert [r["rung"] for r in doc["results"]] == ["transformers", "reference", "fused+graph", "tuned"]
    ref = figure("tiny-lfm2", "reference", 2, gpu="cpu", data_dir=data)
    assert ref["tokens_per_s"] > 0 and ref["tuning"] == "heuristic" and ref["new_tokens"] == 2
    with pytest.raises(LadderMissing, match="CUDA graph"):
        figure("tiny-lfm2", "fused+graph", 2, gpu="cpu", data_dir=data)
    with pytest.raises(LadderMissing, match="no tuning file"):
        figure("tiny-lfm2", "tuned", 2, gpu="cpu", data_dir=data)
