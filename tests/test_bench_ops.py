"""labkit.bench.ops: every op of a decode step checked at model shapes (tiny presets here; the real
ones in tests/gpu), and its timers refuse a device they cannot time on."""

import pytest
import torch

import labkit
from labkit.bench import ops


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_every_linear_case_matches_its_reference(preset, device):
    model = labkit.build(preset, dtype=torch.float32, device=device, seed=1)
    cases = ops.linear_cases(model)
    names = [c.name for c in cases]
    assert "mlp.gate_up+norm+swiglu" in names and "lm_head+norm" in names
    assert ("conv.in_proj+norm+short_conv" in names) == (preset == "tiny-lfm2")
    for case in cases:
        for batch in (1, 3):
            assert ops.check_linear(model, case, batch) < 1e-4, (case.name, batch)


def test_case_shapes_and_the_no_norm_twin():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    case = next(c for c in ops.linear_cases(model) if c.swiglu)
    assert case.row_blocks == 2 and case.outputs * 2 == case.weight.shape[0]
    bare = case.without_norm()
    assert bare.norm_weight is None and bare.swiglu and "(no norm)" in bare.name and "+norm" not in bare.name


def test_gdn_step_matches_its_reference_for_every_block_v(device):
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device=device, seed=2)
    whole_head = 1 << (model.cfg.gdn_v_head_dim - 1).bit_length()  # one program per head
    for block_v in (None, 8, whole_head):
        assert ops.check_gdn(model, 3, block_v) < 1e-4


def test_attention_short_conv_and_greedy_head_match_their_references(device):
    lfm = labkit.build("tiny-lfm2", dtype=torch.float32, device=device, seed=3)
    assert ops.cache_lengths(3, 40) == [20, 0, 39] and ops.cache_lengths(1, 200) == [104]
    assert ops.check_attention(lfm, 3, max_len=40) < 1e-4
    assert ops.check_attention(lfm, 2, max_len=24, lengths=[23, 5]) < 1e-4
    assert ops.check_short_conv(lfm, 3) < 1e-4
    head = ops.check_greedy_head(lfm, 3)
    assert head["logits_rel_err"] < 1e-4 and head["own_argmax_mismatch"] == 0 and head["ref_disagreement"] == 0
    with pytest.raises(ValueError, match="cache lengths"):
        ops.check_attention(lfm, 2, max_len=24, lengths=[24, 0])


def test_a_broken_kernel_fails_its_check(monkeypatch, device):
    """The checks can fail: a kernel that leaves its (NaN-poisoned) output unwritten is caught."""
    from labkit.ops import short_conv

    model = labkit.build("tiny-lfm2", dtype=torch.float32, device=device, seed=3)
    monkeypatch.setattr(short_conv, "short_conv_decode", lambda proj, state, weight, out: out)
    assert ops.check_short_conv(model, 1) == float("inf")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_timers_need_a_gpu():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0)
    for time_op in (lambda: ops.time_linear(model, ops.linear_cases(model)[0], 1), lambda: ops.time_gdn(model, 1),
                    lambda: ops.time_attention(model, 1, 32), lambda: ops.time_greedy_head(model, 1)):
        with pytest.raises(RuntimeError, match="CUDA"):
            time_op()
    with pytest.raises(ValueError, match="no Gated DeltaNet"):
        ops.check_gdn(labkit.build("tiny-lfm2", dtype=torch.float32, seed=0), 1)
    with pytest.raises(ValueError, match="no short-conv"):
        ops.check_short_conv(model, 1)
