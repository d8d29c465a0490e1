"""Chunked gated delta rule prefill (labkit.ops.chunk_delta_rule) against the step-by-step recurrence.

Every output buffer (o, final state, checkpoints) is poisoned with NaN before the kernel runs, so
an element it fails to write fails the comparison. Bounds: 1e-5 for float32 inputs (every
product is exact float32 in the interpreter), 1e-2 for bfloat16 inputs (products take bf16
operands and W, U0, P and o are stored in bf16, as in fla; the interpreter rounds as a GPU does).
"""

import pytest
import torch
import torch.nn.functional as F

from conftest import poison_empty, rel_err
from labkit.ops import chunk_delta_rule as cdr
from labkit.ops.chunk_delta_rule import CHUNK, chunk_delta_rule, num_checkpoints
from labkit.ops.delta_rule import delta_rule_recurrent_ref
from labkit.ops.launch import cdiv

BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _inputs(B, T, Hk, Hv, K, V, seed, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, Hk, K, generator=gen), dim=-1)
    v = torch.randn(B, T, Hv, V, generator=gen)
    # log-decays from ~0 (a long memory) to about -3 (forgets within a few tokens)
    g = -F.softplus(2 * torch.randn(B, T, Hv, generator=gen) - 2)
    beta = torch.rand(B, T, Hv, generator=gen)
    state = torch.randn(B, Hv, K, V, generator=gen)
    low = [x.to(dtype=dtype, device=device) for x in (q, k, v)]
    return (*low, g.to(device), beta.to(device), state.to(device))


def _poisoned(*shape, dtype=torch.float32, device="cpu"):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _run(q, k, v, g, beta, state, **kw):
    """The kernel with poisoned outputs; cu_seqlens in kw means packed sequences."""
    B, T, Hv, V = v.shape
    N = B if kw.get("cu_seqlens") is None else kw["cu_seqlens"].numel() - 1
    out = _poisoned(B, T, Hv, V, dtype=v.dtype, device=v.device)
    final = _poisoned(N, Hv, k.shape[-1], V, device=v.device)
    o, s = chunk_delta_rule(q, k, v, g, beta, state, out=out, final_state=final, **kw)
    assert o is out and s is final
    return o, s


def _packed(lengths, Hv, K, V, seed, dtype, device):
    """Inputs of packed sequences (one key head, Hv value heads), their initial states and
    cu_seqlens."""
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, Hv, K, V, seed=seed, dtype=dtype, device=device)
    state = torch.randn(len(lengths), Hv, K, V, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    return q, k, v, g, beta, state, cu


def _ref_packed(q, k, v, g, beta, state, lengths):
    """The recurrence run on each packed sequence alone: (o [1, T, Hv, V], final states [N, ...])."""
    outs, finals, t = [], [], 0
    for i, n in enumerate(lengths):
        part = [x[:, t:t + n] for x in (q, k, v, g, beta)]
        s0 = None if state is None else state[i:i + 1]
        o, s = delta_rule_recurrent_ref(*part, s0)
        outs.append(o)
        finals.append(s)
        t += n
    return torch.cat(outs, 1), torch.cat(finals, 0)


# lengths 1 and 63 (inside one chunk), 100 (a partial second chunk), 200 (four chunks);
# batch 3 with 2 value heads per key head and head dims that are not powers of two
@pytest.mark.parametrize("T", [1, 63, 100, 200])
def test_matches_recurrence(T, device):
    q, k, v, g, beta, state = _inputs(3 if T < 200 else 1, T, 1, 2, 16, 24, seed=T, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s = _run(q, k, v, g, beta, state, single_chunk=False)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


def test_no_initial_state_and_grouped_heads(device):
    """Three value heads per key head, value columns in two blocks of 16, no initial state."""
    q, k, v, g, beta, _ = _inputs(2, 70, 1, 3, 16, 20, seed=5, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta)
    o, s = _run(q, k, v, g, beta, None, block_v=16)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


def test_bfloat16_inputs(device):
    q, k, v, g, beta, state = _inputs(1, 200, 1, 2, 32, 32, seed=3, dtype=torch.bfloat16, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g.bfloat16(), beta.bfloat16(), state)
    o, s = _run(q, k, v, g.bfloat16(), beta.bfloat16(), state)
    assert o.dtype == torch.bfloat16
    assert rel_err(o, o_ref) < BOUND[torch.bfloat16]
    assert rel_err(s, s_ref) < BOUND[torch.bfloat16]


def test_repeated_keys_keep_the_solve_exact(device):
    """The same key over a whole chunk (beta near 1, no decay): the triangular system is as far
    from the identity as it gets, where a power-series inverse would lose every digit."""
    q, k, v, g, beta, state = _inputs(1, 64, 1, 1, 16, 16, seed=8, device=device)
    k = k[:, :1].expand(-1, 64, -1, -1).contiguous()
    g = torch.zeros_like(g)
    beta = torch.full_like(beta, 0.99)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s = _run(q, k, v, g, beta, state, single_chunk=False)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


# a length-1 sequence, one of no tokens, one that is not a multiple of the chunk, one of exactly two
LENGTHS = [1, 70, 0, 128, 33]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_partial_chunks_with_other_settings(dtype, device):
    """Packed sequences with partial chunks (70 = 64 + 6, 33, 1) and an empty one, grouped heads, odd
    head dims, an initial state; every launch setting away from its default (narrower blocks, fewer
    warps, one pipeline stage): the settings change the blocking, never the result."""
    lengths = [70, 1, 0, 33]
    q, k, v, g, beta, state, cu = _packed(lengths, 2, 16, 24, 41, dtype, device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, block_v=16, num_warps=2, num_stages=1,
                prepare_warps=2, products_warps=2, output_block_v=16, output_warps=2)
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


# two and three key heads, each read by three or two value heads (a key-head index of hv % Hk or
# hv // Hk instead of hv // (Hv / Hk) reads the wrong keys); head dims that are not powers of two
@pytest.mark.parametrize("Hk,Hv,dtype", [(2, 6, torch.float32), (3, 6, torch.bfloat16)], ids=["2x3-fp32", "3x2-bf16"])
def test_several_key_heads(Hk, Hv, dtype, device):
    lengths = [70, 0, 33]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), Hk, Hv, 20, 24, seed=10 * Hk + Hv, dtype=dtype, device=device)
    state = torch.randn(len(lengths), Hv, 20, 24, generator=torch.Generator().manual_seed(Hk)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu)
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


class ProductsSpy:
    """Stands in for ``_products_kernel``: records each launch's grid, then launches."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(tuple(grid))
        return self.kernel[grid]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_products_together(dtype, device, monkeypatch):
    """W and U0 of a chunk by one program (products_together=True): packed sequences of odd lengths
    (70 = 64 + 6, 1, none, 33, 129 = 2 x 64 + 1), three value heads per key head, head dims that are
    not powers of two, an initial state; every buffer the op allocates (X, W, U0, the walk's) and
    its outputs poisoned with NaN, so that an element the one program fails to write fails. The
    same sums in the same order as one program each: the results equal the default's bit for bit,
    and the recurrence's within the bound; the launch had one program per chunk slot and head."""
    lengths = [70, 1, 0, 33, 129]
    q, k, v, g, beta, state, cu = _packed(lengths, 3, 20, 24, 45, dtype, device)
    poison_empty(monkeypatch, cdr)
    spy = ProductsSpy(cdr._products_kernel)
    monkeypatch.setattr(cdr, "_products_kernel", spy)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, products_together=True)
    slots = cdiv(sum(lengths), CHUNK) + len(lengths) - 1  # the bound on chunk slots of packed sequences
    assert spy.grids == [(slots, 3, 1)]
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    assert rel_err(o, o_ref) < BOUND[dtype]  # a NaN left (an element not written) fails
    assert rel_err(s, s_ref) < BOUND[dtype]
    o_split, s_split = _run(q, k, v, g, beta, state, cu_seqlens=cu, products_together=False)
    assert spy.grids[-1] == (slots, 3, 2)
    assert torch.equal(o, o_split) and torch.equal(s, s_split)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_x_stored_in_the_input_dtype(dtype, device, monkeypatch):
    """The solve's X in its own buffer in the inputs' dtype (x_in_input_dtype, the default) against
    float32 X stored over L: packed odd lengths, grouped heads, every buffer the op allocates
    poisoned (X's blocks above the diagonal are never stored in its own buffer: read unmasked, W and
    U0 pick up NaN). bf16: both within the recurrence's bound; float32 inputs keep float32 X, bit
    for bit."""
    lengths = [70, 1, 0, 33, 129]
    q, k, v, g, beta, state, cu = _packed(lengths, 3, 20, 24, 47, dtype, device)
    poison_empty(monkeypatch, cdr)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, x_in_input_dtype=True)
    o32, s32 = _run(q, k, v, g, beta, state, cu_seqlens=cu, x_in_input_dtype=False)
    for out, final in ((o, s), (o32, s32)):
        assert rel_err(out, o_ref) < BOUND[dtype]
        assert rel_err(final, s_ref) < BOUND[dtype]
    if dtype == torch.float32:
        assert torch.equal(o, o32) and torch.equal(s, s32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_inverse_in_tf32(dtype, device, monkeypatch):
    """The triangular inverse's block products in TF32 (inverse_tf32, the default) against full
    float32: packed odd lengths (a chunk of 70 = 64 + 6 rows: all six off-diagonal blocks), grouped
    heads, every buffer poisoned. bf16: both within the recurrence's bound (the TF32 operands cut to
    10 bits in the interpreter); float32 inputs keep the full-float32 inverse, bit for bit. The
    single-chunk kernel takes the flag too."""
    lengths = [70, 1, 0, 33, 129]
    q, k, v, g, beta, state, cu = _packed(lengths, 3, 20, 24, 49, dtype, device)
    poison_empty(monkeypatch, cdr)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    runs = [_run(q, k, v, g, beta, state, cu_seqlens=cu, inverse_tf32=flag) for flag in (True, False)]
    for out, final in runs:
        assert rel_err(out, o_ref) < BOUND[dtype]
        assert rel_err(final, s_ref) < BOUND[dtype]
    short = [64, 7, 33]
    q, k, v, g, beta, state, cu = _packed(short, 3, 20, 24, 51, dtype, device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, short)
    single = [_run(q, k, v, g, beta, state, cu_seqlens=cu, single_chunk=True, inverse_tf32=flag)
              for flag in (True, False)]
    for out, final in single:
        assert rel_err(out, o_ref) < BOUND[dtype]
        assert rel_err(final, s_ref) < BOUND[dtype]
    if dtype == torch.float32:
        for (o, s), (o32, s32) in (runs, single):
            assert torch.equal(o, o32) and torch.equal(s, s32)


def test_the_tf32_inverse_on_repeated_keys(device):
    """bf16 inputs whose every chunk repeats one key (beta 0.99, no decay): the triangular systems
    furthest from the identity. Their error comes from the bf16 products (here within the random
    inputs' bound; past it at K = V = 128, tests/gpu), with the full-float32 inverse too; the TF32
    inverse (operands cut to 10 bits in the interpreter, at most as exact as the GPU's) adds at most
    a quarter to it, and does change the result."""
    q, k, v, g, beta, state = _inputs(1, 192, 1, 1, 64, 64, seed=53, dtype=torch.bfloat16, device=device)
    k = k[:, ::64].repeat_interleave(64, dim=1).contiguous()
    g = torch.zeros_like(g)
    beta = torch.full_like(beta, 0.99)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    (o, s), (o32, s32) = [_run(q, k, v, g, beta, state, inverse_tf32=flag) for flag in (True, False)]
    errors = {"o": rel_err(o, o_ref), "s": rel_err(s, s_ref), "o32": rel_err(o32, o_ref), "s32": rel_err(s32, s_ref)}
    assert max(errors.values()) < 5 * BOUND[torch.bfloat16], errors
    assert errors["o"] <= 1.25 * errors["o32"] and errors["s"] <= 1.25 * errors["s32"], errors
    assert not torch.equal(o, o32)


def test_bad_settings_are_refused(device):
    q, k, v, g, beta, state = _inputs(1, 8, 1, 1, 16, 16, seed=1, device=device)
    a = (q, k, v, g, beta, state)
    for name, value, match in [("block_v", 24, "block_v must be a power of two >= 16, got 24"),
                               ("output_block_v", 8, "output_block_v must be a power of two >= 16, got 8"),
                               ("products_warps", 3, "products_warps must be a power of two >= 1, got 3"),
                               ("prepare_warps", 0, "prepare_warps must be a power of two >= 1, got 0"),
                               ("num_warps", None, "num_warps must be a power of two >= 1, got None"),
                               ("num_stages", 0, "num_stages must be a number of stages >= 1, got 0"),
                               ("products_together", 1, "products_together must be True or False, got 1"),
                               ("x_in_input_dtype", "yes", "x_in_input_dtype must be True or False, got 'yes'"),
                               ("inverse_tf32", None, "inverse_tf32 must be True or False, got None")]:
        with pytest.raises(ValueError, match=match):
            chunk_delta_rule(*a, **{name: value})
    with pytest.raises(TypeError, match="prepare"):  # the forms that measured slower are gone
        chunk_delta_rule(*a, prepare="fused")


def test_outputs_in_narrower_blocks_than_the_walk(device):
    """The walk stores chunk start states and deltas, a parallel kernel forms the outputs, here in
    value blocks narrower than the walk's; packed sequences, checkpoints."""
    lengths = [130, 1, 0, 64]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=43, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(44)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    ckpt = _poisoned(num_checkpoints(lengths, 64), 2, 16, 24, device=device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, output_block_v=16, checkpoints=ckpt, checkpoint_every=64)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5
    _, s64 = delta_rule_recurrent_ref(*(x[:, :64] for x in (q, k, v, g, beta)), state[:1])
    assert rel_err(ckpt[0], s64[0]) < 1e-5


def test_packed_sequences(device, scrambled_grid):
    """Packed sequences, the grid run backwards and shuffled: every (sequence, head, block) writes
    its own final state and outputs, whatever order the programs run in."""
    T = sum(LENGTHS)
    q, k, v, g, beta, _ = _inputs(1, T, 1, 2, 16, 24, seed=21, device=device)
    state = torch.randn(len(LENGTHS), 2, 16, 24, generator=torch.Generator().manual_seed(22)).to(device)
    cu = torch.tensor([0] + LENGTHS, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, LENGTHS)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, block_v=16)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5
    assert torch.equal(s[2], state[2])  # no tokens: the initial state comes back


@pytest.mark.parametrize("every", [64, 128])
def test_checkpoints_are_the_states_at_their_positions(every, device, scrambled_grid):
    """The grid run backwards and shuffled: a sequence whose last chunk is partial (130, 200) must
    not store that chunk's state as a checkpoint, whose row is the next sequence's first (in order,
    the next sequence would overwrite it and hide the race)."""
    lengths = [130, 1, 200, 64]
    T = sum(lengths)
    q, k, v, g, beta, _ = _inputs(1, T, 1, 1, 16, 16, seed=31, device=device)
    state = torch.randn(len(lengths), 1, 16, 16, generator=torch.Generator().manual_seed(32)).to(device)
    cu = torch.tensor([0] + lengths).cumsum(0).to(device)  # int64 offsets
    rows = num_checkpoints(lengths, every)
    ckpt = _poisoned(rows, 1, 16, 16, device=device)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt, checkpoint_every=every)
    expected, t = [], 0
    for i, n in enumerate(lengths):
        for pos in range(every, n + 1, every):
            _, s_pos = delta_rule_recurrent_ref(*(x[:, t:t + pos] for x in (q, k, v, g, beta)), state[i:i + 1])
            expected.append(s_pos)
        t += n
    assert len(expected) == rows > 0
    assert rel_err(ckpt, torch.cat(expected, 0)) < 1e-5
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def test_final_state_can_update_the_initial_state_in_place(device):
    q, k, v, g, beta, state = _inputs(2, 80, 1, 1, 16, 16, seed=51, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    s = state.clone()
    o, s_out = chunk_delta_rule(q, k, v, g, beta, s, final_state=s, out=_poisoned(*v.shape, device=device))
    assert s_out is s
    assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def _bad_args(device):
    q, k, v, g, beta, state = _inputs(1, 100, 1, 2, 16, 16, seed=61, device=device)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=state)


def test_bad_inputs_are_refused(device):
    a = _bad_args(device)
    with pytest.raises(TypeError, match="k must have dtype"):
        chunk_delta_rule(**{**a, "k": a["k"].bfloat16()})
    with pytest.raises(TypeError, match="initial_state must have dtype torch.float32"):
        chunk_delta_rule(**{**a, "initial_state": a["initial_state"].bfloat16()})
    with pytest.raises(ValueError, match="value heads .3. must be a multiple of the key heads .2."):
        chunk_delta_rule(**{**a, "q": a["q"].expand(-1, -1, 2, -1).contiguous(),
                            "k": a["k"].expand(-1, -1, 2, -1).contiguous(), "v": a["v"][:, :, :1].expand(-1, -1, 3, -1).contiguous(),
                            "g": a["g"][..., :1].expand(-1, -1, 3).contiguous(), "beta": a["beta"][..., :1].expand(-1, -1, 3).contiguous(),
                            "initial_state": None})
    with pytest.raises(ValueError, match="g must have shape"):
        chunk_delta_rule(**{**a, "g": a["g"][:, :99].contiguous()})
    with pytest.raises(ValueError, match="out must have shape"):
        chunk_delta_rule(**a, out=torch.empty(1, 100, 2, 8, device=device))
    with pytest.raises(ValueError, match="block_v must be a power of two >= 16"):
        chunk_delta_rule(**a, block_v=24)
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        chunk_delta_rule(**a, cu_seqlens=torch.tensor([0, 100], device="meta"))
    with pytest.raises(ValueError, match="must not overlap"):
        chunk_delta_rule(**a, out=a["v"])


def test_bad_packing_is_refused(device):
    a = _bad_args(device)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        chunk_delta_rule(**a, cu_seqlens=torch.tensor([0, 50, 100], device=device))
    a["initial_state"] = None
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to the number of tokens T = 100"):
        chunk_delta_rule(**a, cu_seqlens=torch.tensor([0, 60, 99], device=device))
    with pytest.raises(ValueError, match=r"cu_seqlens must rise"):
        chunk_delta_rule(**a, cu_seqlens=torch.tensor([0, 60, 40, 100], device=device))
    with pytest.raises(TypeError, match="cu_seqlens must have dtype"):
        chunk_delta_rule(**a, cu_seqlens=torch.tensor([0.0, 100.0], device=device))
    two = {**a, **{x: a[x].expand(2, -1, -1, -1).contiguous() for x in ("q", "k", "v")}}
    two.update(g=a["g"].expand(2, -1, -1).contiguous(), beta=a["beta"].expand(2, -1, -1).contiguous(),
               )
    with pytest.raises(ValueError, match="batch size 1"):
        chunk_delta_rule(**two, cu_seqlens=torch.tensor([0, 100], device=device))


def test_bad_checkpoints_are_refused(device):
    a = _bad_args(device)
    cu = torch.tensor([0, 70, 100], device=device)
    two = {**a, "initial_state": None}
    ok = torch.empty(num_checkpoints([70, 30], 64), 2, 16, 16, device=device)
    assert ok.shape[0] == 1
    with pytest.raises(ValueError, match="checkpoints and checkpoint_every go together"):
        chunk_delta_rule(**two, cu_seqlens=cu, checkpoints=ok)
    with pytest.raises(ValueError, match=f"positive multiple of the chunk size {CHUNK}"):
        chunk_delta_rule(**two, cu_seqlens=cu, checkpoints=ok, checkpoint_every=48)
    with pytest.raises(ValueError, match=r"checkpoints must have shape \[1, 2, 16, 16\]"):
        chunk_delta_rule(**two, cu_seqlens=cu, checkpoints=torch.empty(2, 2, 16, 16, device=device), checkpoint_every=64)
    with pytest.raises(TypeError, match="checkpoints must have dtype torch.float32"):
        chunk_delta_rule(**two, cu_seqlens=cu, checkpoints=ok.bfloat16(), checkpoint_every=64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_benchmark_needs_a_gpu():
    from labkit.bench.gdn_prefill import bench_gdn_prefill

    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bench_gdn_prefill()
    with pytest.raises(ValueError, match="unknown variants"):
        bench_gdn_prefill(variants=("fastest",))


def test_benchmark_kernel_table(capsys):
    """The benchmark's --profile table: fla 0.6's kernels and labkit's summed into the same stages
    by name, each row's kernels listed with launches, grid x block and registers; a row without a
    profile (a failed one) is left out."""
    from labkit.bench.gdn_prefill import GdnPrefillResult, print_kernels, stage

    stages = {"chunk_local_cumsum_scalar_kernel": "solve", "chunk_gated_delta_rule_fwd_kkt_solve_kernel": "solve",
              "_solve_kernel": "solve", "recompute_w_u_fwd_kernel": "products", "_products_kernel": "products",
              "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": "walk", "_walk_kernel": "walk",
              "chunk_fwd_kernel_o": "output", "_output_kernel": "output", "Memset (Device)": "memory",
              "_single_chunk_kernel": "other"}
    assert {name: stage(name) for name in stages} == stages
    kernels = [dict(name="_walk_kernel", stage="walk", count=1.0, us=120.0, grid=[8, 16, 2], block=[128, 1, 1], regs=242),
               dict(name="Memset (Device)", stage="memory", count=2.0, us=3.0)]
    print_kernels([GdnPrefillResult("labkit", 8, 16384, "tuned", ms=0.5, kernels=kernels),
                   GdnPrefillResult("fla", 8, 16384, error="RuntimeError: no capture")])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "kernels, 8 x 2,048 tokens: device us per call by stage"
    assert out[3].split() == ["labkit", "tuned", "0.0", "0.0", "120.0", "0.0", "3.0", "0.0", "123.0", "500.0"]
    assert out[4] == "  labkit tuned: _walk_kernel 120.0 [8, 16, 2]x128 r242; Memset (Device) 3.0 x2"
    assert len(out) == 5


@pytest.mark.parametrize("arch", [90, 100])
def test_kernels_compile_for_hopper_and_blackwell_at_real_shapes(arch):
    """Through Triton's real compiler and ptxas (python -m labkit.lab.compile_check_prefill), which the
    interpreter never exercises: the four kernels of the chunk path and the single-chunk kernel, at
    H = 16, K = V = 128, bf16, for sm_90 (H100/H200) and sm_100 (B200); for sm_90 also the prefill's
    element-wise kernels (labkit.ops.prefill_fusions) at both presets' shapes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    fusions = ["--fusions"] if arch == 90 else []  # the prefill's element-wise kernels too, for the H200
    run = subprocess.run([sys.executable, "-m", "labkit.lab.compile_check_prefill", "--arch", str(arch), *fusions],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"for sm_{arch}" in run.stdout and "; 0 failures" in run.stdout
    for kernel in ("_solve_kernel", "_products_kernel", "_walk_kernel", "_output_kernel", "_single_chunk_kernel"):
        assert kernel in run.stdout
    # the walk of 2 sequences keeps 16 columns, that of 8 widens to 64 (walk_block_v), in either grid order
    walks = [line for line in run.stdout.splitlines() if line.startswith("_walk_kernel")]
    for width in (16, 64):
        for first in (False, True):
            assert any(f"BLOCK_V={width}," in line and f"BLOCKS_FIRST={first}" in line for line in walks), walks
    for kernel in ("_gdn_inputs_kernel", "_short_conv_prefill_kernel", "_sigmoid_gate_kernel", "_swiglu_kernel",
                   "_rms_norm_kernel", "_gated_rms_norm_kernel", "_norm_rope_kernel",
                   # a hit tail's gate|up and attention in bf16 and float32, the prompt's gate|up GEMM: each
                   # within the target's shared memory (compile_check fails a variant that is not)
                   "_linear_kernel", "_split_kernel", "_merge_kernel", "_gemm_swiglu_kernel") if fusions else ():
        assert kernel in run.stdout


def test_dense_offsets_are_made_once_per_shape(device):
    """cu_seqlens of dense rows: [0, T, ..., BT], one tensor per (B, T, device), reused by every call."""
    from labkit.ops.chunk_delta_rule import dense_offsets

    dev = torch.device(device) if device == "cpu" else torch.zeros(0, device=device).device
    a = dense_offsets(3, 37, dev)
    assert a.dtype == torch.int32 and a.tolist() == [0, 37, 74, 111]
    assert dense_offsets(3, 37, dev) is a and dense_offsets(2, 37, dev) is not a


def test_dense_offsets_past_the_cap_are_made_per_call_and_none_is_dropped(monkeypatch):
    """A kept tensor may be read by a captured graph: past the cap, calls make their own instead of
    evicting one."""
    monkeypatch.setattr(cdr, "_DENSE_OFFSETS", {})
    monkeypatch.setattr(cdr, "DENSE_OFFSETS_KEPT", 2)
    cpu = torch.device("cpu")
    kept = [cdr.dense_offsets(1, t, cpu) for t in (5, 6)]
    extra = cdr.dense_offsets(1, 7, cpu)
    assert extra.tolist() == [0, 7] and cdr.dense_offsets(1, 7, cpu) is not extra
    assert all(cdr.dense_offsets(1, t, cpu) is k for t, k in zip((5, 6), kept)) and len(cdr._DENSE_OFFSETS) == 2
