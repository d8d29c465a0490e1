"""The "reference+graph" rung with real CUDA graphs, at the real shapes: the reference decode step
replayed from one graph matches the eager reference for many steps, so the captured step does not
keep the length it was captured at (tests/test_reference_graph.py cannot see that: its stand-in
re-runs the Python step on every replay)."""

import pytest
import torch

from labkit.decode.registry import make_decoder

from .conftest import REAL_PRESETS

STEPS = 24


@pytest.mark.parametrize("preset", REAL_PRESETS)
@pytest.mark.parametrize("batch", [1, 3])
def test_replayed_reference_follows_eager_over_many_steps(real_model, preset, batch):
    model = real_model(preset, torch.float32)  # float32: the graph's wider (masked) attention rounds alike
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, 7), generator=torch.Generator().manual_seed(0)).cuda()
    eager = make_decoder("reference", model, model.new_cache(batch, 7 + STEPS + 5))
    graph = make_decoder("reference+graph", model, model.new_cache(batch, 7 + STEPS + 5))
    token = eager.prefill(prompt).argmax(-1)
    graph.prefill(prompt)
    for _ in range(STEPS):
        want = eager.step(token)
        got = graph.step(token)
        assert torch.isfinite(got).all()
        assert ((got - want).norm() / want.norm()).item() < 1e-4
        token = want.argmax(-1)
    assert graph.captures == 1
