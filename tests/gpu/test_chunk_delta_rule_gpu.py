"""The chunked delta-rule prefill at real shapes on a GPU (16 heads, K = V = 128, bf16 q/k/v);
marked ``gpu`` and skipped without CUDA by tests/gpu/conftest.py.

The reference is :func:`labkit.ops.delta_rule.delta_rule_chunked_ref` in float32 (equal to the
step-by-step recurrence: tests/test_delta_rule.py), fast enough on a GPU for 16k tokens. The
kernel multiplies bf16 operands (as fla does), so the bound is 1e-2 relative RMS error, against
about 2e-3 for rounding the reference's output to bf16 alone.
"""

import pytest
import torch
import torch.nn.functional as F

from labkit.bench.ops import rel_err
from labkit.ops.chunk_delta_rule import chunk_delta_rule, num_checkpoints
from labkit.ops.delta_rule import delta_rule_chunked_ref

BOUND = 1e-2
H, D = 16, 128


def _inputs(T, Hk=H, Hv=H, seed=0, sequences=1):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = F.normalize(randn(1, T, Hk, D), dim=-1).bfloat16()
    k = F.normalize(randn(1, T, Hk, D), dim=-1).bfloat16()
    v = randn(1, T, Hv, D).bfloat16()
    g = -F.softplus(2 * randn(1, T, Hv) - 3)
    beta = torch.sigmoid(randn(1, T, Hv)).bfloat16()
    state = randn(sequences, Hv, D, D) * 0.1
    return q, k, v, g, beta, state


def _ref(q, k, v, g, beta, state):
    return delta_rule_chunked_ref(q.float(), k.float(), v.float(), g, beta.float(), state)


@pytest.mark.parametrize("T", [1000, 4096, 16384])
def test_one_long_sequence(T):
    q, k, v, g, beta, state = _inputs(T, seed=T)
    o_ref, s_ref = _ref(q, k, v, g, beta, state)
    out = torch.full_like(v, float("nan"))
    final = torch.full_like(state, float("nan"))
    o, s = chunk_delta_rule(q, k, v, g, beta, state, out=out, final_state=final)
    assert rel_err(o, o_ref) < BOUND
    assert rel_err(s, s_ref) < BOUND


def test_grouped_heads():
    q, k, v, g, beta, state = _inputs(3000, Hk=8, Hv=16, seed=1)
    o_ref, s_ref = _ref(q, k, v, g, beta, state)
    o, s = chunk_delta_rule(q, k, v, g, beta, state)
    assert rel_err(o, o_ref) < BOUND and rel_err(s, s_ref) < BOUND


LENGTHS = [1, 63, 2048, 100, 4096, 640, 7, 1500]


def test_packed_prompts_with_checkpoints():
    every = 256
    q, k, v, g, beta, state = _inputs(sum(LENGTHS), seed=2, sequences=len(LENGTHS))
    cu = torch.tensor([0] + LENGTHS, device="cuda").cumsum(0).to(torch.int32)
    ckpt = torch.full((num_checkpoints(LENGTHS, every), H, D, D), float("nan"), device="cuda")
    o, s = chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt, checkpoint_every=every)
    t, row = 0, 0
    for i, n in enumerate(LENGTHS):
        part = [x[:, t:t + n] for x in (q, k, v, g, beta)]
        o_ref, s_ref = _ref(*part, state[i:i + 1])
        assert rel_err(o[:, t:t + n], o_ref) < BOUND
        assert rel_err(s[i:i + 1], s_ref) < BOUND
        for pos in range(every, n + 1, every):
            _, s_pos = _ref(*(x[:, :pos] for x in part), state[i:i + 1])
            assert rel_err(ckpt[row:row + 1], s_pos) < BOUND
            row += 1
        t += n
    assert row == ckpt.shape[0]


def _graph_replay_matches_ref(lengths, seed, **options):
    """Capture chunk_delta_rule over packed ``lengths`` once (no read-back of cu_seqlens during the
    capture), replay it on fresh inputs into poisoned outputs, and compare each sequence with the
    reference."""
    q, k, v, g, beta, state = _inputs(sum(lengths), seed=seed, sequences=len(lengths))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0)
    out, final = torch.empty_like(v), torch.empty_like(state)

    def call():
        chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, out=out, final_state=final, **options)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    fresh = _inputs(sum(lengths), seed=seed + 1, sequences=len(lengths))
    for buf, new in zip((q, k, v, g, beta, state), fresh):
        buf.copy_(new)
    out.fill_(float("nan"))
    final.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    t = 0
    for i, n in enumerate(lengths):
        if n:
            o_ref, s_ref = _ref(*(x[:, t:t + n] for x in fresh[:5]), fresh[5][i:i + 1])
            assert rel_err(out[:, t:t + n], o_ref) < BOUND and rel_err(final[i:i + 1], s_ref) < BOUND, i
        else:
            assert torch.equal(final[i], fresh[5][i]), i
        t += n


def test_cuda_graph_replay_sees_new_inputs():
    """The multi-kernel path, captured once and replayed on new data."""
    _graph_replay_matches_ref([700, 1, 3000], seed=3)


def test_agrees_with_fla():
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    q, k, v, g, beta, state = _inputs(4096, seed=5)
    o, s = chunk_delta_rule(q, k, v, g, beta, state)
    o_fla, s_fla = fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
    assert rel_err(o, o_fla) < BOUND and rel_err(s, s_fla) < BOUND


def test_the_tf32_inverse_on_repeated_keys():
    """bf16 inputs whose every chunk repeats one key (beta 0.99, no decay): the triangular systems
    furthest from the identity, where the inverse's blocks are largest. The error there comes from
    the bf16 products, not the inverse: it is past the random inputs' bound (1.5e-2 for o, 1.7e-2
    for the state in the interpreter's emulation at H = 2), with the full-float32 inverse too. The
    inverse in TF32 (the default) adds at most a quarter to it."""
    q, k, v, g, beta, state = _inputs(320, seed=11)
    k = k[:, ::64].repeat_interleave(64, dim=1).contiguous()
    g = torch.zeros_like(g)
    beta = torch.full_like(beta, 0.99)
    o_ref, s_ref = _ref(q, k, v, g, beta, state)
    o, s = chunk_delta_rule(q, k, v, g, beta, state, inverse_tf32=True)
    o32, s32 = chunk_delta_rule(q, k, v, g, beta, state, inverse_tf32=False)
    errors = {name: rel_err(x, ref) for name, x, ref in
              (("o", o, o_ref), ("s", s, s_ref), ("o32", o32, o_ref), ("s32", s32, s_ref))}
    assert max(errors.values()) < 5 * BOUND, errors
    assert errors["o"] <= 1.25 * errors["o32"] and errors["s"] <= 1.25 * errors["s32"], errors


@pytest.mark.parametrize("settings", [dict(block_v=32, num_warps=8, prepare_warps=8, output_block_v=128),
                                      dict(block_v=64, num_stages=1, products_warps=8, output_warps=8)],
                         ids=["wide", "wider-walk"])
def test_launch_settings_on_packed_prompts(settings):
    """Launch settings away from the defaults (what another GPU's tuning file may choose), compiled
    for real: packed prompts, checkpoints."""
    every = 256
    q, k, v, g, beta, state = _inputs(sum(LENGTHS), seed=3, sequences=len(LENGTHS))
    cu = torch.tensor([0] + LENGTHS, device="cuda").cumsum(0).to(torch.int32)
    ckpt = torch.full((num_checkpoints(LENGTHS, every), H, D, D), float("nan"), device="cuda")
    out = torch.full_like(v, float("nan"))
    o, s = chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt, checkpoint_every=every,
                            out=out, **settings)
    t = row = 0
    for i, n in enumerate(LENGTHS):
        part = [x[:, t:t + n] for x in (q, k, v, g, beta)]
        o_ref, s_ref = _ref(*part, state[i:i + 1])
        assert rel_err(o[:, t:t + n], o_ref) < BOUND and rel_err(s[i:i + 1], s_ref) < BOUND, i
        row += n // every
        if n >= every:
            _, s_pos = _ref(*(x[:, :every] for x in part), state[i:i + 1])
            assert rel_err(ckpt[row - n // every:row - n // every + 1], s_pos) < BOUND, i
        t += n


# a prefix-cache hit's tail: one chunk per sequence after a restored state
@pytest.mark.parametrize("lengths", [[64], [1], [64] * 8, [1, 64, 17, 0, 33, 64, 5, 64]],
                         ids=["T64", "T1", "8x64", "packed-mixed"])
@pytest.mark.parametrize("single", [None, True])
def test_single_chunk_tail(lengths, single):
    """The single-chunk kernel at the real shape (16 value heads, K = V = 128, bf16): chosen by default
    (8 x 16 = 128 programs <= 132 SMs) or forced; outputs, final states and the 64-token checkpoints
    poisoned first, then compared with the reference sequence by sequence."""
    from labkit.ops import chunk_delta_rule as cdr

    calls = []
    launch = cdr._single_chunk
    cdr._single_chunk = lambda *a, **kw: calls.append(1) or launch(*a, **kw)
    try:
        q, k, v, g, beta, state = _inputs(sum(lengths), seed=6, sequences=len(lengths))
        cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32) if len(lengths) > 1 else None
        ckpt = torch.full((num_checkpoints(lengths, 64), H, D, D), float("nan"), device="cuda")
        extra = dict(checkpoints=ckpt, checkpoint_every=64) if len(ckpt) else {}
        out = torch.full_like(v, float("nan"))
        final = torch.full_like(state, float("nan"))
        o, s = chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, out=out, final_state=final,
                                single_chunk=single, **extra)
        torch.cuda.synchronize()
    finally:
        cdr._single_chunk = launch
    assert calls == [1]
    assert not o.isnan().any() and not s.isnan().any() and not ckpt.isnan().any()
    t = row = 0
    for i, n in enumerate(lengths):
        if n:
            o_ref, s_ref = _ref(*(x[:, t:t + n] for x in (q, k, v, g, beta)), state[i:i + 1])
            assert rel_err(o[:, t:t + n], o_ref) < BOUND and rel_err(s[i:i + 1], s_ref) < BOUND, i
        else:
            assert torch.equal(s[i], state[i])
        if n == 64:
            assert torch.equal(ckpt[row], s[i])
            row += 1
        t += n
    # the multi-kernel path agrees
    o2, s2 = chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, single_chunk=False)
    assert rel_err(o, o2) < BOUND and rel_err(s, s2) < BOUND


def test_single_chunk_graph_replay():
    """The single-chunk path chosen automatically under capture (4 sequences, 64 tokens in all, so
    the choice needs no lengths), replayed on new data."""
    _graph_replay_matches_ref([1, 40, 0, 23], seed=7)
