"""`python -m labkit bench decode|prefill|ops` on a CPU: results files with their provenance, the
wall-clock rows of labkit.generate, and a clear refusal where a GPU is needed."""

import json
import os

import pytest
import torch

from labkit.__main__ import main


def test_decode_and_prefill_write_results_with_provenance(tmp_path, capsys):
    common = ["--models", "tiny-lfm2", "--batch", "2", "--repeats", "1", "--data-dir", str(tmp_path)]
    assert main(["bench", "decode", *common, "--impls", "reference", "--prompt", "5", "--new-tokens", "3",
                 "--wall-calls", "1", "2", "--name", "d"]) == 0
    assert main(["bench", "prefill", *common, "--impls", "reference", "--lengths", "7", "--name", "p", "--plot"]) == 0
    (decode_file,) = tmp_path.glob("*/d.json")
    doc = json.loads(decode_file.read_text())
    assert doc["kind"] == "decode" and doc["versions"]["torch"] == torch.__version__ and doc["date"]
    assert doc["command"].startswith("python -m labkit bench decode") and doc["device"]["copy_bytes_per_s"] > 0
    # the host's CPU too: a figure with host work in it moves with it
    assert doc["host"]["cpus"] == os.cpu_count() and doc["host"]["cpu"] not in (None, "", "x86_64")
    assert 1 <= doc["host"]["cpus_allowed"] <= doc["host"]["cpus"]  # a taskset-pinned run says it was
    for row in doc["results"]:
        assert row["error"] is None and row["tokens_per_s"] > 0 and len(row["runs_tokens_per_s"]) == 1
        assert [w["calls"] for w in row["wall_clock"]] == [1, 2]
        for w in row["wall_clock"]:
            assert w["seconds"] > 0 and w["tokens_per_s"] == pytest.approx(w["calls"] * 2 * 3 / w["seconds"])
    (prefill,) = json.loads(next(tmp_path.glob("*/p.json")).read_text())["results"]
    assert prefill["ms"] > 0 and prefill["tokens"] == 7 and prefill["first_call_ms"] > 0
    assert next(tmp_path.glob("*/p.png")).stat().st_size > 0
    assert "generate() x2" in capsys.readouterr().out


def test_ops_needs_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        return
    assert main(["bench", "prefill", "--models", "tiny-lfm2", "--name", "p", "--gdn-kernel", "k",
                 "--data-dir", str(tmp_path)]) == 2
    assert "--gdn-kernel times the kernel inside CUDA graphs" in capsys.readouterr().out
    assert main(["bench", "ops", "--models", "tiny-lfm2", "--name", "o", "--data-dir", str(tmp_path)]) == 2
    assert "CUDA" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_cache_writes_ttft_workload_and_precision_rows(tmp_path):
    assert main(["bench", "cache", "--models", "tiny-qwen3.5", "--backends", "reference", "--ttft-cases", "9:2:4",
                 "--repeats", "1", "--block-size", "8", "--budgets", "4", "--policies", "lru", "--steps", "3",
                 "--name", "c", "--data-dir", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("*/c.json")).read_text())
    assert doc["kind"] == "prefix-cache" and doc["command"].startswith("python -m labkit bench cache")
    rows = {r["experiment"]: [x for x in doc["results"] if x["experiment"] == r["experiment"]] for r in doc["results"]}
    assert all(r["error"] is None for r in doc["results"])
    (ttft,) = rows["ttft"]
    assert ttft["restored"] == 8 and ttft["mismatches"] == 0 and ttft["hits"] == 3 and ttft["ttft_hit_ms"] > 0
    assert ttft["dtype"] == "float32"
    assert ttft["setup_nocache_ms"] > 0 and ttft["setup_hit_ms"] > 0  # what generate does before its TTFT timing
    assert ttft["speedup_with_setup"] == pytest.approx((ttft["setup_nocache_ms"] + ttft["ttft_nocache_ms"])
                                                       / (ttft["setup_hit_ms"] + ttft["ttft_hit_ms"]))
    work = {r["workload"]: r for r in rows["workload"]}
    assert set(work) == {"shared-prefix", "multi-turn", "unrelated"} and all(r["mismatches"] == 0 for r in work.values())
    assert work["unrelated"]["hit_rate"] == 0 and 0 < work["shared-prefix"]["hit_rate"] <= work["shared-prefix"]["ceiling_hit_rate"]
    (prec,) = rows["precision"]
    assert len(prec["rel_err"]) == 3 and prec["state_bytes_rounded"] * 2 == prec["state_bytes_float32"]


def test_cache_switches_the_named_fast_paths_off_for_its_run(tmp_path, monkeypatch, capsys):
    """--paths-off: the run sees those FAST_PATHS off, and they are back on after it; a name that is
    not a path is refused before anything runs."""
    from labkit.bench import cache
    from labkit.decode.fused_prefill import FAST_PATHS

    seen, before = [], dict(FAST_PATHS)
    monkeypatch.setattr(cache, "run_cache_bench", lambda args, device: seen.append(dict(FAST_PATHS)) or [])
    assert main(["bench", "cache", "--paths-off", "gate_up_swiglu", "output_gate", "--name", "c",
                 "--data-dir", str(tmp_path)]) == 0
    assert seen == [{**before, "gate_up_swiglu": False, "output_gate": False}] and before["gate_up_swiglu"]
    assert FAST_PATHS == before
    with pytest.raises(SystemExit):
        main(["bench", "cache", "--paths-off", "gate_up", "--name", "c", "--data-dir", str(tmp_path)])
    assert "unknown path 'gate_up'" in capsys.readouterr().err


def test_a_transformers_peer_is_named_for_the_gdn_kernels_it_runs(monkeypatch):
    """Plain transformers of a GDN model is refused where fla is importable (it would run fla's
    kernels), and transformers+fla where it is not: a row never carries the wrong name."""
    import labkit
    from labkit.bench import decode

    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0)
    monkeypatch.setattr(decode, "fla_importable", lambda: True)
    row = decode.time_prefill(model, "transformers", 4, repeats=1)
    assert row.ms is None and "ask for the transformers+fla peer" in row.error
    monkeypatch.setattr(decode, "fla_importable", lambda: False)
    row = decode.time_prefill(model, "transformers+fla", 4, repeats=1)
    assert row.ms is None and "needs flash-linear-attention importable" in row.error


@pytest.mark.parametrize("impl,graph", [("fused+graph", True), ("fused", False), ("transformers", False)])
def test_a_graph_backends_prefill_is_timed_only_after_its_capture(monkeypatch, impl, graph):
    """A graph rung runs a prompt length eagerly until its capture_at-th call and captures it then:
    those calls are warm-up, never timed runs (one of three timed runs being the capture made the
    median the slower of the other two). Its first call is reported apart, as first_call_ms."""
    import labkit
    from labkit import tuning
    from labkit.bench import decode
    from labkit.lab.timing import Timing

    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    seen = {}

    class Runner:
        def prefill(self, ids):
            pass

        def reset(self):
            pass

    monkeypatch.setattr(decode, "make_runner", lambda *a, **k: Runner())
    monkeypatch.setattr(decode, "measure", lambda work, **kw: seen.update(kw) or Timing(1.0, [1.0]))
    row = decode.time_prefill(model, impl, 8, repeats=3)
    capture_at = tuning.settings("fused_prefill", model.device)["capture_at"]
    assert row.error is None and seen["warmup"] == (capture_at + 1 if graph else 1)
    assert seen["repeats"] == 3
    assert decode.time_prefill(model, impl, 8, repeats=3, warmup=0).error is None and seen["warmup"] == 0
