"""CPU smoke runs of the bench subcommands that replaced tools/gpu_experiments (tiny presets, the
reference backend, seconds each); the GPU-only ones are checked up to where they need the GPU."""

import inspect
import json
import shlex

import pytest
import torch

from labkit.__main__ import main
from labkit.prefix_cache import _Restore

HIT = ["--prefix", "32", "--tail", "5", "--block-size", "16", "--device", "cpu"]


def _doc(tmp_path, name):
    (path,) = tmp_path.glob(f"*/{name}.json")
    return json.loads(path.read_text())


def test_hit_timeline_times_each_hit_and_records_its_command(tmp_path):
    assert main(["bench", "hit-timeline", *HIT, "--hits", "2", "--data-dir", str(tmp_path)]) == 0
    doc = _doc(tmp_path, "hit-timeline")
    assert doc["kind"] == "profile" and doc["model"] == "tiny-qwen3.5" and doc["backend"] == "reference"
    assert len(doc["hit_wall_ms"]) == 2 and all(w > 0 for w in doc["hit_wall_ms"])
    assert doc["hit_wall_median_ms"] == pytest.approx(sorted(doc["hit_wall_ms"])[0] / 2 + sorted(doc["hit_wall_ms"])[1] / 2)
    assert doc["tail_continuation_median_ms"] is None  # no CUDA events on a CPU
    assert shlex.split(doc["command"])[:5] == ["python", "-m", "labkit", "bench", "hit-timeline"]
    assert doc["versions"]["torch"] == torch.__version__ and doc["date"]


def test_hit_host_breaks_a_hit_down_and_checks_it_against_no_cache(tmp_path):
    assert main(["bench", "hit-host", *HIT, "--reps", "2", "--data-dir", str(tmp_path), "--name", "h"]) == 0
    doc = _doc(tmp_path, "h")
    whole, host = doc["hit: pc.prefill, real tail (ms)"], doc["hit: pc.prefill, tail stubbed = host side (ms)"]
    assert 0 < host < whole  # the stub leaves the tail's prefill out
    # the real hit runs the restore and a tail prefill; two medians of two CPU calls are too noisy to
    # order the restore against the stubbed hit's host side (a loaded CI machine reversed them)
    assert 0 < doc["restore: the copies (ms)"] < whole
    assert doc["tail prefill (5 tokens) (ms)"] > 0 and doc["python calls: weights_key"] > 0
    assert doc["hit vs no cache: rel err of last logits"] < 1e-5  # float32, the same maths
    functions = [r["function"] for r in doc["host side by function (cProfile, its overhead included)"]]
    assert any(f.startswith("labkit/prefix_cache.py:") and f.endswith("(prefill)") for f in functions)
    restore = f"labkit/prefix_cache.py:{inspect.getsourcelines(_Restore.__call__)[1]}(__call__)"
    assert restore in functions  # the stubbed hit runs the restore, as the real one does


def test_a_hit_needs_a_prefix_of_at_least_one_block(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "hit-host", "--prefix", "8", "--block-size", "16", "--device", "cpu", "--data-dir", str(tmp_path)])
    assert exit_.value.code == 2 and "--prefix" in capsys.readouterr().err


def test_a_hit_bench_switches_fast_paths_off_and_refuses_an_unknown_one(tmp_path, capsys, monkeypatch):
    from labkit.bench import prefix_hit
    from labkit.decode.fused_prefill import FAST_PATHS

    seen, before = [], dict(FAST_PATHS)

    def timeline(*args):
        seen.append(dict(FAST_PATHS))
        return {"hits": 0}

    monkeypatch.setattr(prefix_hit, "hit_timeline", timeline)
    assert main(["bench", "hit-timeline", *HIT, "--paths-off", "gate_up_swiglu", "--data-dir", str(tmp_path)]) == 0
    assert seen == [{**before, "gate_up_swiglu": False}] and before["gate_up_swiglu"] and FAST_PATHS == before
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "hit-timeline", *HIT, "--paths-off", "attention", "--data-dir", str(tmp_path)])
    assert exit_.value.code == 2 and "unknown path 'attention'" in capsys.readouterr().err


def _listing(names):
    header = "Device GH100\n---------------------------------- -------------- --------- ----\nMetric Name  Metric Type  Metric Unit  Metric Description\n"
    return header + "".join(f"{n}   Counter   {''}   a counter\n" for n in names)


def test_ncu_metrics_reads_a_saved_listing(tmp_path):
    names = [f"l1tex__counter_{i}" for i in range(120)] + ["sm__warps_active", "sm__warps_launched", "dram__throughput"]
    (tmp_path / "query.txt").write_text(_listing(names))
    argv = ["bench", "ncu-metrics", "--listing", str(tmp_path / "query.txt"), "--device", "cpu",
            "--data-dir", str(tmp_path / "data")]
    assert main(argv) == 0
    rows = {r["name"]: r for r in _doc(tmp_path / "data", "ncu-metric-names")["results"]}
    assert rows["sm__warps_active"]["listed"] and rows["dram__throughput"]["listed"]
    assert not rows["sm__warps_active_avg"]["listed"] and rows["sm__warps_active_avg"]["matches"] == ["sm__warps_active", "sm__warps_launched"]
    assert not rows["tma__throughput"]["listed"] and rows["tma__throughput"]["matches"] == []


def test_ncu_metrics_writes_nothing_from_an_error_message(tmp_path):
    (tmp_path / "query.txt").write_text("==ERROR== the chip gh100 is not supported\n")
    argv = ["bench", "ncu-metrics", "--listing", str(tmp_path / "query.txt"), "--data-dir", str(tmp_path / "data")]
    assert main(argv) == 1
    assert not list(tmp_path.rglob("*.json"))


def test_tma_alignment_views_start_where_asked():
    from labkit.bench.tma_alignment import offset_weight

    buf = torch.arange(3 * 40 + 256, dtype=torch.bfloat16)
    for offset in (0, 16, 8, 128):
        w = offset_weight(buf, offset, 3, 37, 40)
        assert w.shape == (3, 37) and w.stride() == (40, 1)
        assert w.data_ptr() - buf.data_ptr() == offset
        assert torch.equal(w[1], buf[offset // 2 + 40: offset // 2 + 77])
    with pytest.raises(ValueError, match="element size"):
        offset_weight(buf, 3, 3, 37, 40)
    with pytest.raises(ValueError, match="cannot hold"):
        offset_weight(buf, 0, 30, 37, 40)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's answer")
def test_tma_alignment_says_it_needs_a_gpu(tmp_path, capsys):
    assert main(["bench", "tma-alignment", "--data-dir", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out and not list(tmp_path.rglob("*.json"))


def test_the_persistent_timeline_needs_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu/test_gpu_persistent.py stamps a step there")
    assert main(["bench", "persistent-timeline", "--data-dir", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_miss_timeline_times_a_steady_miss_beside_no_cache(tmp_path):
    assert main(["bench", "miss-timeline", "--tokens", "37", "--block-size", "16", "--repeats", "2", "--device", "cpu",
                 "--data-dir", str(tmp_path)]) == 0
    doc = _doc(tmp_path, "miss-timeline")
    assert doc["kind"] == "profile" and doc["model"] == "tiny-qwen3.5" and doc["tokens"] == 37
    for name in ("no cache", "steady miss"):
        assert len(doc[name]["ttft_ms"]) == 2 and doc[name]["span_ms"] > 0
        assert doc[name]["kernels"] == 0 and doc[name]["first_kernel_ms"] is None  # a CPU: no device kernels
    assert doc["miss / no cache (ttft medians)"] == pytest.approx(
        doc["steady miss"]["ttft_median_ms"] / doc["no cache"]["ttft_median_ms"])
    with pytest.raises(SystemExit):
        main(["bench", "miss-timeline", "--tokens", "8", "--block-size", "16", "--device", "cpu"])


def test_the_miss_timeline_finds_the_device_idle_and_what_the_host_did_meanwhile():
    from labkit.bench.prefix_miss import timeline

    events = [("call", False, 0.0, 100.0), ("cudaStreamSynchronize", False, 10.0, 40.0), ("launch", False, 45.0, 48.0),
              ("k1", True, 40.0, 50.0), ("k2", True, 48.0, 60.0), ("k3", True, 62.0, 70.0), ("k4", True, 90.0, 95.0)]
    got = timeline(events)
    assert got["span_ms"] == pytest.approx(0.1) and got["kernels"] == 4
    assert got["busy_ms"] == pytest.approx((20 + 8 + 5) / 1e3)  # k1 and k2 overlap: their union
    assert got["first_kernel_ms"] == pytest.approx(0.04)
    # idle: 0-40 (the sync), 70-90; 60-62 is shorter than IDLE_US
    assert got["idle_stretches"] == 2 and got["idle_ms"] == pytest.approx(0.06)
    first, second = got["longest_idle"]
    assert first["us"] == pytest.approx(40) and first["host"][0] == ["call", 40.0]
    assert ["cudaStreamSynchronize", 30.0] in first["host"]
    assert second["at_ms"] == pytest.approx(0.07) and [n for n, _ in second["host"]] == ["call"]
    with pytest.raises(ValueError, match="host"):
        timeline([("k", True, 0.0, 1.0)])


def test_generate_wall_splits_each_call_as_it_reports_itself(tmp_path, monkeypatch):
    """Each row's wall is at least its parts (set-up, TTFT, decode), the rest is what is left of each
    call, and the parts are the calls' own reports, not re-timed: a faked report moves them."""
    from labkit.bench import generate_wall

    argv = ["bench", "generate", "--models", "tiny-lfm2", "--impls", "reference", "--prompts", "9", "--new-tokens", "1",
            "3", "--ids", "host", "device", "--repeats", "3", "--warmup", "1", "--device", "cpu",
            "--data-dir", str(tmp_path), "--name", "g"]
    assert main(argv) == 0
    doc = _doc(tmp_path, "g")
    assert doc["kind"] == "generate" and shlex.split(doc["command"])[3:] == argv
    rows = doc["results"]
    assert [(r["new_tokens"], r["ids"]) for r in rows] == [(1, "host"), (1, "device"), (3, "host"), (3, "device")]
    for r in rows:
        assert r["error"] is None and len(r["runs_ms"]) == 3 and r["first_call_ms"] > 0
        assert r["wall_ms"] == pytest.approx(sorted(r["runs_ms"])[1])
        assert 0 < r["ttft_ms"] < r["wall_ms"] and r["setup_ms"] > 0 and r["rest_ms"] >= 0
    assert rows[0]["decode_ms"] < rows[2]["decode_ms"]  # one token has no decode steps; three have two

    real = generate_wall.generate

    def reporting_one_second_of_setup(*args, **kwargs):
        out = real(*args, **kwargs)
        out.setup_s = 1.0
        return out

    monkeypatch.setattr(generate_wall, "generate", reporting_one_second_of_setup)
    assert main([*argv[:-1], "faked"]) == 0
    faked = _doc(tmp_path, "faked")["results"][0]
    assert faked["setup_ms"] == pytest.approx(1000) and faked["rest_ms"] < 0


def test_generate_wall_refuses_a_peer_a_negative_warmup_and_a_missing_file(tmp_path, capsys):
    for bad, word in ((["--impls", "transformers"], "--impls"), (["--warmup", "-1"], "--warmup"),
                      (["--against", str(tmp_path / "nothing.py")], "--against")):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", "generate", "--models", "tiny-lfm2", *bad, "--device", "cpu", "--data-dir", str(tmp_path),
                  "--name", "g"])
        assert exit_.value.code == 2 and word in capsys.readouterr().err


def test_generate_wall_times_another_generate_in_turns_and_refuses_one_that_differs(tmp_path):
    """--against: the same generate.py (a copy) gives the same tokens and figures of its own; a copy
    whose first token is changed is a row that says so."""
    import labkit.generate  # noqa: F401  (the module: labkit.generate is also the function)
    import sys

    source = open(sys.modules["labkit.generate"].__file__).read()
    same, changed = tmp_path / "generate_same.py", tmp_path / "generate_changed.py"
    same.write_text(source)
    assert "    out[:, 0] = token" in source
    changed.write_text(source.replace("    out[:, 0] = token", "    out[:, 0] = (token + 1) % model.cfg.vocab_size"))
    base = ["bench", "generate", "--models", "tiny-qwen3.5", "--impls", "reference", "--prompts", "7", "--ids", "host",
            "--repeats", "2", "--warmup", "0", "--device", "cpu", "--data-dir", str(tmp_path)]
    assert main([*base, "--against", str(same), "--name", "same"]) == 0
    (row,) = _doc(tmp_path, "same")["results"]
    assert row["error"] is None and row["against"] == str(same)
    assert row["against_wall_ms"] > 0 and row["against_ttft_ms"] > 0 and row["paired_saving_ms"] == row["paired_saving_ms"]
    assert main([*base, "--against", str(changed), "--name", "changed"]) == 1
    (row,) = _doc(tmp_path, "changed")["results"]
    assert "different tokens" in row["error"]
