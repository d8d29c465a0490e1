"""The chained-step bench at the real shapes: every GEMV and every PDL placement of the projections
against its reference (all layers, LM head included), a timed chain with a per-kernel fit, the
global-timer timeline, and the fused+graph+pdl decode step with the mixers releasing early.

Every placement is a distinct compile of every projection kernel, so placements run where their code
differs: all of them at batch 1 (the GEMV loop, where ``preload`` moves the first weight tile before
the PDL wait and ``release`` moves the trigger) and the three releases at batch 3 (the tl.dot loop,
rows masked; ``preload`` is not compiled into that loop, so both preload values are one program).
Batch 16 is the tl.dot loop again at a full tile: it keeps every GEMV with and without PDL at the
default placement (and the cuBLAS dispatch of ``"step"``), as batches 1 and 3 do.
"""

import pytest
import torch

from labkit.bench import chain as ch
from labkit.ops.linear import RELEASES, PdlPlacement

from .conftest import REAL_PRESETS

PLACEMENTS = {
    1: [PdlPlacement(p, r) for p in (True, False) for r in RELEASES],
    3: [PdlPlacement(True, r) for r in RELEASES],
}


@pytest.mark.heavy(seconds=25)
@pytest.mark.parametrize("batch", sorted(PLACEMENTS))
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_every_placement_in_the_chain(real_model, preset, batch):
    model = real_model(preset)
    ops = ch.chain_ops(model)
    for placement in PLACEMENTS[batch]:
        errs = ch.Chain(model, ops, batch, "linear", pdl=True, placement=placement).check()
        assert max(errs.values()) < 1e-2, (placement, max(errs, key=errs.get))


@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_every_gemv_in_the_chain(real_model, preset, batch):
    model = real_model(preset)
    ops = ch.chain_ops(model)
    gemvs = ["linear", "cublas", "torch", "step"] + (["plain", "plain-tma"] if batch == 1 else [])
    for gemv in gemvs:
        for pdl in (False, True):
            errs = ch.Chain(model, ops, batch, gemv, pdl=pdl).check()
            assert max(errs.values()) < 1e-2, (gemv, pdl, max(errs, key=errs.get))


@pytest.mark.serial  # a bandwidth fit: another process's kernels between the timed replays would skew it
def test_a_timed_chain_and_its_fit(real_model):
    res = ch.run_chain(real_model("lfm2-350m"), 1, "linear", pdl=True, repeats=5, log=lambda s: None)
    assert res.error is None and res.ms > 0 and res.bytes > 700e6
    assert res.fit is not None and res.fit["tb_per_s"] > 0.5 and len(res.groups) >= 5


def test_timeline_shows_every_kernel_in_order(real_model):
    model = real_model("lfm2-350m")
    ops = [o for o in ch.chain_ops(model) if 0 <= o.layer < 2]
    for pdl in (False, True):
        rows = ch.timeline(model, ops, pdl=pdl, replays=2)
        assert len(rows) == len(ops)
        for r in rows:
            assert r["first_start_us"] <= r["first_past_wait_us"] <= r["last_end_us"]
        ends = [r["last_end_us"] for r in rows]
        assert ends == sorted(ends)  # each waits for the one before: ends stay in launch order


def test_pdl_decode_with_early_release_matches_plain_graph(real_model):
    from labkit import tuning
    from labkit.decode.registry import make_decoder

    # the decoder launches with the GPU's tuned placement: on the H200, preload + early release everywhere
    assert tuning.pdl_placement("cuda") == PdlPlacement(True, "early")
    assert all(tuning.settings(k, "cuda")["release_early"] for k in ("attention_decode", "gated_delta_decode"))
    for preset in REAL_PRESETS:
        model = real_model(preset)
        prompt = torch.randint(0, model.cfg.vocab_size, (3, 7), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        a = make_decoder("fused+graph", model, model.new_cache(3, 32))
        b = make_decoder("fused+graph+pdl", model, model.new_cache(3, 32))
        ta, tb = a.prefill(prompt).argmax(-1), b.prefill(prompt).argmax(-1)
        for _ in range(6):
            ta, tb = a.step_greedy(ta), b.step_greedy(tb)
            assert torch.equal(ta, tb), preset
