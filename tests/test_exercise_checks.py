"""The exercise checks say "correct" to a right answer, "not yet" (naming the gap) to a wrong one,
and never raise for the reader's mistakes."""

import pytest
import torch

from labkit.lab.exercise_checks import check_short_conv_step, check_step_bytes, count_ops, short_conv_inputs
from labkit.lab.roofline import layer_costs, step_cost
from labkit.ops.short_conv import short_conv_decode_ref


def _from_layers(cfg, batch, context, kinds=("attention", "conv", "gdn")):
    costs = layer_costs(cfg, context)
    weights = sum(c.weight_bytes for c in costs)
    return weights + batch * sum(c.state_bytes_per_seq for c in costs if c.kind in kinds)


def test_step_bytes_right_answer_is_correct():
    assert check_step_bytes(_from_layers).startswith("correct:")


def test_step_bytes_weights_only_is_not_yet_and_names_both_parts():
    msg = check_step_bytes(lambda cfg, b, L: step_cost(cfg, 1, 0).weight_bytes)
    assert msg.startswith("not yet:") and "KV cache and the fixed state" in msg


def test_step_bytes_without_kv_names_the_kv_cache():
    msg = check_step_bytes(lambda cfg, b, L: _from_layers(cfg, b, L, kinds=("conv", "gdn")))
    assert msg.startswith("not yet:") and msg.endswith("(the difference is the KV cache, for the whole batch)")


def test_step_bytes_reports_an_exception():
    def broken(cfg, batch, context):
        raise RuntimeError("unfinished")

    assert check_step_bytes(broken) == ("not yet: step_bytes(lfm2-350m, batch=1, context=0) raised "
                                        "RuntimeError: unfinished")


def _fewer_ops(proj, window, weight):
    b, c, x = proj.chunk(3, dim=-1)
    full = torch.cat([window, (b * x)[:, None]], dim=1)
    return c * torch.einsum("bkh,hk->bh", full, weight), full[:, 1:]


def test_count_ops_leaves_views_out():
    ops, out = count_ops(lambda t: t[:, 1:].transpose(0, 1) * 2, torch.ones(3, 4))
    assert ops == ["mul"] and out.shape == (3, 3)


def test_short_conv_check_paths():
    assert check_short_conv_step(_fewer_ops, 5).startswith("correct: the same result in 4 ops")
    assert check_short_conv_step(short_conv_decode_ref, 5).startswith("not yet: right result, but")
    assert check_short_conv_step(lambda p, w, k: (p[:, :40] * 0, w), 5).startswith("not yet: your step's output")
    assert check_short_conv_step(lambda p, w, k: 1 / 0, 5).startswith("not yet: your step raised ZeroDivisionError")
    with pytest.raises(ValueError, match="at least 1"):
        check_short_conv_step(_fewer_ops, 0)


def test_short_conv_inputs_are_irregular():
    proj, window, weight = short_conv_inputs(batch=2, kernel=4, hidden=13)
    assert proj.shape == (2, 39) and window.shape == (2, 3, 13) and weight.shape == (13, 4)
