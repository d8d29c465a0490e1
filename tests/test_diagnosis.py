"""The time split of a decode step (labkit.lab.diagnosis): parts that sum to the step, none negative,
bad input refused; the trivial-work twin runs the same ops as the model it mirrors."""

import math
from collections import Counter

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import labkit
from labkit.decode.registry import make_decoder
from labkit.lab.diagnosis import split_step_time, trivial_twin


@pytest.mark.parametrize("step,busy,kernels,launch_us", [(14.2, 1.6, 916, 6.4), (3.0, 0.0, 0, 9.8), (5.0, 5.0, 0, 1.0),
                                                         (2.0, 1.0, 100, 10.0)])
def test_parts_sum_to_the_step_and_none_is_negative(step, busy, kernels, launch_us):
    s = split_step_time(step, busy, kernels, launch_us)
    assert math.isclose(sum(s.parts().values()), step, rel_tol=1e-12)
    assert all(v >= 0 for v in s.parts().values())
    assert math.isclose(sum(s.shares().values()), 1.0, rel_tol=1e-12)
    assert math.isclose(s.launch_ms, kernels * launch_us / 1e3)
    assert s.gpu_busy_ms == busy


def test_the_rest_is_what_kernels_and_launches_leave():
    s = split_step_time(10.0, 2.0, 500, 6.0)
    assert math.isclose(s.python_ms, 10.0 - 2.0 - 3.0)


@pytest.mark.parametrize("args,match", [
    ((0.0, 0.0, 1, 1.0), "step_ms must be > 0"),
    ((-1.0, 0.0, 1, 1.0), "step_ms must be a finite number"),
    ((1.0, float("nan"), 1, 1.0), "busy_ms must be a finite number"),
    ((1.0, 0.1, -3, 1.0), "kernels must be a finite number"),
    ((1.0, 0.1, 3, float("inf")), "launch_us must be a finite number"),
    ((1.0, 0.1, 3, None), "launch_us must be a finite number"),
    ((1.0, 1.5, 3, 1.0), "busy 1.500 ms in a 1.000 ms step"),
    ((1.0, 0.5, 100, 6.0), "not host-bound"),
])
def test_bad_input_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        split_step_time(*args)


def _aten_ops(model, batch=2):
    decoder = make_decoder("reference", model, model.new_cache(batch, 16))
    token = decoder.prefill(torch.zeros(batch, 5, dtype=torch.long)).argmax(-1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decoder.step(token)
    return Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5", "lfm2-350m", "qwen3.5-0.8b"])
def test_trivial_twin_keeps_layers_and_options_and_shrinks_widths(preset):
    cfg = labkit.PRESETS[preset]
    twin = trivial_twin(cfg)
    assert twin.layer_types == cfg.layer_types and twin.family == cfg.family
    assert (twin.tie_embeddings, twin.attn_output_gate, twin.norm_unit_offset) == (
        cfg.tie_embeddings, cfg.attn_output_gate, cfg.norm_unit_offset)
    assert (twin.rotary_dim < twin.head_dim) == (cfg.rotary_dim < cfg.head_dim)
    assert twin.hidden_size <= cfg.hidden_size and twin.vocab_size <= 256


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_trivial_twin_runs_the_same_ops(preset):
    model = labkit.build(preset, dtype=torch.float32)
    twin = labkit.build(trivial_twin(model.cfg), dtype=torch.float32)
    assert _aten_ops(twin) == _aten_ops(model)


def test_busy_fraction_covers_overlaps_once_and_splits_across_bins():
    from labkit.lab.plots import busy_fraction

    spans = [("mlp", 0.0, 5.0), ("mlp", 2.0, 2.0), ("norm", 8.0, 4.0), ("norm", 19.0, 1.0)]
    assert busy_fraction(spans, 10.0) == pytest.approx([0.7, 0.3])
    assert busy_fraction(spans, 10.0, end_us=40.0) == pytest.approx([0.7, 0.3, 0.0, 0.0])
    with pytest.raises(ValueError, match="bin_us"):
        busy_fraction(spans, 0.0)


def test_profile_decode_times_repeated_positions_and_a_fresh_step():
    from labkit.lab.profile import profile_decode

    model = labkit.build("tiny-lfm2", dtype=torch.float32)
    p = profile_decode(model, batch=1, context=5, steps=2, warmup=1, rounds=2, fresh_steps=1)
    assert len(p.bench_runs_ms) == len(p.profiled_runs_ms) == 2
    assert p.step_ms > 0 and p.profiled_step_ms > 0 and p.fresh_step_ms > 0
    assert p.profiler_overhead == p.profiled_step_ms / p.step_ms
    with pytest.raises(ValueError, match="fresh_steps >= 0"):
        profile_decode(model, steps=1, fresh_steps=-1)
