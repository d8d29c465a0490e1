"""Every decode op at the real shapes of both presets (random bf16 weights) against its reference,
at batch 1, 3 and 16, with the configurations the fused backend launches on this GPU.

Bounds: bf16 outputs 1e-2 (the references round at other places); state that is only moved (the
conv windows, the value cache) must match to 1e-6; the float32 recurrent state to 1e-5.
"""

import pytest
import torch

from labkit.bench import ops

from .conftest import BATCHES, REAL_PRESETS


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_every_projection_matches_its_reference_and_repeats_exactly(real_model, preset, batch):
    from labkit.ops.linear import LinearWorkspace, linear

    model = real_model(preset)
    for case in ops.linear_cases(model):
        assert ops.check_linear(model, case, batch) < 1e-2, case.name
        # split-K sums partials in a fixed order and resets its counters: a second launch is bit-equal
        config = ops.case_config(model, case, batch)
        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, case.outputs, config, case.row_blocks), "cuda")
        x = torch.randn(batch, case.weight.shape[1], dtype=model.dtype, device="cuda")
        kw = dict(norm_weight=case.norm_weight, norm_eps=model.cfg.norm_eps, norm_unit_offset=model.cfg.norm_unit_offset,
                  swiglu=case.swiglu, config=config, workspace=ws)
        state = res = None
        if case.conv_weight is not None:
            state = torch.randn(batch, case.conv_weight.shape[1] - 1, case.outputs, dtype=model.dtype, device="cuda")
        if case.residual:
            res = torch.randn(batch, case.outputs, dtype=model.dtype, device="cuda")
        runs = []
        for _ in range(2):
            conv = None if state is None else (state.clone(), case.conv_weight)
            runs.append(linear(x, case.weight, short_conv=conv, residual=None if res is None else res.clone(), **kw))
        assert torch.equal(*runs), case.name


@pytest.mark.parametrize("batch", BATCHES)
def test_gated_deltanet_step_for_every_block_v(real_model, batch):
    model = real_model("qwen3.5-0.8b")
    for block_v in (None, 4, 8, 16, 32, 64, 128):
        err = ops.gdn_errors(model, batch, block_v)
        assert err["out"] < 1e-2 and err["conv_state"] < 1e-6 and err["state"] < 1e-5, (block_v, err)


@pytest.mark.parametrize("max_len", [1000, 32768])  # odd cache sizes and long contexts (many chunks to merge)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_attention_step_over_long_and_ragged_caches(real_model, preset, batch, max_len):
    model = real_model(preset)
    assert ops.check_attention(model, batch, max_len) < 1e-2
    # every sequence at a different length, the last slot among them
    lengths = [(max_len - 1 - 977 * i) % max_len for i in range(batch)]
    assert ops.check_attention(model, batch, max_len, lengths=lengths, seed=11) < 1e-2


@pytest.mark.parametrize("batch", BATCHES)
def test_standalone_short_conv(real_model, batch):
    assert ops.check_short_conv(real_model("lfm2-350m"), batch) < 1e-2


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_greedy_head_picks_the_argmax_of_its_own_logits(real_model, preset, batch):
    err = ops.check_greedy_head(real_model(preset), batch)
    assert err["logits_rel_err"] < 1e-2 and err["own_argmax_mismatch"] == 0, err
