"""The programmatic-dependent-launch variants of the kernels compute the same results.

griddepcontrol has no meaning in Triton's CPU interpreter, so there it is stubbed out; what this
checks is the code the PDL flag changes around it (weights loaded before the wait, the loop that
uses them). The launch behaviour itself is checked on a GPU by tests/gpu (fused+graph+pdl against
the other backends).
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops import attention_decode as attn_mod
from labkit.ops import gated_delta_decode as gdn_mod
from labkit.ops import greedy_head as head_mod
from labkit.ops import linear as linear_mod
from labkit.ops import plain_gemv as plain_mod
from labkit.ops import short_conv as conv_mod
from labkit.ops.rope import rope_inv_freq

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the stubs are for the CPU interpreter")


@pytest.fixture
def stub_gdc(monkeypatch):
    for mod in (linear_mod, conv_mod, gdn_mod, attn_mod, head_mod, plain_mod):
        if hasattr(mod, "gdc_wait"):
            monkeypatch.setattr(mod, "gdc_wait", lambda: None)
        if hasattr(mod, "gdc_launch_dependents"):
            monkeypatch.setattr(mod, "gdc_launch_dependents", lambda: None)


@pytest.mark.parametrize("m,config", [(1, linear_mod.LinearConfig(1, 16, 32)), (1, linear_mod.LinearConfig(1, 32, 16, 2)),
                                      (3, linear_mod.LinearConfig(16, 32, 32))])
def test_linear(stub_gdc, m, config):
    g = torch.Generator().manual_seed(0)
    x, w, norm = torch.randn(m, 72, generator=g), torch.randn(74, 72, generator=g), torch.randn(72, generator=g)
    for kw in ({"norm_weight": norm}, {"swiglu": True}):
        a = linear_mod.linear(x, w, config=config, pdl=True, **kw)
        b = linear_mod.linear(x, w, config=config, **kw)
        assert torch.equal(a, b)
    state = torch.randn(m, 2, 24, generator=g)
    conv_w = torch.randn(24, 3, generator=g)
    s2 = state.clone()
    a = linear_mod.linear(x, w[:72].contiguous(), short_conv=(state, conv_w), config=config, pdl=True)
    b = linear_mod.linear(x, w[:72].contiguous(), short_conv=(s2, conv_w), config=config)
    assert torch.equal(a, b) and torch.equal(state, s2)
    tok = head_mod.greedy_head(x, w, config=config, pdl=True)
    assert torch.equal(tok, head_mod.greedy_head_ref(x, w))


@pytest.mark.parametrize("placement", [linear_mod.PdlPlacement(p, r) for p in (True, False)
                                       for r in ("early", "after_wait", "end")])
@pytest.mark.parametrize("m,config", [(1, linear_mod.LinearConfig(1, 8, 32)), (1, linear_mod.LinearConfig(1, 16, 32, 3)),
                                      (1, linear_mod.LinearConfig(1, 16, 128)),
                                      (3, linear_mod.LinearConfig(16, 32, 32, 2))])
def test_linear_every_pdl_placement(stub_gdc, placement, m, config):
    """Preloading the first tile (peeled out of the K loop, K = 100: a ragged last tile) and where
    the release sits change nothing in the result, with and without PDL, split K included."""
    g = torch.Generator().manual_seed(2)
    x, w, norm = torch.randn(m, 100, generator=g), torch.randn(2 * 37, 100, generator=g), torch.randn(100, generator=g)
    ref = linear_mod.linear_ref(x, w, norm_weight=norm, swiglu=True)
    for pdl in (False, True):
        out = torch.full((m, 37), float("nan"))
        linear_mod.linear(x, w, out=out, norm_weight=norm, swiglu=True, config=config, pdl=pdl, placement=placement)
        assert rel_err(out, ref) < 1e-5


def test_linear_rejects_a_bad_placement():
    with pytest.raises(ValueError, match="release"):
        linear_mod.PdlPlacement(True, "soon")
    with pytest.raises(TypeError, match="PdlPlacement"):
        linear_mod.linear(torch.randn(1, 8), torch.randn(4, 8), placement="early")


@pytest.mark.parametrize("style,block_k,stages", [("pointer", 32, 1), ("descriptor", 32, 2), ("descriptor", 16, 3)])
def test_plain_gemv_with_and_without_pdl(stub_gdc, style, block_k, stages):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 72, generator=g), torch.randn(37, 72, generator=g)
    ref = plain_mod.plain_gemv_ref(x, w)
    for pdl in (False, True):
        out = torch.full((1, 37), float("nan"))
        plain_mod.plain_gemv(x, w, out=out, block_n=8, block_k=block_k, style=style, num_stages=stages, pdl=pdl)
        assert rel_err(out, ref) < 1e-6


def test_plain_gemv_rejects_bad_input():
    x, w = torch.randn(1, 64), torch.randn(8, 64)
    with pytest.raises(ValueError, match="256"):
        plain_mod.plain_gemv(x, w, block_k=512, style="descriptor")
    with pytest.raises(ValueError, match="aligned"):
        plain_mod.plain_gemv(torch.randn(1, 7), torch.randn(8, 7), block_k=8, style="descriptor")
    with pytest.raises(ValueError, match="style"):
        plain_mod.plain_gemv(x, w, style="tma")
    with pytest.raises(ValueError, match="power of two"):
        plain_mod.plain_gemv(x, w, block_n=3)
    with pytest.raises(ValueError, match="CUDA"):
        plain_mod.plain_gemv(x, w, stamps=torch.zeros(2, 3, dtype=torch.int64))


@pytest.mark.parametrize("early", [False, True])
def test_mixers(stub_gdc, early):
    # where the mixers release their successor (release_early) changes no result
    g = torch.Generator().manual_seed(1)
    proj, state, weight = torch.randn(2, 3 * 40, generator=g), torch.randn(2, 2, 40, generator=g), torch.randn(40, 3, generator=g)
    s2 = state.clone()
    assert torch.equal(conv_mod.short_conv_decode(proj, state, weight, pdl=True), conv_mod.short_conv_decode(proj, s2, weight))

    dims = gdn_mod.GdnDims(2, 4, 16, 24)
    args = [torch.randn(2, dims.proj_dim, generator=g), torch.randn(2, 3, dims.conv_dim, generator=g),
            torch.randn(dims.conv_dim, 4, generator=g), torch.rand(4, generator=g), torch.randn(4, generator=g),
            torch.randn(24, generator=g), torch.randn(2, 4, 16, 24, generator=g)]
    copy = [a.clone() for a in args]
    a = gdn_mod.gdn_decode(*args, dims, 1e-6, block_v=8, pdl=True, release_early=early)
    b = gdn_mod.gdn_decode(*copy, dims, 1e-6, block_v=8)
    assert torch.equal(a, b) and torch.equal(args[6], copy[6]) and torch.equal(args[1], copy[1])

    ad = attn_mod.AttentionDims(4, 2, 32, 8, True)
    proj = torch.randn(2, ad.proj_dim, generator=g)
    keys, values = torch.randn(2, 2, 40, 32, generator=g), torch.randn(2, 2, 40, 32, generator=g)
    common = (torch.randn(32, generator=g), torch.randn(32, generator=g), rope_inv_freq(8, 1e4))
    lengths = torch.tensor([39, 7], dtype=torch.int32)
    k2, v2 = keys.clone(), values.clone()
    a = attn_mod.attention_decode(proj, *common, keys, values, lengths, ad, 1e-6, True, chunk=16, pdl=True,
                                  release_early=early)
    b = attn_mod.attention_decode(proj, *common, k2, v2, lengths, ad, 1e-6, True, chunk=16)
    assert rel_err(a, b) == 0 and torch.equal(keys, k2)
