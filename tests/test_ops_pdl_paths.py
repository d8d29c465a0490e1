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
from labkit.ops import short_conv as conv_mod
from labkit.ops.rope import rope_inv_freq

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the stubs are for the CPU interpreter")


@pytest.fixture
def stub_gdc(monkeypatch):
    for mod in (linear_mod, conv_mod, gdn_mod, attn_mod, head_mod):
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


def test_mixers(stub_gdc):
    g = torch.Generator().manual_seed(1)
    proj, state, weight = torch.randn(2, 3 * 40, generator=g), torch.randn(2, 2, 40, generator=g), torch.randn(40, 3, generator=g)
    s2 = state.clone()
    assert torch.equal(conv_mod.short_conv_decode(proj, state, weight, pdl=True), conv_mod.short_conv_decode(proj, s2, weight))

    dims = gdn_mod.GdnDims(2, 4, 16, 24)
    args = [torch.randn(2, dims.proj_dim, generator=g), torch.randn(2, 3, dims.conv_dim, generator=g),
            torch.randn(dims.conv_dim, 4, generator=g), torch.rand(4, generator=g), torch.randn(4, generator=g),
            torch.randn(24, generator=g), torch.randn(2, 4, 16, 24, generator=g)]
    copy = [a.clone() for a in args]
    a = gdn_mod.gdn_decode(*args, dims, 1e-6, block_v=8, pdl=True)
    b = gdn_mod.gdn_decode(*copy, dims, 1e-6, block_v=8)
    assert torch.equal(a, b) and torch.equal(args[6], copy[6]) and torch.equal(args[1], copy[1])

    ad = attn_mod.AttentionDims(4, 2, 32, 8, True)
    proj = torch.randn(2, ad.proj_dim, generator=g)
    keys, values = torch.randn(2, 2, 40, 32, generator=g), torch.randn(2, 2, 40, 32, generator=g)
    common = (torch.randn(32, generator=g), torch.randn(32, generator=g), rope_inv_freq(8, 1e4))
    lengths = torch.tensor([39, 7], dtype=torch.int32)
    k2, v2 = keys.clone(), values.clone()
    a = attn_mod.attention_decode(proj, *common, keys, values, lengths, ad, 1e-6, True, chunk=16, pdl=True)
    b = attn_mod.attention_decode(proj, *common, k2, v2, lengths, ad, 1e-6, True, chunk=16)
    assert rel_err(a, b) == 0 and torch.equal(keys, k2)
