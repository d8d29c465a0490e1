"""The prefill's element-wise kernels and fast paths at real shapes on a GPU, against their references,
outputs poisoned with NaN (tests/conftest.py poison_empty): Gated DeltaNet's inputs at Qwen3.5-0.8B's
shape for every launch setting of labkit.bench.prefill_profile.GDN_SWEEP (the same bits as the
defaults; the conv window updated in place, exactly), LFM2's short conv with its window in place,
Qwen3.5 attention's output gate, the residual add inside the output projection's GEMM, and the KV
cache's slice write. T = 4,099: the blocks of tokens do not divide it.

Bounds: bf16 outputs 1e-2 (the references round at other places); the moved conv windows and
cache slots exactly; g and beta (float32) 1e-5.
"""

import itertools

import pytest
import torch

from conftest import poison_empty
from labkit.bench.ops import rel_err
from labkit.bench.prefill_profile import GDN_SWEEP
from labkit.ops import prefill_fusions as pf
from labkit.ops.mixers import (gdn_inputs_ref, output_gate_ref, project_ref, short_conv_ref, store_kv_ref,
                               store_kv_slice)

T = 4099


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    poison_empty(monkeypatch, pf)


def _randn(*shape, seed, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=gen, device="cuda")).to(torch.bfloat16)


@pytest.mark.heavy(seconds=30)
def test_gdn_inputs_for_every_launch_setting(real_model):
    layer = next(b.mixer for b in real_model("qwen3.5-0.8b").layers if b.kind == "gdn")
    dims = layer.dims
    proj = _randn(1, T, dims.proj_dim, seed=1)
    state = _randn(1, layer.conv_weight.shape[1] - 1, dims.conv_dim, seed=2)
    rest = (layer.conv_weight, layer.A_log, layer.dt_bias, dims)
    want = gdn_inputs_ref(proj, state, *rest)
    base = None
    for values in itertools.product(*GDN_SWEEP.values()):
        settings = dict(zip(GDN_SWEEP, values))
        window = state.clone()
        got = pf.gdn_inputs(proj, window, *rest, update_state=True, **settings)
        assert got[6] is window and torch.equal(window, want[6]), settings
        for name, a, b in zip("qkv", got[:3], want[:3]):
            assert rel_err(a.float(), b.float()) < 1e-2, (name, settings)
        assert rel_err(got[3], want[3]) < 1e-5 and rel_err(got[4], want[4]) < 1e-5, settings
        base = base or got[:5]
        assert all(torch.equal(a, b) for a, b in zip(got[:5], base)), settings


def test_short_conv_output_gate_residual_gemm_and_kv_slices(real_model):
    lfm2, qwen = real_model("lfm2-350m"), real_model("qwen3.5-0.8b")
    conv = next(b.mixer for b in lfm2.layers if b.kind == "conv")
    H, KW = lfm2.cfg.hidden_size, conv.conv_weight.shape[1]
    proj, state = _randn(1, T, 3 * H, seed=3), _randn(1, KW - 1, H, seed=4)
    y_ref, window_ref = short_conv_ref(proj, state, conv.conv_weight)
    window = state.clone()
    y, new = pf.short_conv_prefill(proj, window, conv.conv_weight, update_state=True)
    assert new is window and torch.equal(window, window_ref) and rel_err(y, y_ref) < 1e-2

    cfg = qwen.cfg
    o = _randn(1, cfg.num_heads, T, cfg.head_dim, seed=5).transpose(1, 2)  # the attention core's layout
    gate = _randn(1, T, cfg.num_heads * cfg.head_dim + 8, seed=6, scale=3.0)[..., 8:].reshape(o.shape)  # a view
    assert rel_err(pf.sigmoid_gate_rows(o, gate), output_gate_ref(o, gate)) < 1e-3

    mlp = qwen.layers[0].mlp
    x, h = _randn(1, T, cfg.intermediate_size, seed=7), _randn(1, T, cfg.hidden_size, seed=8)
    want = project_ref(x, mlp.down, h)
    assert rel_err(pf.project_residual(x, mlp.down, h), want) < 1e-2

    nkv, hd, L = cfg.num_kv_heads, cfg.head_dim, T + 37
    k, v = _randn(1, T, nkv, hd, seed=9), _randn(1, T, nkv, hd, seed=10)
    for start in (0, 37):
        positions = (start + torch.arange(T, device="cuda"))[None]
        bufs = [torch.full((1, nkv, L, hd), 7.0, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        slots = torch.arange(L, device="cuda")[None]
        assert torch.equal(store_kv_slice(bufs[0], bufs[1], k, v, positions, start=start, key_positions=slots),
                           store_kv_ref(bufs[2], bufs[3], k, v, positions))
        assert torch.equal(bufs[0], bufs[2]) and torch.equal(bufs[1], bufs[3])
