"""The chunked gated delta rule equals the step-by-step recurrence, on irregular lengths."""

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from labkit.ops.delta_rule import delta_rule_chunked_ref, delta_rule_recurrent_ref


def _inputs(B, T, Hk, Hv, K, V, seed):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    v = torch.randn(B, T, Hv, V, generator=gen)
    g = -F.softplus(torch.randn(B, T, Hv, generator=gen)) * 0.5  # log-decays <= 0
    beta = torch.rand(B, T, Hv, generator=gen)
    state = torch.randn(B, Hv, K, V, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T", [1, 63, 64, 65, 200])
def test_chunked_equals_recurrent(T):
    q, k, v, g, beta, state = _inputs(3, T, 2, 4, 16, 24, seed=T)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s = delta_rule_chunked_ref(q, k, v, g, beta, state)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


def test_chunk_size_does_not_change_the_result():
    q, k, v, g, beta, state = _inputs(2, 100, 2, 2, 8, 8, seed=7)
    o16, s16 = delta_rule_chunked_ref(q, k, v, g, beta, state, chunk_size=16)
    o64, s64 = delta_rule_chunked_ref(q, k, v, g, beta, state, chunk_size=64)
    assert rel_err(o16, o64) < 1e-5 and rel_err(s16, s64) < 1e-5


def test_split_sequence_continues_from_the_state():
    """Prefill in two pieces == one piece: the state carries everything across the cut."""
    q, k, v, g, beta, _ = _inputs(1, 130, 2, 2, 16, 16, seed=11)
    o_all, s_all = delta_rule_chunked_ref(q, k, v, g, beta)
    o1, s1 = delta_rule_chunked_ref(q[:, :77], k[:, :77], v[:, :77], g[:, :77], beta[:, :77])
    o2, s2 = delta_rule_chunked_ref(q[:, 77:], k[:, 77:], v[:, 77:], g[:, 77:], beta[:, 77:], s1)
    assert rel_err(torch.cat([o1, o2], 1), o_all) < 1e-5
    assert rel_err(s2, s_all) < 1e-5


def test_one_step_by_hand():
    """beta = 1, no decay, unit k: the value at k is replaced by v exactly."""
    K = V = 4
    k = torch.zeros(1, 1, 1, K)
    k[..., 2] = 1.0
    v = torch.arange(V, dtype=torch.float32).view(1, 1, 1, V)
    state = torch.randn(1, 1, K, V)
    _, s = delta_rule_recurrent_ref(k, k, v, torch.zeros(1, 1, 1), torch.ones(1, 1, 1), state)
    assert torch.allclose(s[0, 0, 2], v.flatten())
    keep = [0, 1, 3]
    assert torch.equal(s[0, 0, keep], state[0, 0, keep])
