"""The persistent rung at the real shapes of both presets: one kernel of resident programs per step.

What the CPU tests cannot see is the concurrency: on the CPU one program runs every tile in order,
here 2 programs per SM wait on each other's counters. So: bf16 logits teacher-forced for many
steps at batch 1, 3 and 16 (a tile that read its input before the producer's stores were visible,
or a counter reset too early, corrupts a step by far more than bf16 rounding), float32 greedy
tokens through ``labkit.generate``, and the residency check that keeps the grid from waiting on
programs that never start.
"""

import pytest
import torch

import labkit
from labkit.bench.ops import rel_err
from labkit.bench.tune_persistent import close_enough
from labkit.decode.persistent import PersistentDecoder
from labkit.decode.registry import make_decoder

from .conftest import BATCHES, REAL_PRESETS

STEPS = 48
PROMPT = 17


def _prompt(model, batch: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * seed + batch)
    return torch.randint(0, model.cfg.vocab_size, (batch, PROMPT), generator=gen).to("cuda")


@pytest.mark.heavy(seconds=60)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_bf16_logits_over_many_steps(real_model, preset, batch):
    """As close to the float32 truth as the bf16 reference is (within a factor 2, the tuner's rule),
    at every step of a teacher-forced run, on fresh random tokens every step (each step's inputs differ)."""
    model, truth_model = real_model(preset), real_model(preset, torch.float32)
    prompt, max_len = _prompt(model, batch), PROMPT + STEPS + 1
    ref = make_decoder("reference", model, model.new_cache(batch, max_len))
    dec = make_decoder("persistent", model, model.new_cache(batch, max_len))
    truth = make_decoder("reference", truth_model, truth_model.new_cache(batch, max_len))
    ref.prefill(prompt), dec.prefill(prompt), truth.prefill(prompt)
    gen = torch.Generator().manual_seed(batch)
    worst = {"reference": 0.0, "persistent": 0.0}
    for step in range(STEPS):
        token = torch.randint(0, model.cfg.vocab_size, (batch,), generator=gen).to("cuda")
        exact = truth.step(token)
        worst["reference"] = max(worst["reference"], rel_err(ref.step(token), exact))
        err = rel_err(dec.step(token), exact)
        worst["persistent"] = max(worst["persistent"], err)
        assert err < 0.5, f"step {step}: relative error {err:.3g} (a race, or a tile that was never run)"
    assert dec.cache.lengths.tolist() == ref.cache.lengths.tolist()
    print(f"\n{preset} B={batch}: worst relative error {worst}")
    assert close_enough(worst["persistent"], worst["reference"]), worst


@pytest.mark.parametrize("preset, batch", [
    pytest.param("lfm2-350m", 1, marks=pytest.mark.heavy(seconds=40)),
    pytest.param("lfm2-350m", 3, marks=pytest.mark.heavy(seconds=40)),
    pytest.param("qwen3.5-0.8b", 1, marks=pytest.mark.heavy(seconds=130)),
])
def test_float32_greedy_tokens_equal_the_reference(real_model, preset, batch):
    model = real_model(preset, torch.float32)
    prompt = _prompt(model, batch, seed=1)
    want = labkit.generate(model, prompt, 32, backend="reference", progress=False).tokens
    got = labkit.generate(model, prompt, 32, backend="persistent", progress=False).tokens
    assert got.tolist() == want.tolist()


def test_the_grid_fits_on_the_gpu_and_a_grid_that_does_not_is_refused(real_model):
    model = real_model("lfm2-350m")
    dec = PersistentDecoder(model, model.new_cache(1, 64))
    plan, prog, shapes, buffers, table = dec._program(dec.plan, True)
    ops = dec._persistent
    kernel = ops.precompile(table, buffers, shapes, greedy=True, **dec._launch_settings())
    fit = ops.resident_per_sm(kernel, torch.device("cuda"))
    print(f"\n{fit} programs of the persistent step fit on an SM; the grid asks {dec.settings['programs_per_sm']}")
    assert fit >= dec.settings["programs_per_sm"]
    dec.settings["programs_per_sm"] = fit + 1
    dec._programs.clear()
    with pytest.raises(RuntimeError, match="resident programs per SM"):
        dec._program(dec.plan, True)


@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_the_timeline_stamps_every_instruction_in_dependency_order(real_model, preset):
    model = real_model(preset)
    dec = PersistentDecoder(model, model.new_cache(1, 64))
    dec.prefill(_prompt(model, 1))
    prog, stamps = dec.timeline(torch.tensor([1], device="cuda"))
    ran = stamps[..., 0] >= 0  # [programs, instructions]
    assert ran.any(0).all(), "an instruction that no program ran"
    assert (stamps[..., 1][ran] >= stamps[..., 0][ran]).all()
    last_end = torch.where(ran, stamps[..., 1], -1).max(0).values
    first_end = torch.where(ran, stamps[..., 1], 2**62).min(0).values
    # an instruction's tiles end after its producer's last tile (every tile waited for it)
    assert (first_end[1:] >= last_end[:-1]).all()
    span_us = (stamps[..., 1].max() - stamps[..., 0][ran].min()).item() / 1e3
    print(f"\n{preset}: {len(prog.instructions)} instructions in {span_us:.1f} µs on the device")


def test_the_timeline_bench_writes_its_results(tmp_path):
    import json

    from labkit.__main__ import main

    argv = ["bench", "persistent-timeline", "--model", "lfm2-350m", "--repeats", "3", "--data-dir", str(tmp_path)]
    assert main(argv) == 0
    (path,) = tmp_path.glob("*/persistent-timeline.json")
    doc = json.loads(path.read_text())
    assert doc["tokens_per_s"] > 0 and len(doc["rows"]) == doc["instructions"]
    assert sum(r["weight_bytes"] for r in doc["rows"]) > 0.9 * 2 * 354e6  # every weight streamed once (bf16)
