"""The article's pitfalls without a GPU (labkit.lab.pitfalls): the shared-memory verdicts and what
Triton compiles for sm_90, the CUDA demo kernel through nvcc, the host-work detector on a CPU decode
step and on synthetic GPU profiles, and the TF32 table's bookkeeping. The GPU halves are
tests/gpu/test_gpu_pitfalls.py."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch

import labkit
from labkit import cuda
from labkit.__main__ import main
from labkit.lab import pitfalls as pf
from labkit.lab.pitfalls import HOPPER, KB, SmemLaunch, smem_verdict

ROOT = Path(__file__).resolve().parent.parent
CPU, GPU = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def test_verdicts_at_each_side_of_both_limits():
    assert HOPPER.per_block == 49152 and HOPPER.per_block_optin == 232448  # 48 KB, 227 KB
    assert smem_verdict(0) == smem_verdict(48 * KB) == "fits"
    assert smem_verdict(48 * KB + 1) == smem_verdict(64 * KB) == smem_verdict(227 * KB) == "opt-in"
    assert smem_verdict(227 * KB + 1) == "too-large"
    small = pf.SmemLimits(16 * KB, 64 * KB, 64 * KB)
    assert smem_verdict(32 * KB, small) == "opt-in" and smem_verdict(65 * KB, small) == "too-large"
    assert all("CPU" not in text for text in pf.VERDICTS.values())
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError):
            smem_verdict(bad)
    with pytest.raises(ValueError, match="per_block <= per_block_optin"):
        pf.SmemLimits(64 * KB, 48 * KB, 228 * KB)


def test_surprises_flag_launches_that_contradict_the_verdict():
    ok = [SmemLaunch("cuda", "a", 64 * KB, opted_in=False, verdict="opt-in", error="cudaErrorInvalidValue: invalid argument",
                     context_ok=True),
          SmemLaunch("cuda", "b", 64 * KB, opted_in=True, verdict="opt-in", launched=True, correct=True, context_ok=True),
          SmemLaunch("triton", "c", 256 * KB, opted_in=True, verdict="too-large", error="out of resource", context_ok=True)]
    assert pf.smem_surprises(ok) == []
    silent = SmemLaunch("cuda", "d", 64 * KB, opted_in=False, verdict="opt-in", launched=True, correct=True)
    wrong = SmemLaunch("cuda", "e", 48 * KB, opted_in=False, verdict="fits", launched=True, correct=False)
    broken = SmemLaunch("cuda", "f", 48 * KB, opted_in=False, verdict="fits", launched=True, correct=True,
                        context_ok=False)
    found = pf.smem_surprises([silent, wrong, broken])
    assert len(found) == 3 and "expected the opposite" in found[0] and "differs" in found[1] and "context" in found[2]


def test_triton_compiles_one_tiling_past_48_kb_and_one_past_the_opt_in_limit():
    """Compiled for sm_90 with Triton's own compiler, in a fresh process (compile_check's stand-in driver)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "labkit.lab.pitfalls", "--arch", "90"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    shared = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(shared) == set(pf.TRITON_TILES)
    fits, too_big = (shared[case] for case in pf.TRITON_TILES)
    assert 48 * KB < fits <= HOPPER.per_block_optin and smem_verdict(fits) == "opt-in"
    assert too_big > HOPPER.per_block_optin and smem_verdict(too_big) == "too-large"
    for case, tile in pf.TRITON_TILES.items():  # the staged tiles are what the compiled kernel holds
        assert shared[case] == pf.tile_shared_estimate(tile), case


@pytest.mark.parametrize("shape", [pf.DEMO_SHAPE, (37, 20, 70)])
def test_the_tile_matmul_matches_torch_on_irregular_shapes(shape):
    from labkit.bench.ops import rel_err

    M, N, K = shape
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(M, K, generator=g).half(), torch.randn(K, N, generator=g).half()
    out = torch.full((M, N), float("nan"), dtype=torch.float16)
    pf.tile_matmul(a, b, out, **pf.TRITON_TILES["128x128x64 tiles, 3 stages"])
    assert rel_err(out, a.double() @ b.double()) < 2e-3
    with pytest.raises(ValueError, match="tile_matmul needs"):
        pf.tile_matmul(a, b.t(), out, **pf.TRITON_TILES["128x128x64 tiles, 3 stages"])


def test_the_cuda_demo_kernel_compiles_for_sm_90(tmp_path):
    if cuda.find_nvcc() is None:
        pytest.skip("nvcc is not installed here")
    source = tmp_path / "smem_demo.cu"
    source.write_text(pf.CUDA_SOURCE)
    entries = cuda.ptxas_report(source, "90")
    assert sorted(e.kernel for e in entries) == ["_Z19labkit_smem_reverseILi0EEvPKfPfi",
                                                 "_Z19labkit_smem_reverseILi1EEvPKfPfi"]
    assert all(e.spill_store_bytes == 0 for e in entries)
    assert all(f"std::string {name}(" in pf.CPP_SOURCE or f"int64_t {name}(" in pf.CPP_SOURCE for name in pf._FUNCTIONS)


@pytest.fixture(scope="module")
def tiny_reports():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    return pf.decode_host_work(model, "reference", context=5, steps=2)


def test_a_clean_cpu_step_has_no_host_work(tiny_reports):
    assert list(tiny_reports["clean"]) == [] and "no host work" in str(tiny_reports["clean"])


def test_item_in_a_cpu_step_is_caught_and_named(tiny_reports):
    found = {(w.kind, w.name, w.op, w.scope, w.per_step) for w in tiny_reports[".item() every step"]}
    assert found == {("sync", "aten::item", "aten::item", pf.STEP_SCOPE, 1.0),
                     ("sync", "aten::_local_scalar_dense", "aten::item", pf.STEP_SCOPE, 1.0)}
    assert "aten::item" in str(tiny_reports[".item() every step"])
    assert pf.host_work_surprises({".item() every step": tiny_reports[".item() every step"]}) == []
    assert pf.host_work_surprises({".item() every step": tiny_reports["clean"]})  # a miss is reported


def _ev(name, start, end, parent=None, device=CPU, kernels=()):
    return NS(name=name, device_type=device, time_range=NS(start=start, end=end), cpu_parent=parent,
              kernels=list(kernels))


def test_gpu_copies_and_api_calls_are_traced_to_their_op():
    """A synthetic CUDA profile of one step: a pageable host-to-device copy_ (its memcpy on the device,
    its cudaStreamSynchronize with no parent), a module scope around an .item(), and the caller's own
    synchronize after the step, which must not count."""
    step = _ev(pf.STEP_SCOPE, 0, 100)
    copy = _ev("aten::copy_", 10, 20, step, kernels=[NS(name="Memcpy HtoD (Pageable -> Device)", duration=1.5)])
    mlp = _ev("labkit::mlp", 30, 60, step)
    item = _ev("aten::item", 40, 55, mlp)
    dense = _ev("aten::_local_scalar_dense", 41, 54, item, kernels=[NS(name="Memcpy DtoH (Device -> Pageable)", duration=2.0)])
    events = [step, copy, mlp, item, dense,
              _ev("cudaMemcpyAsync", 11, 12), _ev("cudaStreamSynchronize", 12, 19),  # kineto gives API calls no parent
              _ev("cudaStreamSynchronize_ptsz", 42, 53),
              _ev("Memcpy HtoD (Pageable -> Device)", 500, 501.5, device=GPU),
              _ev("Memcpy DtoH (Device -> Pageable)", 600, 602, device=GPU),
              _ev("Memcpy DtoD (Device -> Device)", 700, 701, device=GPU),
              _ev("cudaDeviceSynchronize", 120, 130)]  # after the step
    found = {(w.kind, w.name, w.op, w.scope) for w in pf.host_work(events, steps=1)}
    assert found == {
        ("h2d", "Memcpy HtoD (Pageable -> Device)", "aten::copy_", pf.STEP_SCOPE),
        ("sync", "cudaStreamSynchronize", "aten::copy_", pf.STEP_SCOPE),
        ("sync", "aten::item", "aten::item", "labkit::mlp"),
        ("sync", "aten::_local_scalar_dense", "aten::item", "labkit::mlp"),
        ("sync", "cudaStreamSynchronize_ptsz", "aten::item", "labkit::mlp"),
        ("sync", "Memcpy DtoH (Device -> Pageable)", "aten::item", "labkit::mlp"),
    }


def test_find_host_work_checks_its_counts():
    with pytest.raises(ValueError, match="steps >= 1"):
        pf.find_host_work(lambda: None, steps=0)
    with pytest.raises(ValueError, match="unknown variant"):
        pf.decode_host_work(None, variants=["sloppy"])


def test_tf32_table_restores_the_flag_and_measures_error():
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    rows = pf.tf32_table("cpu", (64, 48, 47), warmup=0, repeats=1)
    assert matmul.allow_tf32 == before
    assert [(r.n, r.mode) for r in rows] == [(n, m) for n in (64, 48, 47) for m in pf.MATMUL_MODES]
    by = {(r.n, r.mode): r for r in rows}
    for n in (64, 48, 47):
        assert by[n, "fp32"].rel_err < 1e-5 < 1e-3 < by[n, "bf16"].rel_err < 1e-2  # bf16 rounds its inputs: ~3e-3
        assert all(by[n, m].tflops > 0 for m in pf.MATMUL_MODES)
    summary = pf.tf32_summary(rows, align=16)
    assert set(summary["speed_over_fp32"]["47"]) == {"tf32", "bf16"}
    assert {(u["n"], u["aligned_n"], u["mode"]) for u in summary["unaligned"]} == {(47, 48, m) for m in pf.MATMUL_MODES}
    assert summary["tf32_rounded"] == {"47": False, "48": False, "64": False}  # a CPU has no TF32


def test_tf32_table_restores_the_flag_when_a_measurement_fails(monkeypatch):
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32

    def fail(*args, **kwargs):
        assert matmul.allow_tf32 is False  # the fp32 row runs with TF32 off
        raise RuntimeError("boom")

    matmul.allow_tf32 = True
    try:
        monkeypatch.setattr(pf, "measure", fail)
        with pytest.raises(RuntimeError, match="boom"):
            pf.tf32_table("cpu", (8,))
        assert matmul.allow_tf32 is True
    finally:
        matmul.allow_tf32 = before
    with pytest.raises(ValueError, match="sizes"):
        pf.tf32_table("cpu", (0,))


def test_bench_pitfalls_says_it_needs_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: tests/gpu/test_gpu_pitfalls.py runs it")
    assert main(["bench", "pitfalls", "--data-dir", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out and not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        main(["bench", "pitfalls", "--only", "nothing"])
