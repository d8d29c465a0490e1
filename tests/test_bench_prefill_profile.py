"""python -m labkit.bench.prefill_profile on a CPU: the per-kernel arithmetic on made-up device events,
and one run end to end on a tiny preset (the reference backend: no kernels to profile, only the
pipeline: timing, profile, the float32 check, an ablation, the attribution, the results file)."""

import json
from types import SimpleNamespace

import pytest
import torch

from labkit.bench import prefill_profile as pp
from labkit.bench.cli import OWN_PARSERS


def _event(name, start, end):
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA, time_range=SimpleNamespace(start=start, end=end))


def test_the_table_counts_every_device_event_and_the_busy_time_is_their_union():
    events = [_event("nvjet_tst_128x256", 0.0, 10.0), _event("_swiglu_kernel", 12.0, 15.0),
              _event("nvjet_tst_128x256", 14.0, 20.0), _event("Memset (Device)", 30.0, 31.0),
              _event("labkit::step", 0.0, 40.0)]  # a record_function range mirrored on the device: not a kernel
    prof = SimpleNamespace(events=lambda: events)
    row = pp.ProfiledPrefill("m", "fused+graph", 8)
    pp.summarize(prof, row)
    assert row.kernels == 4 and row.busy_ms == pytest.approx(0.019)  # [0, 10] + [12, 20] + [30, 31] us
    assert row.kernel_ms == pytest.approx(0.020)
    assert [(r.name, r.family, r.count) for r in row.table] == [
        ("nvjet_tst_128x256", "gemm", 2), ("_swiglu_kernel", "triton", 1), ("Memset (Device)", "memory", 1)]
    assert row.table[0].device_ms == pytest.approx(0.016)
    assert row.families == {"gemm": {"count": 2, "device_ms": pytest.approx(0.016)},
                            "triton": {"count": 1, "device_ms": pytest.approx(0.003)},
                            "memory": {"count": 1, "device_ms": pytest.approx(0.001)}}
    assert pp.family("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add<c10::BFloat16>>") == "torch"
    assert pp.family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"


def test_a_run_on_a_tiny_preset_writes_its_results(tmp_path, capsys):
    status = pp.main(["--models", "tiny-lfm2", "--tokens", "6", "--backend", "reference", "--repeats", "1",
                      "--warmup", "0", "--check", "--ablate", "project_residual", "--attribution",
                      "--data-dir", str(tmp_path)])
    assert status == 0
    doc = json.loads((tmp_path / "cpu" / "prefill-profile.json").read_text())
    assert doc["kind"] == "prefill-profile" and doc["tokens"] == 6 and doc["command"].startswith("python -m labkit")
    (entry,) = doc["results"]
    profile = entry["profile"]
    assert profile["error"] is None and profile["wall_ms"] > 0 and len(profile["wall_runs_ms"]) == 1
    assert profile["check"]["passed"] and profile["check"]["error"] < profile["check"]["bound"]
    assert [a["paths_off"] for a in entry["ablations"]] == [["project_residual"]]
    assert "launched_by" in entry
    assert "tiny-lfm2 reference, T=6: wall" in capsys.readouterr().out


def test_it_is_a_bench_subcommand_and_refuses_unknown_paths(capsys):
    assert OWN_PARSERS["prefill-profile"][0] == "labkit.bench.prefill_profile"
    with pytest.raises(SystemExit):
        pp.main(["--ablate", "no_such_path"])
    assert "unknown path 'no_such_path'" in capsys.readouterr().err
