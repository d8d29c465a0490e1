"""GQA decode attention over the static cache (labkit.ops.attention_decode) against the reference.

Bounds: float32 1e-5; bfloat16 1e-2 (the kernel keeps the softmax and the output gate in float32
where the reference rounds them).
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops.attention_decode import AttentionDims, AttentionWorkspace, attention_decode, attention_decode_ref
from labkit.ops.rope import rope_inv_freq

BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
LFM2_LIKE = AttentionDims(6, 2, 16, 16, output_gate=False)  # tiny-lfm2: G = 3, full rotary
QWEN_LIKE = AttentionDims(4, 2, 32, 8, output_gate=True)  # tiny-qwen3.5: partial rotary, gate


def _data(batch, dims, max_len, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(batch, dims.proj_dim, generator=g)
    keys = torch.randn(batch, dims.num_kv_heads, max_len, dims.head_dim, generator=g)
    values = torch.randn(batch, dims.num_kv_heads, max_len, dims.head_dim, generator=g)
    q_norm = 1 + 0.1 * torch.randn(dims.head_dim, generator=g)
    k_norm = 0.1 * torch.randn(dims.head_dim, generator=g)
    low = [t.to(dtype=dtype, device=device) for t in (proj, q_norm, k_norm, keys, values)]
    return low[0], low[1], low[2], rope_inv_freq(dims.rotary_dim, 1e4, device=device), low[3], low[4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dims,unit", [(LFM2_LIKE, False), (QWEN_LIKE, True)])
@pytest.mark.parametrize("lengths,chunk", [([5], None), ([0, 36, 17], None), ([36, 0, 21], 16), ([50], 16),
                                           ([16], 16), ([32, 5], 16)])
def test_matches_reference_and_writes_the_cache(lengths, chunk, dims, unit, dtype, device):
    """Lengths 0 (first token), max_len - 1 (last slot); chunk 16 merges several chunks' partials;
    lengths that are an exact multiple of the chunk (16, 32): the new token belongs to the next
    chunk only, not also to the one that ends before it."""
    proj, q_norm, k_norm, inv_freq, keys, values = _data(len(lengths), dims, 51 if max(lengths) == 50 else 37, dtype, device)
    given = lengths
    lengths = torch.tensor(lengths, dtype=torch.int32, device=device)
    out_ref, keys_ref, values_ref = attention_decode_ref(proj, q_norm, k_norm, inv_freq, keys, values, lengths, dims, 1e-5, unit)
    out = torch.full_like(out_ref, float("nan"))
    attention_decode(proj, q_norm, k_norm, inv_freq, keys, values, lengths, dims, 1e-5, unit, out=out, chunk=chunk)
    assert rel_err(out, out_ref) < BOUND[dtype]
    assert rel_err(keys, keys_ref) < 1e-6 and torch.equal(values, values_ref)
    assert lengths.tolist() == given  # advancing lengths is the caller's job, once per step


def test_counters_return_to_zero(device):
    proj, q_norm, k_norm, inv_freq, keys, values = _data(2, QWEN_LIKE, 40, torch.float32, device)
    lengths = torch.tensor([39, 20], dtype=torch.int32, device=device)
    ws = AttentionWorkspace.allocate(2, QWEN_LIKE, 3, device)
    a = attention_decode(proj, q_norm, k_norm, inv_freq, keys, values, lengths, QWEN_LIKE, 1e-5, True, workspace=ws, chunk=16)
    assert int(ws.counters.abs().sum()) == 0
    b = attention_decode(proj, q_norm, k_norm, inv_freq, keys, values, lengths, QWEN_LIKE, 1e-5, True, workspace=ws, chunk=16)
    assert torch.equal(a, b)


def test_bad_inputs_are_refused(device):
    proj, q_norm, k_norm, inv_freq, keys, values = _data(1, QWEN_LIKE, 20, torch.float32, device)
    lengths = torch.zeros(1, dtype=torch.int32, device=device)
    args = (proj, q_norm, k_norm, inv_freq, keys, values, lengths, QWEN_LIKE, 1e-5, True)
    with pytest.raises(TypeError, match="lengths must have dtype torch.int32"):
        attention_decode(*args[:6], lengths.long(), *args[7:])
    with pytest.raises(ValueError, match="proj must have shape"):
        attention_decode(proj, *args[1:7], LFM2_LIKE, 1e-5, True)
    with pytest.raises(ValueError, match="values must have shape"):
        attention_decode(*args[:5], values[:, :, :10].contiguous(), *args[6:])
    with pytest.raises(ValueError, match="keys must be contiguous"):
        attention_decode(*args[:4], keys.transpose(1, 2).contiguous().transpose(1, 2), *args[5:])
    with pytest.raises(TypeError, match="inv_freq must have dtype"):
        attention_decode(*args[:3], inv_freq.double(), *args[4:])
    with pytest.raises(ValueError, match="block_s"):
        attention_decode(*args, chunk=24, block_s=16)
    with pytest.raises(ValueError, match="workspace too small"):
        attention_decode(*args, chunk=16, workspace=AttentionWorkspace.allocate(1, QWEN_LIKE, 1, device))
