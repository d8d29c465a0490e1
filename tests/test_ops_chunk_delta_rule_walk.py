"""The walk of many packed sequences (labkit.ops.chunk_delta_rule): value blocks widened by
``walk_programs_per_sm`` (walk_block_v) and the blocks-first grid order, on an irregular packing.

As in tests/test_ops_chunk_delta_rule.py: outputs, final states and checkpoints are poisoned with
NaN before the kernel runs, and compared with the step-by-step recurrence run on each sequence
alone (1e-5 for float32 inputs, 1e-2 for bfloat16). A spy on the walk's launch checks that the
form under test is the one that ran (value columns, grid, warps, stages), so that a setting that
silently did nothing fails.

The settings under test change only the walk, so the solve and products (most of the
interpreter's time) run once per input dtype: their outputs, checked through the first call's
comparison with the reference, are replayed into the later calls' buffers.
"""

import pytest
import torch

from conftest import rel_err
from labkit.ops import chunk_delta_rule as cdr
from labkit.ops.chunk_delta_rule import chunk_delta_rule, num_checkpoints, walk_block_v
from labkit.ops.delta_rule import delta_rule_recurrent_ref
from test_ops_chunk_delta_rule import BOUND, _inputs, _poisoned, _ref_packed

# one token, one short of a chunk, exactly one, one past it, two and a bit, three and a partial
LENGTHS = [1, 63, 64, 65, 130, 200]
HV, K, V = 1, 16, 40  # 40 value columns: three blocks of 16 (the last one partial), one of 64


class WalkSpy:
    """Stands in for ``_walk_kernel``: records each launch's grid and settings, then launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append(dict(grid=tuple(grid), block_v=kw["BLOCK_V"], warps=kw["num_warps"],
                                      stages=kw["num_stages"], blocks_first=kw["BLOCKS_FIRST"]))
            return self.kernel[grid](*args, **kw)

        return launch


class Replayed:
    """Stands in for a kernel whose arguments ``outs`` are its outputs: the first launch on given
    keys (by dtype and contents) runs it and keeps its outputs; later ones copy them back."""

    saved: dict = {}

    def __init__(self, kernel, outs):
        self.kernel, self.outs = kernel, outs

    def __getitem__(self, grid):
        def launch(*args, **kw):
            key = (self.kernel, args[0].dtype, args[0].shape, float(args[0].double().sum()))
            if key not in self.saved:
                self.kernel[grid](*args, **kw)
                self.saved[key] = [args[i].clone() for i in self.outs]
            for i, t in zip(self.outs, self.saved[key]):
                args[i].copy_(t)

        return launch


@pytest.fixture
def walk(monkeypatch):
    spy = WalkSpy(cdr._walk_kernel)
    monkeypatch.setattr(cdr, "_walk_kernel", spy)
    monkeypatch.setattr(cdr, "_solve_kernel", Replayed(cdr._solve_kernel, (4, 5, 6)))  # x (L), xo (X), gcum
    monkeypatch.setattr(cdr, "_products_kernel", Replayed(cdr._products_kernel, (6, 7)))  # w, u
    monkeypatch.setattr(cdr, "num_sms", lambda: 6)  # a small GPU, which 6 sequences overfill
    return spy


@pytest.fixture(scope="module")
def case():
    """Packed inputs, initial states and the reference: outputs, final states, and the state after
    every 64 tokens of each sequence (each from the one before: one pass over the tokens)."""
    q, k, v, g, beta, _ = _inputs(1, sum(LENGTHS), 1, HV, K, V, seed=71)
    state = torch.randn(len(LENGTHS), HV, K, V, generator=torch.Generator().manual_seed(72))
    o_ref, s_ref = _ref_packed(q, k, v, g, beta, state, LENGTHS)
    ckpt_ref, t = [], 0
    for i, n in enumerate(LENGTHS):
        s = state[i:i + 1]
        for pos in range(64, n + 1, 64):
            _, s = delta_rule_recurrent_ref(*(x[:, t + pos - 64:t + pos] for x in (q, k, v, g, beta)), s)
            ckpt_ref.append(s)
        t += n
    cu = torch.tensor([0] + LENGTHS).cumsum(0).to(torch.int32)
    return dict(inputs=(q, k, v, g, beta, state), cu=cu, o=o_ref, s=s_ref, ckpt=torch.cat(ckpt_ref, 0))


def _run(case, dtype=torch.float32, **kw):
    q, k, v, g, beta, state = case["inputs"]
    q, k, v = (x.to(dtype) for x in (q, k, v))
    out = _poisoned(*v.shape, dtype=dtype)
    final = _poisoned(*state.shape)
    ckpt = _poisoned(num_checkpoints(LENGTHS, 64), HV, K, V)
    assert ckpt.shape[0] == case["ckpt"].shape[0] == 7
    o, s = chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=case["cu"], out=out, final_state=final,
                            checkpoints=ckpt, checkpoint_every=64, single_chunk=False, block_v=16, **kw)
    for got, name in ((o, "o"), (s, "s"), (ckpt, "ckpt")):
        assert rel_err(got, case[name]) < BOUND[dtype], name  # a NaN left (an element not written) fails
    return o, s, ckpt


# (settings, the walk launch they must give) on the 6-SM stand-in: 6 sequences x 1 head
@pytest.mark.parametrize("settings,expected", [
    # never widened: 6 x 3 blocks of 16 = 18 programs, sequences first
    (dict(walk_programs_per_sm=0), dict(grid=(6, 1, 3), block_v=16, warps=4, stages=2, blocks_first=False)),
    # 18 > 2 x 6: 32 columns, 12 programs, at the wide warps and stages
    (dict(walk_programs_per_sm=2, wide_warps=2, wide_stages=1),
     dict(grid=(6, 1, 2), block_v=32, warps=2, stages=1, blocks_first=False)),
    # 12 > 1 x 6: the whole head (64 columns), one block per walk, blocks first
    (dict(walk_programs_per_sm=1, walk_blocks_first=True), dict(grid=(6, 1, 1), block_v=64, warps=4, stages=2,
                                                                blocks_first=True)),
    # narrow blocks first: the 3 blocks of a sequence and head are consecutive programs
    (dict(walk_programs_per_sm=3, walk_blocks_first=True, num_stages=1),
     dict(grid=(18, 1, 1), block_v=16, warps=4, stages=1, blocks_first=True)),
], ids=["narrow", "wide32", "whole-blocks-first", "narrow-blocks-first"])
def test_irregular_packing_with_checkpoints(settings, expected, case, walk):
    _run(case, **settings)
    assert walk.launches == [expected]


def test_widened_walk_in_bfloat16_under_capture(case, walk, monkeypatch):
    """bf16 inputs, the grids shuffled (a race between programs shows), and cu_seqlens not read
    back (as while a CUDA graph is captured): the widening needs only the number of sequences."""
    from grid_order import scramble_grid

    scramble_grid(monkeypatch, "shuffled", seed=3)
    monkeypatch.setattr(cdr, "_host_lengths", lambda cu, tokens: None)
    _run(case, torch.bfloat16, walk_programs_per_sm=2, walk_blocks_first=True)
    assert walk.launches == [dict(grid=(12, 1, 1), block_v=32, warps=4, stages=2, blocks_first=True)]


def test_walk_block_v_at_the_real_shapes(monkeypatch):
    """Qwen3.5's 16 heads x 128 columns on 132 SMs: one sequence keeps 16 columns (128 programs);
    8 packed ones widen to 64 (256 programs, two per SM) or, at one per SM, to whole heads."""
    monkeypatch.setattr(cdr, "num_sms", lambda: 132)
    assert walk_block_v(1, 16, 128, 16, 2) == 16
    assert walk_block_v(2, 16, 128, 16, 2) == 16  # 256 <= 264
    assert walk_block_v(3, 16, 128, 16, 2) == 32
    assert walk_block_v(8, 16, 128, 16, 2) == 64
    assert walk_block_v(8, 16, 128, 16, 1) == 128
    assert walk_block_v(8, 16, 128, 16, 0) == 16
    assert walk_block_v(64, 16, 128, 16, 2) == 128  # never past the head
    assert walk_block_v(64, 16, 40, 16, 2) == 64  # a narrow head: its width rounded up to a power of two


def test_bad_walk_settings_are_refused():
    q, k, v, g, beta, state = _inputs(1, 8, 1, 1, 16, 16, seed=1)
    for name, value, match in [("walk_programs_per_sm", -1, "walk_programs_per_sm must be an integer >= 0"),
                               ("walk_programs_per_sm", True, "walk_programs_per_sm must be an integer >= 0"),
                               ("wide_warps", 3, "wide_warps must be a power of two >= 1, got 3"),
                               ("wide_stages", 0, "wide_stages must be a number of stages >= 1, got 0"),
                               ("walk_blocks_first", 1, "walk_blocks_first must be True or False, got 1")]:
        with pytest.raises(ValueError, match=match):
            chunk_delta_rule(q, k, v, g, beta, state, **{name: value})


def test_the_benchmark_variants_name_real_settings():
    import inspect

    from labkit.bench.gdn_prefill import VARIANTS

    known = set(inspect.signature(chunk_delta_rule).parameters)
    named = [kw for kw in VARIANTS.values() if kw is not None]  # None: the GPU's tuning file ("file")
    assert [name for name, kw in VARIANTS.items() if kw is None] == ["file"]
    assert all(set(kw) <= known for kw in named)
    assert {"walk_programs_per_sm", "walk_blocks_first", "x_in_input_dtype", "inverse_tf32"} <= {
        name for kw in named for name in kw}
