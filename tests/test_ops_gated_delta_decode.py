"""Gated DeltaNet decode step (labkit.ops.gated_delta_decode) against the reference layer maths.

The state and everything before the output norm is float32 in both; the output is rounded once
to the activation dtype in both. Bounds: 1e-5 for the float32 state and outputs, 1e-2 for a
bfloat16 output.
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops.gated_delta_decode import GdnDims, GdnWorkspace, gdn_decode, gdn_decode_ref

BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _data(batch, dims, taps, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(batch, dims.proj_dim, generator=g)
    conv_state = torch.randn(batch, taps - 1, dims.conv_dim, generator=g)
    conv_weight = torch.randn(dims.conv_dim, taps, generator=g) * 0.5
    A_log = torch.rand(dims.num_v_heads, generator=g) * 2
    dt_bias = torch.randn(dims.num_v_heads, generator=g)
    norm_weight = 1 + 0.1 * torch.randn(dims.v_head_dim, generator=g)
    state = torch.randn(batch, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, generator=g)
    low = [t.to(dtype=dtype, device=device) for t in (proj, conv_state, conv_weight, A_log, dt_bias, norm_weight)]
    return (*low, state.to(device))


# (dims, block_v): one program per head; value columns split in blocks of 8 (an uneven last
# block of 24 columns: the output norm goes through the scratch + last-arriver path) with two value
# heads per key head (the q/k conv state is shared); a head dim that is not a power of two.
CASES = [
    (GdnDims(2, 4, 16, 24), None),
    (GdnDims(2, 4, 16, 24), 16),
    (GdnDims(1, 1, 32, 40), 8),
    (GdnDims(3, 3, 24, 16), None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dims,block_v", CASES)
def test_matches_reference(batch, dims, block_v, dtype, device):
    proj, conv_state, conv_weight, A_log, dt_bias, norm_weight, state = _data(batch, dims, 4, dtype, device)
    out_ref, conv_ref, state_ref = gdn_decode_ref(proj, conv_state, conv_weight, A_log, dt_bias, norm_weight, state, dims, 1e-6)
    out = torch.full((batch, dims.value_dim), float("nan"), dtype=dtype, device=device)
    gdn_decode(proj, conv_state, conv_weight, A_log, dt_bias, norm_weight, state, dims, 1e-6, out=out, block_v=block_v)
    assert rel_err(out, out_ref) < BOUND[dtype]
    assert torch.equal(conv_state, conv_ref)
    assert rel_err(state, state_ref) < 1e-5


def test_steps_chain_with_one_workspace(device):
    """Counters return to zero, so a reused workspace serves step after step (as in a CUDA graph)."""
    dims = GdnDims(2, 4, 16, 24)
    proj, conv_state, conv_weight, A_log, dt_bias, norm_weight, state = _data(2, dims, 3, torch.float32, device, seed=1)
    ws = GdnWorkspace.allocate(2, dims, device)
    ref_conv, ref_state = conv_state.clone(), state.clone()
    for t in range(3):
        step = torch.randn(2, dims.proj_dim, generator=torch.Generator().manual_seed(10 + t)).to(device)
        out_ref, ref_conv, ref_state = gdn_decode_ref(step, ref_conv, conv_weight, A_log, dt_bias, norm_weight, ref_state, dims, 1e-6)
        out = gdn_decode(step, conv_state, conv_weight, A_log, dt_bias, norm_weight, state, dims, 1e-6, workspace=ws, block_v=8)
        assert rel_err(out, out_ref) < 1e-5
        assert int(ws.qk_counters.abs().sum()) == 0 and int(ws.o_counters.abs().sum()) == 0
    assert torch.equal(conv_state, ref_conv)
    assert rel_err(state, ref_state) < 1e-5


def test_bad_inputs_are_refused(device):
    dims = GdnDims(2, 4, 16, 24)
    args = list(_data(1, dims, 4, torch.float32, device))
    with pytest.raises(TypeError, match="state must have dtype torch.float32"):
        gdn_decode(*args[:6], args[6].bfloat16(), dims, 1e-6)
    with pytest.raises(ValueError, match="proj must have shape"):
        gdn_decode(args[0][:, :-1].contiguous(), *args[1:], dims, 1e-6)
    with pytest.raises(ValueError, match="num_v_heads must be a multiple"):
        gdn_decode(*args, GdnDims(3, 4, 16, 24), 1e-6)
    with pytest.raises(ValueError, match="conv_state must have shape"):
        gdn_decode(args[0], args[1][:, :2].contiguous(), *args[2:], dims, 1e-6)
    with pytest.raises(ValueError, match="workspace.qk_counters must have shape"):
        gdn_decode(*args, dims, 1e-6, workspace=GdnWorkspace.allocate(2, dims, device))
    with pytest.raises(ValueError, match="eps"):
        gdn_decode(*args, dims, -1.0)


def test_block_v_follows_the_h200_measurement(monkeypatch):
    """On a GPU (not in the interpreter): 16 state columns per program where 32 would leave fewer
    than ~2 programs per SM, else 32; never more than the (power-of-two padded) head."""
    import labkit.ops.gated_delta_decode as gdd

    monkeypatch.setattr(gdd, "interpreting", lambda: False)
    monkeypatch.setattr(gdd, "num_sms", lambda: 132)
    qwen = GdnDims(16, 16, 128, 128)
    assert gdd.gdn_block_v(1, qwen) == 16  # 64 programs of 32 columns: too few
    assert gdd.gdn_block_v(16, qwen) == 32  # 1,024 programs of 32 columns
    assert gdd.gdn_block_v(64, GdnDims(2, 2, 8, 12)) == 16  # a head of 12 columns, padded to 16
    assert gdd.gdn_block_v(1, GdnDims(2, 2, 8, 8)) == 8
