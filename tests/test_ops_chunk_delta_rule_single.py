"""The single-chunk path of the chunked delta rule (``_single_chunk_kernel``: every sequence at most
64 tokens, the whole call in one launch) against the step-by-step recurrence, and when
chunk_delta_rule picks it.

As in tests/test_ops_chunk_delta_rule.py: outputs, final states and checkpoints are poisoned with
NaN before the kernel runs (an element it fails to write fails the comparison); the bounds are 1e-5
for float32 inputs and 1e-2 for bfloat16 inputs (bf16 operands in the products, o stored in bf16).
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops import chunk_delta_rule as cdr
from labkit.ops.chunk_delta_rule import chunk_delta_rule, num_checkpoints, use_single_chunk
from labkit.ops.delta_rule import delta_rule_recurrent_ref
from test_ops_chunk_delta_rule import BOUND, _inputs, _poisoned, _ref_packed

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def _run(q, k, v, g, beta, state, ckpt_rows=None, **kw):
    """The kernel with poisoned outputs (and checkpoints when ckpt_rows is given)."""
    B, T, Hv, V = v.shape
    N = B if kw.get("cu_seqlens") is None else kw["cu_seqlens"].numel() - 1
    out = _poisoned(B, T, Hv, V, dtype=v.dtype, device=v.device)
    final = _poisoned(N, Hv, k.shape[-1], V, device=v.device)
    if ckpt_rows is not None:
        kw.update(checkpoints=_poisoned(ckpt_rows, Hv, k.shape[-1], V, device=v.device), checkpoint_every=64)
    o, s = chunk_delta_rule(q, k, v, g, beta, state, out=out, final_state=final, **kw)
    assert o is out and s is final
    assert not o.isnan().any() and not s.isnan().any()
    return o, s, kw.get("checkpoints")


@pytest.fixture
def single_calls(monkeypatch):
    """Counts the calls that go through the single-chunk launcher (on a GPU of 132 SMs)."""
    calls = []
    launch = cdr._single_chunk

    def counted(*args, **kw):
        calls.append(args)
        return launch(*args, **kw)

    monkeypatch.setattr(cdr, "_single_chunk", counted)
    monkeypatch.setattr(cdr, "num_sms", lambda: 132)
    return calls


# batch 3, two value heads per key head, head dims that are not powers of two
@pytest.mark.parametrize("with_state", [True, False], ids=["state", "zero"])
@DTYPES
@pytest.mark.parametrize("T", [1, 5, 37, 64])
def test_matches_recurrence(T, dtype, with_state, device, single_calls):
    q, k, v, g, beta, state = _inputs(3, T, 1, 2, 16, 24, seed=100 + T, dtype=dtype, device=device)
    state = state if with_state else None
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s, _ = _run(q, k, v, g, beta, state)  # auto: 3 sequences x 2 heads, all <= 64 tokens
    assert len(single_calls) == 1
    assert o.dtype == dtype
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


@DTYPES
@pytest.mark.parametrize("lengths", [[1, 64, 17], [5, 0, 64, 37, 64]])
def test_packed_sequences_with_checkpoints(lengths, dtype, device, single_calls, scrambled_grid):
    """Varlen packing (a sequence of no tokens keeps its initial state); a 64-token sequence is
    exactly one checkpoint of every 64 tokens, in the multi-kernel path's row order. The grid runs
    backwards and shuffled: a shorter sequence must not store a checkpoint into the next one's row
    (in order the next one would overwrite it and hide the race)."""
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=7, dtype=dtype, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(8)).to(device)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).to(device)
    rows = num_checkpoints(lengths, 64)
    o, s, ckpt = _run(q, k, v, g, beta, state, ckpt_rows=rows, cu_seqlens=cu)
    assert len(single_calls) == 1
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    assert rel_err(o, o_ref) < BOUND[dtype] and rel_err(s, s_ref) < BOUND[dtype]
    assert rows == lengths.count(64) and not ckpt.isnan().any()
    assert torch.equal(ckpt, s[[i for i, n in enumerate(lengths) if n == 64]])
    if 0 in lengths:
        assert torch.equal(s[lengths.index(0)], state[lengths.index(0)])
    # the same call through the multi-kernel path writes the same checkpoints
    _, _, ckpt_multi = _run(q, k, v, g, beta, state, ckpt_rows=rows, cu_seqlens=cu, single_chunk=False)
    assert rel_err(ckpt, ckpt_multi) < BOUND[dtype]


@DTYPES
def test_grouped_heads_in_value_blocks(dtype, device):
    """Three value heads per key head, 40 value columns in three blocks of 16, no initial state."""
    q, k, v, g, beta, _ = _inputs(2, 50, 1, 3, 16, 40, seed=9, dtype=dtype, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta)
    o, s, _ = _run(q, k, v, g, beta, None, single_chunk=True, single_block_v=16, single_warps=2)
    assert rel_err(o, o_ref) < BOUND[dtype] and rel_err(s, s_ref) < BOUND[dtype]


# two and three key heads, each read by three or two value heads (a wrong key-head index reads
# another head's keys); packed, with an empty sequence and odd head dims
@pytest.mark.parametrize("Hk,Hv,dtype", [(2, 6, torch.float32), (3, 6, torch.bfloat16)], ids=["2x3-fp32", "3x2-bf16"])
def test_several_key_heads(Hk, Hv, dtype, device, single_calls):
    lengths = [5, 64, 0, 17]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), Hk, Hv, 20, 24, seed=10 * Hk + Hv, dtype=dtype, device=device)
    state = torch.randn(len(lengths), Hv, 20, 24, generator=torch.Generator().manual_seed(Hk)).to(device)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).to(device)
    o, s, _ = _run(q, k, v, g, beta, state, cu_seqlens=cu)
    assert len(single_calls) == 1
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    assert rel_err(o, o_ref) < BOUND[dtype] and rel_err(s, s_ref) < BOUND[dtype]


def test_repeated_keys_keep_the_solve_exact(device):
    """The same key over the whole chunk, beta near 1, no decay: the hardest triangular system."""
    q, k, v, g, beta, state = _inputs(1, 64, 1, 1, 16, 16, seed=10, device=device)
    k = k[:, :1].expand(-1, 64, -1, -1).contiguous()
    g, beta = torch.zeros_like(g), torch.full_like(beta, 0.99)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s, _ = _run(q, k, v, g, beta, state, single_chunk=True)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def test_strong_decays_past_a_short_sequence_overflow_nothing(device):
    """Log-decays of -10 a token (a cumulative -370 by the end): the padding rows past the
    sequence's end must not form exp(+370) (the interpreter raises on the overflow here)."""
    import warnings

    q, k, v, g, beta, state = _inputs(1, 37, 1, 2, 16, 16, seed=14, device=device)
    g = torch.full_like(g, -10.0)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        o, s, _ = _run(q, k, v, g, beta, state, single_chunk=True)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def test_final_state_can_update_the_initial_state_in_place(device):
    q, k, v, g, beta, state = _inputs(2, 40, 1, 2, 16, 16, seed=11, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    s = state.clone()
    o, s_out = chunk_delta_rule(q, k, v, g, beta, s, final_state=s, out=_poisoned(*v.shape, device=device),
                                single_chunk=True)
    assert s_out is s
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def test_auto_takes_the_single_path_only_where_it_fits(device, single_calls, monkeypatch):
    q, k, v, g, beta, state = _inputs(1, 65 + 64, 1, 2, 16, 16, seed=12, device=device)
    a = dict(q=q, k=k, v=v, g=g, beta=beta)

    def call(lengths, **kw):
        cu = torch.tensor([0] + lengths).cumsum(0).to(device)
        n = sum(lengths)
        x = {name: t[:, :n].contiguous() for name, t in a.items()}
        o, s = chunk_delta_rule(**x, cu_seqlens=cu, **kw)
        o_ref, s_ref = _ref_packed(*x.values(), None, lengths)
        assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5
        return len(single_calls)

    assert call([64, 1, 1]) == 1  # all one chunk, 3 x 2 <= 132 programs
    assert call([65, 64]) == 1  # a 65-token sequence: two chunks, the multi-kernel path
    assert call([64, 1], block_v=16, num_warps=2) == 2  # the other path's settings leave the choice alone
    assert call([64, 1], single_chunk=False) == 2
    assert call([64, 1], single_chunk=True) == 3
    monkeypatch.setattr(cdr, "num_sms", lambda: 5)
    assert call([3, 4, 5]) == 3  # 3 sequences x 2 heads > 5 SMs
    assert call([3, 4]) == 4  # 4 <= 5


def test_auto_choice_at_the_real_shapes(monkeypatch):
    monkeypatch.setattr(cdr, "num_sms", lambda: 132)
    assert use_single_chunk([64], 1, 16, 64) and use_single_chunk([1], 1, 16, 1)
    assert use_single_chunk([64] * 8, 8, 16, 512)  # 128 programs
    assert not use_single_chunk([64] * 9, 9, 16, 576)  # 144 > 132
    assert not use_single_chunk([65], 1, 16, 65) and not use_single_chunk([64, 65, 1], 3, 16, 130)
    assert use_single_chunk([0, 0], 2, 16, 0)
    # while a CUDA graph is captured (no lengths): only when all the tokens fit one chunk
    assert use_single_chunk(None, 4, 16, 64) and not use_single_chunk(None, 2, 16, 65)


def test_forcing_a_long_sequence_is_refused(device):
    q, k, v, g, beta, state = _inputs(1, 66, 1, 2, 16, 16, seed=13, device=device)
    cu = torch.tensor([0, 1, 66], device=device)
    with pytest.raises(ValueError, match=r"single_chunk=True needs every sequence to be at most one chunk "
                                         r"\(64 tokens\) long; the longest here has 65 tokens"):
        chunk_delta_rule(q, k, v, g, beta, None, cu_seqlens=cu, single_chunk=True)
    with pytest.raises(ValueError, match="the longest here has 66 tokens"):
        chunk_delta_rule(q, k, v, g, beta, state[:1], single_chunk=True)


def test_forcing_under_capture_needs_a_total_of_one_chunk(device, monkeypatch):
    # while a CUDA graph is captured cu_seqlens is not read back (_host_lengths gives None): forcing
    # the single path is refused unless the tokens together fit one chunk, which bounds every sequence
    q, k, v, g, beta, _ = _inputs(1, 66, 1, 2, 16, 16, seed=14, device=device)
    monkeypatch.setattr(cdr, "_host_lengths", lambda cu, tokens: None)
    with pytest.raises(ValueError, match=r"under CUDA-graph capture needs at most 64 tokens in all .* got 66"):
        chunk_delta_rule(q, k, v, g, beta, None, cu_seqlens=torch.tensor([0, 1, 66], device=device), single_chunk=True)
    with pytest.raises(ValueError, match="single_block_v must be a power of two >= 16"):
        chunk_delta_rule(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], None, single_block_v=24)
    with pytest.raises(ValueError, match="single_warps must be a power of two"):
        chunk_delta_rule(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], None, single_warps=3)
    with pytest.raises(ValueError, match="single_chunk must be True, False or None"):
        chunk_delta_rule(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], None, single_chunk="yes")
