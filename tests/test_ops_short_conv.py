"""LFM2's short-conv decode step (labkit.ops.short_conv) against the reference conv.

The kernel performs the same roundings in the same order as the reference, so the bound is tight
for both dtypes.
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops.short_conv import short_conv_decode, short_conv_decode_ref


def _data(batch, hidden, taps, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(batch, 3 * hidden, generator=g)
    state = torch.randn(batch, taps - 1, hidden, generator=g)
    weight = torch.randn(hidden, taps, generator=g) * 0.5
    return [t.to(dtype=dtype, device=device) for t in (proj, state, weight)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("hidden,taps,block", [(96, 3, None), (80, 4, 32), (37, 2, 16)])
def test_matches_reference_and_shifts_state(batch, hidden, taps, block, dtype, device):
    proj, state, weight = _data(batch, hidden, taps, dtype, device)
    y_ref, state_ref = short_conv_decode_ref(proj, state, weight)
    out = torch.full((batch, hidden), float("nan"), dtype=dtype, device=device)
    short_conv_decode(proj, state, weight, out=out, block_h=block)
    assert rel_err(out, y_ref) < 1e-6
    assert torch.equal(state, state_ref)


def test_consecutive_steps_equal_a_prefill(device):
    """Three decode steps leave the same state and outputs as the conv over the three tokens."""
    from labkit.ops.causal_conv import causal_conv_ref

    proj, state, weight = _data(2, 40, 3, torch.float32, device, seed=1)
    steps = torch.randn(3, 2, 120, generator=torch.Generator().manual_seed(2)).to(device)
    b, c, x = steps.permute(1, 0, 2).chunk(3, dim=-1)
    y_all, state_all = causal_conv_ref(b * x, weight, state)
    ys = [short_conv_decode(steps[t].contiguous(), state, weight) for t in range(3)]
    assert rel_err(torch.stack(ys, 1), c * y_all) < 1e-6
    assert torch.allclose(state, state_all)


def test_bad_inputs_are_refused(device):
    proj, state, weight = _data(2, 16, 3, torch.float32, device)
    with pytest.raises(ValueError, match=r"\[B, 3H\]"):
        short_conv_decode(proj[:, :47].contiguous(), state, weight)
    with pytest.raises(ValueError, match="state must have shape"):
        short_conv_decode(proj, state[:, :1].contiguous(), weight)
    with pytest.raises(ValueError, match="at least 2 taps"):
        short_conv_decode(proj, state, weight[:, :1].contiguous())
    with pytest.raises(TypeError, match="out must have dtype"):
        short_conv_decode(proj, state, weight, out=torch.empty(2, 16, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="overlap"):
        short_conv_decode(proj, state, weight, out=proj.view(-1)[:32].view(2, 16))
