"""kernels/*.cu without a GPU: every kernel compiles with plain nvcc for sm_90a and sm_100a and
ptxas reports no spills; labkit.cuda's argument checks, which run before any build.

Where CI=true, a missing nvcc fails the compile check (the CI image has the CUDA toolkit);
elsewhere it skips and says why."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from labkit import cuda

REPORT_WITH_SPILLS = """\
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooPf
    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
ptxas info    : Compiling entry function '_Z3barPf' for 'sm_90a'
ptxas info    : Function properties for _Z3barPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers
"""


def _need_nvcc():
    if cuda.find_nvcc() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must compile kernels/*.cu, but nvcc is not installed (no CUDA_HOME, not on PATH)")
        pytest.skip("nvcc is not installed here: the kernel compile check needs the CUDA toolkit")


@pytest.fixture(scope="module")
def ptxas_reports():
    """ptxas's report of every kernel source for every CI target, compiled two at a time."""
    _need_nvcc()
    sources = cuda.kernel_sources()
    assert sources, f"no kernels in {cuda.KERNELS_DIR}"
    jobs = [(source, arch) for source in sources for arch in cuda.ARCHS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(lambda job: cuda.ptxas_report(*job), jobs)))


@pytest.mark.parametrize("arch", cuda.ARCHS)
def test_every_kernel_compiles_without_spills(arch, ptxas_reports):
    for (source, target), entries in ptxas_reports.items():
        if target != arch:
            continue
        assert entries, f"ptxas reported no kernels for {source.name} (sm_{arch})"
        for e in entries:
            assert e.arch == f"sm_{arch}"
            assert (e.spill_store_bytes, e.spill_load_bytes) == (0, 0), f"{source.name}: {e} spills"


def test_ptxas_parser_sees_spills():
    entries = cuda.parse_ptxas(REPORT_WITH_SPILLS)
    assert [(e.kernel, e.spill_store_bytes, e.spill_load_bytes, e.registers) for e in entries] == [
        ("_Z3fooPf", 8, 4, 255), ("_Z3barPf", 0, 0, 32)]


def test_build_dir_is_keyed_by_arch_and_sources():
    a, b = cuda.build_dir("90a"), cuda.build_dir("100a")
    assert a != b and a.name.endswith(cuda.source_hash()) and a.name.startswith("sm_90a-")


def _bf16(*shape, offset=0):
    return torch.zeros(offset + torch.Size(shape).numel(), dtype=torch.bfloat16)[offset:].view(*shape)


@pytest.mark.parametrize("make, message", [
    (lambda: (_bf16(1, 64).float(), _bf16(32, 64)), "dtype"),
    (lambda: (_bf16(1, 64), _bf16(32, 64).half()), "dtype"),
    (lambda: (_bf16(1, 72), _bf16(32, 64)), r"shape \[B, 64\]"),
    (lambda: (_bf16(17, 64), _bf16(32, 64)), "batch of 1..16"),
    (lambda: (_bf16(1, 60), _bf16(32, 60)), "multiple of 8"),
    (lambda: (_bf16(1, 64), _bf16(32, 64, offset=4)), "16-byte aligned"),
    (lambda: (_bf16(1, 64), _bf16(32, 68)[:, :64]), "row stride"),
    (lambda: (_bf16(1, 64), _bf16(64, 32).t()), "unit column stride"),
    (lambda: (_bf16(1, 64), _bf16(32, 64)), "CUDA GPU"),
])
def test_bad_arguments_are_clear_errors(make, message):
    x, w = make()
    with pytest.raises((TypeError, ValueError), match=message):
        cuda.tma_linear(x, w)


def test_bad_residual_swiglu_and_config():
    x, w = _bf16(3, 64), _bf16(32, 64)
    with pytest.raises(ValueError, match=r"residual must have shape \[3, 32\]"):
        cuda.tma_linear(x, w, _bf16(3, 31))
    with pytest.raises(ValueError, match="even row count"):
        cuda.tma_linear(x, _bf16(33, 64), swiglu=True)
    with pytest.raises(ValueError, match="no residual"):
        cuda.tma_linear(x, w, _bf16(3, 16), swiglu=True)
    with pytest.raises(ValueError, match=r"out must have shape \[3, 16\]"):  # swiglu: N / 2 outputs
        cuda.tma_linear(x, w, out=_bf16(3, 32), swiglu=True)
    with pytest.raises(ValueError, match=r"norm_weight must have shape \[64\]"):
        cuda.tma_linear(x, w, norm_weight=_bf16(63))
    with pytest.raises(TypeError, match="norm_weight must have dtype"):
        cuda.tma_linear(x, w, norm_weight=_bf16(64).float())
    for bad in (dict(block_n=8), dict(block_k=512), dict(block_n=16, block_k=64), dict(stages=0)):
        with pytest.raises(ValueError, match="TmaConfig"):
            cuda.TmaConfig(**bad)


def test_split_k_covers_the_gpu_and_leaves_no_split_empty():
    cfg = cuda.TmaConfig(block_n=16, block_k=256)
    assert cfg.splits(1024, 4608, 132) == 3  # 64 row tiles x 3 >= 132
    assert cfg.splits(65536, 1024, 132) == 1
    for k_tiles in range(1, 20):
        split = cfg.splits(16, 256 * k_tiles, 132)
        per = -(-k_tiles // split)
        assert (split - 1) * per < k_tiles <= split * per


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where there is no GPU")
def test_load_without_gpu_is_a_clear_error():
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        cuda.load()


def test_no_toolkit_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    with pytest.raises(RuntimeError, match="needs the CUDA toolkit's nvcc"):
        cuda.require_nvcc()
