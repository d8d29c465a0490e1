"""Final norm + LM head + argmax without logits (labkit.ops.greedy_head)."""

import math

import pytest
import torch

from labkit.ops.greedy_head import GreedyHeadBuffers, greedy_head, greedy_head_ref
from labkit.ops.linear import LinearConfig, linear


def _data(m, v, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(v, k, generator=g) / math.sqrt(k)
    norm = torch.randn(k, generator=g) * 0.1
    return [t.to(dtype=dtype, device=device) for t in (x, w, norm)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,config", [(1, LinearConfig(1, 16, 32)), (3, LinearConfig(16, 32, 64)), (3, None)])
def test_token_is_the_argmax_of_the_logits(m, config, dtype, device):
    x, w, norm = _data(m, 263, 72, dtype, device)
    logits = torch.full((m, 263), float("nan"), dtype=dtype, device=device)
    tokens = torch.full((m,), -1, dtype=torch.long, device=device)
    got = greedy_head(x, w, norm_weight=norm, norm_eps=1e-6, norm_unit_offset=True, logits_out=logits,
                      tokens_out=tokens, config=config)
    assert got.data_ptr() == tokens.data_ptr() and got.dtype == torch.long
    # exactly torch.argmax of the logits the same stream writes
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(logits, linear(x, w, norm_weight=norm, norm_eps=1e-6, norm_unit_offset=True, config=config))
    # and the reference's choice, up to bf16 near-ties
    ref_logits = torch.nn.functional.linear(
        torch.nn.functional.rms_norm(x.float(), (72,), 1.0 + norm.float(), 1e-6), w.float()
    )
    top = ref_logits.max(-1).values
    picked = ref_logits.gather(1, tokens[:, None])[:, 0]
    assert bool((picked >= top - (1e-5 if dtype == torch.float32 else 2e-2) * top.abs()).all())
    if dtype == torch.float32:
        assert torch.equal(tokens, greedy_head_ref(x, w, norm_weight=norm, norm_eps=1e-6, norm_unit_offset=True))


def test_ties_pick_the_first_index_across_tiles(device):
    x, w, _ = _data(2, 70, 32, torch.float32, device, seed=1)
    w[65] = w[3] = w[40] * 1.0  # the same row three times, in different 16-row tiles
    x[0] = w[40] * 50  # makes row 40's direction the clear winner for sequence 0
    tokens = greedy_head(x, w, config=LinearConfig(1, 16, 32))
    assert int(tokens[0]) == 3
    assert torch.equal(tokens, greedy_head_ref(x, w))


def test_buffers_are_checked(device):
    x, w, _ = _data(1, 100, 32, torch.float32, device)
    cfg = LinearConfig(1, 16, 32)
    wrong = GreedyHeadBuffers.allocate(1, 100, LinearConfig(1, 32, 32), device)
    with pytest.raises(ValueError, match="best_val must have shape"):
        greedy_head(x, w, config=cfg, buffers=wrong)
    with pytest.raises(ValueError, match="tokens_out must have shape"):
        greedy_head(x, w, config=cfg, tokens_out=torch.empty(2, dtype=torch.long, device=device))
    with pytest.raises(TypeError, match="tokens_out must have dtype"):
        greedy_head(x, w, config=cfg, tokens_out=torch.empty(1, dtype=torch.int32, device=device))
