"""The CUDA TMA GEMV (kernels/tma_gemv.cu via labkit.cuda.tma_linear), plain, with the residual and
the SwiGLU epilogues and the RMSNorm prologue, against labkit.ops.linear.linear_ref: irregular shapes (N not a multiple of any tile, K a multiple of 8 as
TMA requires, K not a multiple of the box), batch 1, 3, 16, several blockings and K splits, and
every projection shape of both real presets. Outputs are poisoned with NaN first.

The blocking is a run-time argument of one build (the nvcc build of ``kernels/*.cu``, 60-85 s on the
H200 machine), so the whole grid costs no compile: with the build done, 131 tests took about a
second on three workers. The grid stays whole; what costs is the build, and it happens once: every
test here is in one ``xdist_group`` (one worker; others never wait on the build's lock), and the
module's first fixture builds it, so the build shows in the durations as that setup, by name.
"""

import pytest
import torch

from labkit import cuda
from labkit.bench.tma import projection_shapes
from labkit.ops.linear import linear_ref
from labkit.bench.ops import rel_err

pytestmark = pytest.mark.xdist_group("labkit-cuda-extension")


@pytest.fixture(scope="module", autouse=True)
def built_extension():
    """labkit.cuda's extension, built (or loaded from its cache) before the first test."""
    return cuda.load()


TOL = 1e-2  # bf16 output of a float32 sum; the reference rounds x W^T to bf16 before the residual add
CONFIGS = [
    None,
    cuda.TmaConfig(block_n=16, block_k=128, stages=2),
    cuda.TmaConfig(block_n=32, block_k=64, stages=3, split_k=2),
    cuda.TmaConfig(block_n=64, block_k=256, stages=4, max_blocks=5),  # a few blocks: many items each
    cuda.TmaConfig(block_n=16, block_k=256, stages=1, split_k=5),
]


def _operands(batch, n, k, residual, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, k, dtype=torch.bfloat16, device="cuda", generator=gen)
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda", generator=gen) / k**0.5
    r = torch.randn(batch, n, dtype=torch.bfloat16, device="cuda", generator=gen) if residual else None
    return x, w, r


def _check(x, w, r, config=None):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = cuda.tma_linear(x, w, r, out=out, config=config)
    assert got is out
    err = rel_err(out, linear_ref(x, w, residual=r))
    assert err < TOL, f"relative error {err:.3g} for x {list(x.shape)}, W {list(w.shape)}, {config}"
    return out


@pytest.mark.parametrize("n, k", [(1, 8), (37, 264), (1001, 1032), (3001, 4104)])
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "default" if c is None else repr(c)[10:])
def test_irregular_shapes(n, k, batch, config):
    x, w, r = _operands(batch, n, k, residual=batch != 1)
    first = _check(x, w, r, config)
    again = _check(x, w, r, config)  # split-K counters reset by the kernel; same sum order
    assert torch.equal(first, again)


@pytest.mark.parametrize("n, k", [(37, 264), (1001, 1032)])  # n outputs: W is [2n, k]
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "default" if c is None else repr(c)[10:])
def test_swiglu_epilogue(n, k, batch, config):
    x, w, _ = _operands(batch, 2 * n, k, residual=False)
    if config is not None and not cuda.fits(config, batch, swiglu=True):
        with pytest.raises(RuntimeError, match="shared memory"):
            cuda.tma_linear(x, w, swiglu=True, config=config)
        return
    _check_swiglu(x, w, config)


def _check_swiglu(x, w, config=None):
    out = torch.full((x.shape[0], w.shape[0] // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
    cuda.tma_linear(x, w, out=out, swiglu=True, config=config)
    err = rel_err(out, linear_ref(x, w, swiglu=True))
    assert err < TOL, f"swiglu: relative error {err:.3g} for x {list(x.shape)}, W {list(w.shape)}, {config}"


@pytest.mark.parametrize("n, k", [(37, 264), (1001, 1032)])
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("epilogue", ["plain", "residual", "swiglu"])
@pytest.mark.parametrize("unit_offset", [False, True])
def test_norm_prologue(n, k, batch, epilogue, unit_offset):
    x, w, r = _operands(batch, 2 * n if epilogue == "swiglu" else n, k, residual=epilogue == "residual")
    x = 3 * x + 1  # rows far from unit RMS: the scale matters
    norm_w = torch.rand(k, dtype=torch.bfloat16, device="cuda", generator=torch.Generator("cuda").manual_seed(k))
    kw = dict(norm_weight=norm_w, norm_eps=1e-5, norm_unit_offset=unit_offset, swiglu=epilogue == "swiglu")
    for config in (None, cuda.TmaConfig(block_n=32, block_k=64, stages=3, split_k=2)):
        out = torch.full((batch, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        cuda.tma_linear(x, w, r, out=out, config=config, **kw)
        err = rel_err(out, linear_ref(x, w, residual=r, **kw))
        assert err < TOL, f"norm + {epilogue}: relative error {err:.3g}, {config}"


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_real_projection_shapes(batch):
    for shape in projection_shapes():
        x, w, r = _operands(batch, shape.n, shape.k, residual="residual" in shape.where, seed=shape.n)
        _check(x, w, r)
        if "swiglu" in shape.where:
            _check_swiglu(x, w)


def test_strided_weight_in_place_residual_and_pdl():
    x, big, r = _operands(3, 300, 1024, residual=True)
    w = big[:, 256:768]  # row stride 1024, base 512 bytes in: both 16-byte aligned
    ref = linear_ref(x[:, :512].contiguous(), w, residual=r)
    xs = x[:, :512]  # x with a row stride too
    y = cuda.tma_linear(xs, w, r, out=r, pdl=True)
    torch.cuda.synchronize()
    assert y is r and rel_err(r, ref) < TOL


def test_misaligned_views_are_errors_on_the_gpu():
    x, w, _ = _operands(2, 64, 1032, residual=False)
    with pytest.raises(ValueError, match="16-byte aligned"):  # K = 1024, row stride 1032, base 8 bytes in
        cuda.tma_linear(x[:, :1024], w[:, 4:1028])
    with pytest.raises(ValueError, match="16-byte aligned"):
        cuda.tma_linear(x[:, 4:1028], w[:, :1024])
