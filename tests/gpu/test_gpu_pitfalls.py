"""The article's pitfalls on the GPU (labkit.lab.pitfalls): past 48 KB of shared memory a launch
fails with the runtime's error unless the kernel opted in, and past the opt-in limit it fails
anyway (CUDA and Triton); the host-work detector finds nothing in the fused decode step and names
each broken wrapper's copy or read-back; the TF32 table really switches TF32.

Asserts facts, not times. The CUDA demo extension (load_inline) builds once per machine, ~30-60 s
cold: its tests are one xdist group."""

import pytest
import torch

from labkit.lab import pitfalls as pf
from labkit.lab.pitfalls import KB


@pytest.fixture(scope="module")
def limits():
    return pf.device_smem_limits()


@pytest.mark.heavy(seconds=60)
@pytest.mark.xdist_group("labkit-pitfalls-smem")
def test_device_limits_agree_with_torch(limits):
    smem, report = limits
    assert smem.per_block == 48 * KB and smem.per_block < smem.per_block_optin <= smem.per_sm
    seen = report["torch"]
    assert seen["shared_memory_per_block"] == smem.per_block
    assert seen["shared_memory_per_block_optin"] in (None, smem.per_block_optin)
    assert seen["shared_memory_per_multiprocessor"] == smem.per_sm
    if torch.cuda.get_device_capability()[0] == 9:
        assert smem.per_block_optin == 227 * KB  # H100 / H200


@pytest.mark.xdist_group("labkit-pitfalls-smem")
def test_cuda_launches_fail_past_48_kb_without_opt_in_and_past_the_limit_with_it(limits):
    rows = {r.case: r for r in pf.cuda_smem_demo(limits[0])}
    assert pf.smem_surprises(rows.values()) == [], [vars(r) for r in rows.values()]
    no_opt_in = rows["64 KB, no opt-in"]
    assert not no_opt_in.launched and "cudaErrorInvalidValue" in no_opt_in.error and "invalid argument" in no_opt_in.error
    assert rows["48 KB, no opt-in"].correct and rows["64 KB after cudaFuncSetAttribute(64 KB)"].correct
    assert rows["the opt-in limit after cudaFuncSetAttribute(limit)"].correct
    past = rows["opt-in limit + 1 KB after cudaFuncSetAttribute(limit + 1 KB)"]
    assert not past.launched and "cudaErrorInvalidValue" in past.opt_in_error and "cudaErrorInvalidValue" in past.error
    assert all(r.context_ok for r in rows.values())


@pytest.mark.xdist_group("labkit-pitfalls-smem")
def test_triton_opts_in_below_the_limit_and_raises_out_of_resources_above(limits):
    fits, too_big = pf.triton_smem_demo(limits[0])
    assert fits.launched and fits.correct and fits.verdict == "opt-in" and fits.shared_bytes > 48 * KB
    assert not too_big.launched and too_big.verdict == "too-large"
    assert "out of resource: shared memory" in too_big.error and str(limits[0].per_block_optin) in too_big.error
    assert fits.context_ok and too_big.context_ok


@pytest.mark.heavy(seconds=30)
def test_host_work_in_the_fused_step_and_in_two_broken_wrappers(real_model):
    reports = pf.decode_host_work(real_model("lfm2-350m"), "fused", steps=3)
    assert list(reports["clean"]) == [], f"the fused step does host work:\n{reports['clean']}"
    assert pf.host_work_surprises(reports) == []
    positions = reports["positions kept on the host"]
    # one copy per step in all; the profiler may fail to link some of them to the op that launched
    # them (seen on the H200: a third of them "from an unlinked launch in Activity Buffer Request")
    copies = sum(w.per_step for w in positions if w.kind == "h2d" and w.name.startswith("Memcpy HtoD"))
    assert copies == pytest.approx(1), str(positions)
    assert any(w.op == "aten::copy_" for w in positions), str(positions)  # the copy, or the sync of a blocking one
    item = reports[".item() every step"]
    names = {w.name for w in item if w.op == "aten::item"}
    assert "aten::item" in names and (any(n.startswith("Memcpy DtoH") for n in names)
                                      or "cudaStreamSynchronize" in names), str(item)


def test_tf32_changes_the_error_and_the_flag_comes_back():
    before = torch.backends.cuda.matmul.allow_tf32
    table = pf.tf32_table("cuda", (1024, 1023), warmup=1, repeats=3)
    rows = {(r.n, r.mode): r for r in table}
    assert torch.backends.cuda.matmul.allow_tf32 == before
    # TF32 keeps 10 mantissa bits: its error is far above fp32's and below bf16's (7 bits). At the
    # unaligned size cuBLAS may pick another kernel: the bench reports it (tf32_rounded), not asserted here
    assert rows[1024, "fp32"].rel_err < 1e-5 < rows[1024, "tf32"].rel_err < rows[1024, "bf16"].rel_err < 1e-2
    assert pf.tf32_summary(table)["tf32_rounded"]["1024"] is True
    assert rows[1023, "fp32"].rel_err < 1e-5 < rows[1023, "bf16"].rel_err < 1e-2
    assert all(r.tflops > 0 for r in rows.values())
