"""A hit tail's attention (labkit.ops.tail_attention.attend_tail) against the attention core's
reference (attend_ref, the mask over the whole key buffer), on irregular shapes: batch 3, grouped
heads, head dims that are not powers of two, rows of queries across several blocks, the keys cut
in several splits (whole blocks, the last one partial), keys in the buffer past the last query's
position (never seen). Every buffer the op allocates is poisoned with NaN first."""

import pytest
import torch

from conftest import poison_empty, rel_err
from labkit.ops import tail_attention as ta
from labkit.ops.mixers import attend_continuing, attend_ref

BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _case(B, nh, nkv, D, T, start, L, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, nh, D, generator=gen).to(dtype=dtype, device=device).transpose(1, 2)  # the mixer's view
    keys = torch.randn(B, nkv, L, D, generator=gen).to(dtype=dtype, device=device)
    values = torch.randn(B, nkv, L, D, generator=gen).to(dtype=dtype, device=device)
    positions = (start + torch.arange(T)).expand(B, T).to(device)
    key_positions = torch.arange(L).expand(B, L).to(device)
    return q, keys, values, positions, key_positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", [
    dict(B=3, nh=6, nkv=2, D=40, T=5, start=37, L=50, splits=3),   # 15 rows, keys in 3 splits of 64 (42 used)
    dict(B=1, nh=8, nkv=2, D=24, T=21, start=150, L=200, splits=2),  # 84 rows: two row blocks
    dict(B=2, nh=3, nkv=3, D=20, T=1, start=1, L=9, splits=None),   # one query, one cached key
    dict(B=1, nh=4, nkv=1, D=80, T=3, start=20, L=30, splits=2),    # the merge in two column blocks
], ids=["batch3-g3", "two-row-blocks", "one-token", "wide-head"])
def test_matches_the_reference(dtype, shape, device, monkeypatch):
    poison_empty(monkeypatch, ta)
    shape = dict(shape)
    splits = shape.pop("splits")
    q, keys, values, positions, key_positions = _case(**shape, dtype=dtype, device=device)
    want = attend_ref(q, keys, values, positions, key_positions)
    got = ta.attend_tail(q, keys, values, positions, key_positions, start=shape["start"], splits=splits)
    assert got.shape == want.shape and got.dtype == dtype
    assert rel_err(got, want) < BOUND[dtype]  # NaN (an element not written) fails
    same = attend_continuing(q, keys, values, positions, key_positions, start=shape["start"])
    assert rel_err(got, same) < BOUND[dtype]


def test_bad_input_is_refused(device):
    q, keys, values, positions, key_positions = _case(1, 4, 2, 16, 3, 5, 10, torch.float32, device)
    with pytest.raises(ValueError, match="start >= 1"):
        ta.attend_tail(q, keys, values, positions, key_positions, start=0)
    with pytest.raises(ValueError, match="at least start \\+ T = 11"):
        ta.attend_tail(q, keys, values, positions, key_positions, start=8)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        ta.attend_tail(q[:, :3], keys, values, positions, key_positions, start=5)
    with pytest.raises(ValueError, match="1..64 new tokens"):
        big = _case(1, 4, 2, 16, 65, 5, 80, torch.float32, device)
        ta.attend_tail(*big, start=5)
    with pytest.raises(TypeError):
        ta.attend_tail(q.double(), keys, values, positions, key_positions, start=5)
    with pytest.raises(ValueError, match="splits must be a positive integer"):
        ta.attend_tail(q, keys, values, positions, key_positions, start=5, splits=0)
