"""The MLP's gate|up GEMM with SwiGLU in its epilogue (labkit.ops.gemm_swiglu) against the reference
swiglu_ref(F.linear(x, w)): rows, widths and K that the tiles do not divide, a batch dimension,
small tiles so that the K loop and the grouped tile order run several times; the output poisoned.
The persistent TMA form with few programs, so that each takes several tiles (and its last partial
ones), its store whole and in halves."""

import pytest
import torch
import torch.nn.functional as F

from conftest import poison_empty, rel_err
from labkit.ops import gemm_swiglu as gs
from labkit.ops.mixers import swiglu_ref


# (config, W): the pointer form at W = 37; the persistent form at W = 56 (TMA rows stay multiples of
# 16 bytes), with few programs so that each takes several tiles
CASES = {"groups-of-4-last-partial": (gs.GemmConfig(16, 16, 16, 4, 4, 2), 37),
         "group1": (gs.GemmConfig(32, 16, 32, 1, 4, 1), 37),
         "persistent-five-programs": (gs.GemmConfig(16, 16, 16, 2, 4, 2, persistent=True, programs=5), 56),
         "persistent-split-store-not-flat": (gs.GemmConfig(32, 32, 16, 1, 4, 2, persistent=True, flatten=False,
                                                           split_store=True, programs=3), 56)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_reference(dtype, case, device, monkeypatch):
    """87 rows, K = 40 and W = 37 or 56: no tile divides them."""
    config, W = CASES[case]
    poison_empty(monkeypatch, gs)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 29, 40, generator=gen).to(dtype=dtype, device=device)
    w = (0.3 * torch.randn(2 * W, 40, generator=gen)).to(dtype=dtype, device=device)
    want = swiglu_ref(F.linear(x, w))
    got = gs.gemm_swiglu(x, w, config)
    assert got.shape == (3, 29, W) and got.dtype == dtype
    # gate and up rounded to the dtype before silu, as the reference; only the sums' order differs
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_persistent_form_refuses_rows_tma_cannot_map(device):
    x = torch.randn(5, 40, device=device).bfloat16()
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        gs.gemm_swiglu(x, torch.randn(2 * 37, 40, device=device).bfloat16(), gs.GemmConfig(persistent=True))
    with pytest.raises(ValueError, match="at most 256"):
        gs.GemmConfig(block_n=512, persistent=True)


def test_bad_input_is_refused(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="rows must be even"):
        gs.gemm_swiglu(x, torch.randn(7, 8, device=device))
    with pytest.raises(ValueError, match="K = 6"):
        gs.gemm_swiglu(x, torch.randn(8, 6, device=device))
    with pytest.raises(TypeError):
        gs.gemm_swiglu(x.bfloat16(), torch.randn(8, 8, device=device))
    with pytest.raises(ValueError, match="power of two"):
        gs.GemmConfig(block_m=48)
