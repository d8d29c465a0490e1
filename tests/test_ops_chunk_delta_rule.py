"""Chunked gated delta rule prefill (labkit.ops.chunk_delta_rule) against the step-by-step recurrence.

Every output buffer (o, final state, checkpoints) is poisoned with NaN before the kernel runs, so
an element it fails to write fails the comparison. Bounds: 1e-5 for float32 inputs (every
product is exact float32 in the interpreter), 1e-2 for bfloat16 inputs (products take bf16
operands and W, U0, P and o are stored in bf16, as in fla; the interpreter rounds as a GPU does).
"""

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from labkit.ops.chunk_delta_rule import CHUNK, chunk_delta_rule, num_checkpoints, prefill_split
from labkit.ops.delta_rule import delta_rule_recurrent_ref

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
    o, s = _run(q, k, v, g, beta, state, split=0)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


def test_no_initial_state_and_grouped_heads(device):
    """Three value heads per key head, value columns in two blocks of 16, no initial state."""
    q, k, v, g, beta, _ = _inputs(2, 70, 1, 3, 16, 20, seed=5, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta)
    o, s = _run(q, k, v, g, beta, None, split=0, block_v=16)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


@pytest.mark.parametrize("split", [0, 1])
def test_bfloat16_inputs(split, device):
    q, k, v, g, beta, state = _inputs(1, 200, 1, 2, 32, 32, seed=3, dtype=torch.bfloat16, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g.bfloat16(), beta.bfloat16(), state)
    o, s = _run(q, k, v, g.bfloat16(), beta.bfloat16(), state, split=split)
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
    for kw in (dict(prepare="fused"), dict(prepare="split", invert="dots"), dict(prepare="split", invert="rows"),
               dict(prepare="merged")):
        o, s = _run(q, k, v, g, beta, state, split=0, **kw)
        assert rel_err(o, o_ref) < 1e-5, kw
        assert rel_err(s, s_ref) < 1e-5, kw


# a length-1 sequence, one of no tokens, one that is not a multiple of the chunk, one of exactly two
LENGTHS = [1, 70, 0, 128, 33]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_split_prepare_matches_recurrence(dtype, device):
    """prepare="split" (the solve kernel, then W, U0 and P by separate programs) on packed
    sequences with grouped heads, odd head dims and an initial state."""
    lengths = [70, 1, 0, 33]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=41, dtype=dtype, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(42)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, split=0, prepare="split")
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


@pytest.mark.parametrize("invert,products,recompute_p", [("rows", "full", True), ("rows", "blocks", False),
                                                         ("dots", "full", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_solve_and_product_forms_match_recurrence(invert, products, recompute_p, dtype, device):
    """The split prepare's forms (row-substitution inverse, W and U0 from X whole, P formed by the
    output kernel) on packed sequences with partial chunks (70 = 64 + 6, 33, 1), an empty one,
    grouped heads, odd head dims."""
    lengths = [70, 1, 0, 33]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=45, dtype=dtype, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(46)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, split=0, prepare="split", invert=invert, products=products,
                products_warps=2, output_warps=2, defer_outputs=True, recompute_p=recompute_p)
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


@pytest.mark.parametrize("recompute_p", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merged_prepare_matches_recurrence(recompute_p, dtype, device):
    """prepare="merged" (solve and products in one program), with P stored or formed by the output
    kernel, on packed sequences with partial chunks, an empty one, grouped heads, odd head dims."""
    lengths = [70, 1, 0, 33]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=47, dtype=dtype, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(48)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, split=0, prepare="merged", defer_outputs=True,
                recompute_p=recompute_p)
    assert rel_err(o, o_ref) < BOUND[dtype]
    assert rel_err(s, s_ref) < BOUND[dtype]


def test_unknown_solve_forms_are_refused(device):
    q, k, v, g, beta, state = _inputs(1, 8, 1, 1, 16, 16, seed=1, device=device)
    with pytest.raises(ValueError, match="invert must be one of"):
        chunk_delta_rule(q, k, v, g, beta, state, invert="neumann")
    with pytest.raises(ValueError, match="products must be one of"):
        chunk_delta_rule(q, k, v, g, beta, state, products="dense")
    with pytest.raises(ValueError, match="products_warps must be a power of two"):
        chunk_delta_rule(q, k, v, g, beta, state, products_warps=3)
    with pytest.raises(ValueError, match="recompute_p needs defer_outputs"):
        chunk_delta_rule(q, k, v, g, beta, state, defer_outputs=False, recompute_p=True)


@pytest.mark.parametrize("split", [0, 1])
def test_deferred_outputs_match_recurrence(split, device):
    """defer_outputs: the walk stores chunk start states and deltas, a parallel kernel forms the
    outputs; packed sequences, the split, checkpoints, output blocks narrower than the walk's."""
    lengths = [130, 1, 0, 64]
    q, k, v, g, beta, _ = _inputs(1, sum(lengths), 1, 2, 16, 24, seed=43, device=device)
    state = torch.randn(len(lengths), 2, 16, 24, generator=torch.Generator().manual_seed(44)).to(device)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    ckpt = _poisoned(num_checkpoints(lengths, 64), 2, 16, 24, device=device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, lengths)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, split=split, defer_outputs=True, output_block_v=16,
                checkpoints=ckpt, checkpoint_every=64)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5
    _, s64 = delta_rule_recurrent_ref(*(x[:, :64] for x in (q, k, v, g, beta)), state[:1])
    assert rel_err(ckpt[0], s64[0]) < 1e-5


def test_unknown_prepare_is_refused(device):
    q, k, v, g, beta, state = _inputs(1, 8, 1, 1, 16, 16, seed=1, device=device)
    with pytest.raises(ValueError, match="prepare must be one of"):
        chunk_delta_rule(q, k, v, g, beta, state, prepare="both")


@pytest.mark.parametrize("split", [0, 1])
def test_packed_sequences(split, device):
    T = sum(LENGTHS)
    q, k, v, g, beta, _ = _inputs(1, T, 1, 2, 16, 24, seed=21, device=device)
    state = torch.randn(len(LENGTHS), 2, 16, 24, generator=torch.Generator().manual_seed(22)).to(device)
    cu = torch.tensor([0] + LENGTHS, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, LENGTHS)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, split=split)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5
    assert torch.equal(s[2], state[2])  # no tokens: the initial state comes back


@pytest.mark.parametrize("every,split", [(64, 0), (128, 0), (64, 1)])
def test_checkpoints_are_the_states_at_their_positions(every, split, device):
    lengths = [130, 1, 200, 64]
    T = sum(lengths)
    q, k, v, g, beta, _ = _inputs(1, T, 1, 1, 16, 16, seed=31, device=device)
    state = torch.randn(len(lengths), 1, 16, 16, generator=torch.Generator().manual_seed(32)).to(device)
    cu = torch.tensor([0] + lengths).cumsum(0).to(device)  # int64 offsets
    rows = num_checkpoints(lengths, every)
    ckpt = _poisoned(rows, 1, 16, 16, device=device)
    o, s = _run(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt, checkpoint_every=every, split=split)
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


@pytest.mark.parametrize("split,batch", [(1, 2), (3, 1)])
def test_sequence_split_equals_the_plain_walk(split, batch, device):
    """Segments of 1 and 3 chunks over 5 chunks (the last one partial), grouped heads: the
    segment maps, their scan and the walks from the scanned states give the recurrence."""
    q, k, v, g, beta, state = _inputs(batch, 300, 1, 2, 16, 24, seed=41, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    o, s = _run(q, k, v, g, beta, state, split=split, block_v=16)
    assert rel_err(o, o_ref) < 1e-5
    assert rel_err(s, s_ref) < 1e-5


def test_final_state_can_update_the_initial_state_in_place(device):
    q, k, v, g, beta, state = _inputs(2, 80, 1, 1, 16, 16, seed=51, device=device)
    o_ref, s_ref = delta_rule_recurrent_ref(q, k, v, g, beta, state)
    for split in (0, 1):
        s = state.clone()
        o, s_out = chunk_delta_rule(q, k, v, g, beta, s, final_state=s, out=_poisoned(*v.shape, device=device),
                                    split=split)
        assert s_out is s
        assert rel_err(o, o_ref) < 1e-5 and rel_err(s, s_ref) < 1e-5


def test_split_heuristic_follows_the_launch_geometry(monkeypatch):
    """On a GPU of 132 SMs: no split when the walk already has >= 132 programs or the sequences
    are short; else segments of >= 8 chunks, about enough for two programs per SM."""
    import labkit.ops.chunk_delta_rule as cdr

    monkeypatch.setattr(cdr, "num_sms", lambda: 132)
    # batch 1, 16 heads x 4 value blocks = 64 programs: 5 segments make 320
    assert prefill_split(1, 16, 4, 65536) == 205  # 1,024 chunks in 5 segments
    assert prefill_split(1, 16, 4, 4096) == 13  # 64 chunks in 5 segments
    assert prefill_split(1, 16, 4, 1024) == 8  # 16 chunks: 2 segments of the shortest length
    assert prefill_split(1, 16, 4, 900) == 0  # 15 chunks: too short to split
    assert prefill_split(2, 16, 4, 2 * 8192) == 43  # 128 programs: 3 segments of each sequence
    assert prefill_split(8, 16, 4, 8 * 2048) == 0  # 512 programs already


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
    with pytest.raises(ValueError, match="split must be"):
        chunk_delta_rule(**a, split=-1)
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


def test_kernels_compile_for_sm90_at_real_shapes():
    """Through Triton's real compiler and ptxas (python -m labkit.lab.compile_check_prefill), which the
    interpreter never exercises: every kernel of both paths and the single-chunk kernel, at H = 16,
    K = V = 128, bf16."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-m", "labkit.lab.compile_check_prefill"], capture_output=True, text=True,
                         env=env, cwd=root, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "for sm_90" in run.stdout and "; 0 failures" in run.stdout
    for kernel in ("_prepare_kernel", "_solve_kernel", "_products_kernel", "_walk_kernel", "_transition_kernel",
                   "_combine_kernel", "_single_chunk_kernel"):
        assert kernel in run.stdout
