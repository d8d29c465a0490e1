"""The full tuner (python -m labkit tune): which kernels it covers, and how a sweep picks its winner
(labkit.bench.tune_kernels). The timings themselves need a GPU: the run is in data/bench/<gpu>/tune-run.json."""

import math

import pytest

from labkit import tuning
from labkit.bench import tune, tune_kernels
from labkit.bench.tune_kernels import Trial, best_trial, geomean_ratio


def test_every_kernel_with_settings_is_tuned_or_says_why_not():
    covered = set(tune.SECTIONS) | set(tune.UNTUNED)
    assert set(tuning.KERNELS) <= covered, f"not covered by labkit tune: {set(tuning.KERNELS) - covered}"
    assert set(tune_kernels.TUNERS) <= set(tune.SECTIONS)
    assert not set(tune.UNTUNED) & (set(tune.SECTIONS) - {"linear"})  # ("linear": blockings tuned, placement not)
    assert all(why for why in tune.UNTUNED.values())
    assert set(tune.SHARES) == set(tune.SECTIONS) and math.isclose(sum(tune.SHARES.values()), 1.0)


def test_sweeps_only_name_real_settings():
    for kernel, rules in (("gated_delta_decode", tune_kernels.GDN_RULES), ("attention_decode", tune_kernels.ATTENTION_RULES)):
        assert rules and all(set(r) <= set(tuning.HEURISTICS[kernel]) for r in rules)
    assert set(tune_kernels.CHUNK_CHOICES) <= set(tuning.HEURISTICS["chunk_delta_rule"])


def test_geomean_ratio():
    assert geomean_ratio({"a": 2.0, "b": 8.0}, {"a": 1.0, "b": 2.0}) == pytest.approx(math.sqrt(8))
    assert geomean_ratio({"a": 5.0}, {"a": 5.0}) == pytest.approx(1.0)


def test_best_trial_takes_the_fastest_that_passed_and_measured_every_case():
    base = Trial({"x": 1}, 1e-3, {"a": 10.0, "b": 10.0})
    wrong = Trial({"x": 2}, 0.5, {"a": 1.0, "b": 1.0}, error="relative error 0.5 > 0.01")
    partial = Trial({"x": 3}, 1e-3, {"a": 2.0})  # a deadline cut it: not comparable
    faster = Trial({"x": 4}, 1e-3, {"a": 9.0, "b": 8.0})
    slower = Trial({"x": 5}, 1e-3, {"a": 11.0, "b": 12.0})
    assert best_trial([base, wrong, partial, faster, slower]) is faster
    assert best_trial([base, slower]) is base  # never slower than what runs today
    with pytest.raises(RuntimeError, match="fail their own check"):
        best_trial([Trial({"x": 1}, float("nan"), error="relative error nan > 0.01"), faster])


def test_a_trial_with_nan_or_a_crash_is_an_error_not_a_winner():
    nan = tune_kernels._run_trial({"x": 1}, lambda: float("nan"), [("a", lambda: 1.0)])
    assert nan.error and not nan.us
    boom = tune_kernels._run_trial({"x": 1}, lambda: 0.0, [("a", lambda: 1 / 0)])
    assert boom.error.startswith("ZeroDivisionError")
    ok = tune_kernels._run_trial({"x": 1}, lambda: 1e-4, [("a", lambda: 3.0)])
    assert ok.error is None and ok.us == {"a": 3.0} and ok.row()["us"] == {"a": 3.0}


def test_tune_without_a_gpu_says_so(capsys):
    assert tune.main([]) == 2
    assert "CUDA GPU" in capsys.readouterr().out


class _FakeTiming:
    def __init__(self, us):
        self.us = us


@pytest.mark.parametrize("kernel", sorted(tune_kernels.TUNERS))
def test_each_sweep_checks_against_its_reference_and_writes_an_entry(kernel, monkeypatch):
    # the real checks on tiny shapes in the interpreter; the timer is faked (a CPU has no CUDA graphs):
    # each candidate's "time" is a function of its settings, so the winner is known in advance
    from labkit.bench import ops as bench_ops
    from labkit.lab import timing

    monkeypatch.setattr(tune_kernels, "GDN_PRESET", "tiny-qwen3.5")
    monkeypatch.setattr(tune_kernels, "GDN_BATCHES", (1, 3))
    monkeypatch.setattr(tune_kernels, "ATTENTION_PRESETS", ("tiny-lfm2",))
    monkeypatch.setattr(tune_kernels, "ATTENTION_CASES", ((1, 40), (3, 40)))
    monkeypatch.setattr(tune_kernels, "CHUNK_SHAPE", (2, 16))
    monkeypatch.setattr(tune_kernels, "CHUNK_LENGTHS", (70,))
    monkeypatch.setattr(tune_kernels, "CHECK_LENGTHS", (45, 13))
    monkeypatch.setattr(tune_kernels, "CHUNK_CHOICES", {"num_warps": (4, 8)})
    monkeypatch.setattr(bench_ops, "time_gdn", lambda model, b, block_v=None: _FakeTiming(10.0 * b))
    monkeypatch.setattr(bench_ops, "time_attention", lambda model, b, slots, chunk=None: _FakeTiming(1000.0 / chunk))
    calls = []

    def fake_measure(fn, **kw):
        calls.append(fn)
        return _FakeTiming(7.0 if len(calls) == 1 else 5.0)  # the second candidate (8 warps) is faster

    monkeypatch.setattr(timing, "measure", fake_measure)
    lines = []
    entry = tune_kernels.tune_kernel(kernel, device="cpu", log=lines.append)
    swept = {"gated_delta_decode": {"block_v", "narrow_block_v", "programs_per_sm"},
             "attention_decode": {"min_chunk", "max_chunks"}, "chunk_delta_rule": {"num_warps"}}
    assert set(entry["values"]) == swept[kernel]  # a CPU has no tuning file: nothing else is named
    assert all(c["rel_err"] is not None and c["rel_err"] <= tune_kernels.BOUND for c in entry["candidates"]
               if "error" not in c)
    assert entry["candidates"][0]["values"].items() <= dict(tuning.settings(kernel, "cpu")).items()
    if kernel == "chunk_delta_rule":
        assert entry["values"]["num_warps"] == 8
    from labkit.tuning.files import check_document

    check_document({"format": tuning.FORMAT, "gpu": "X", "settings": {kernel: entry}}, "test")


def test_an_entry_names_what_it_swept_and_what_the_file_named_never_a_heuristic(monkeypatch):
    """The H200's chunk_delta_rule entry of 2026-12-03 named single_block_v = 128, the heuristic of
    the day, which that run never swept: written as if measured, it outlived the heuristic's change
    to 32 (faster on the H100 for a hit's tail). An entry keeps the file's values and adds the
    swept ones; a setting neither names stays with its heuristic."""
    from labkit.lab import timing

    monkeypatch.setattr(tune_kernels, "CHUNK_SHAPE", (2, 16))
    monkeypatch.setattr(tune_kernels, "CHUNK_LENGTHS", (70,))
    monkeypatch.setattr(tune_kernels, "CHECK_LENGTHS", (45, 13))
    monkeypatch.setattr(tune_kernels, "CHUNK_CHOICES", {"num_warps": (4, 8)})
    monkeypatch.setattr(timing, "measure", lambda fn, **kw: _FakeTiming(5.0))
    doc = {"settings": {"chunk_delta_rule": {"values": {"wide_stages": 3, "num_warps": 8}, "source": "x"}}}
    monkeypatch.setattr(tuning, "device_document", lambda device=None, directory=None: doc)
    entry = tune_kernels.tune_kernel("chunk_delta_rule", device="cpu", log=lambda line: None)
    assert entry["values"] == {"wide_stages": 3, "num_warps": 8}  # 8 warps: the file's, first and not beaten
    assert entry["candidates"][0]["values"] == {"num_warps": 8}


def test_chunk_trials_time_only_the_cases_their_setting_changes(monkeypatch):
    """The 64-token tail runs the single-chunk kernel alone: a trial of a walk or output setting times
    the long prompts only, one of single_block_v the tail only; the other case's time is carried
    over from the settings varied, so that its noise cannot decide a setting that does not touch it."""
    from labkit.lab import timing

    monkeypatch.setattr(tune_kernels, "CHUNK_SHAPE", (2, 16))
    monkeypatch.setattr(tune_kernels, "CHUNK_LENGTHS", (70, 64))
    monkeypatch.setattr(tune_kernels, "CHECK_LENGTHS", (45, 13))
    monkeypatch.setattr(tune_kernels, "CHUNK_CHOICES", {"num_warps": (4, 8), "single_block_v": (16,)})
    times = iter([7.0, 100.0, 6.0, 90.0])  # base: T=70, T=64; 8 warps: T=70; the other single_block_v: T=64
    calls = []

    def fake_measure(fn, **kw):
        calls.append(fn)
        return _FakeTiming(next(times))

    monkeypatch.setattr(timing, "measure", fake_measure)
    trials = tune_kernels._chunk_trials("cpu", None, lambda line: None)
    assert len(calls) == 4 and len(trials) == 3
    base, warps, single = trials
    assert base.us == {"T=70": 7.0, "T=64": 100.0}
    assert warps.us == {"T=70": 6.0, "T=64": 100.0}  # the tail carried over
    assert single.us == {"T=70": 6.0, "T=64": 90.0}  # from the best so far (8 warps)
    assert single.values["num_warps"] == 8


def test_a_file_made_by_a_settings_run_names_its_command(tmp_path):
    """``labkit tune --sections chunk_delta_rule`` on a GPU without a file made one with only
    ``format``, ``gpu`` and ``settings`` (2026-12-06): no command, device, versions or date at its top.
    The settings writer puts the run's provenance there, and keeps the entries it does not name."""
    from labkit.lab.hw import device_facts

    facts = device_facts("cpu", measure=False)
    path = tmp_path / "x.json"
    entry = {"values": {"release_early": False}, "source": "python -m labkit tune --sections attention_decode"}
    tune.write_settings(path, facts, "python -m labkit tune --sections attention_decode", attention_decode=entry)
    tune.write_settings(path, facts, "python -m labkit tune --sections norm_rope",
                        norm_rope={"values": {"num_warps": 8}})
    doc = tuning.read_tuning_file(path)
    assert doc["command"] == "python -m labkit tune --sections norm_rope" and doc["gpu"] == facts.name
    assert {"device", "versions", "date"} <= set(doc) and doc["settings"]["attention_decode"] == entry


def test_a_run_of_some_sections_keeps_the_full_runs_record(tmp_path, monkeypatch):
    """Notebook 06 reads the full run's record (its linear section): a run of one section, on the
    same GPU later, writes its own record beside it instead of over it."""
    import json

    from labkit.lab import hw

    facts = hw.device_facts("cpu", measure=False)
    monkeypatch.setattr(hw, "device_facts", lambda device, measure=False: facts)
    monkeypatch.setattr(tune_kernels, "tune_kernel", lambda name, **kw: {"values": {"num_warps": 8}, "candidates": [{}]})
    data = tmp_path / "bench"
    for sections in (tune.SECTIONS[3:4], tune.SECTIONS[2:4]):
        tune.run_all(["tiny-qwen3.5"], sections=sections, out_dir=tmp_path, data_dir=data)
    written = sorted(p.name for p in (data / facts.slug).iterdir())
    assert written == ["tune-run-attention_decode-chunk_delta_rule.json", "tune-run-chunk_delta_rule.json"]
    doc = json.loads((data / facts.slug / written[1]).read_text())
    assert [s["section"] for s in doc["sections"]] == ["chunk_delta_rule"] and doc["kind"] == "tune-run"
