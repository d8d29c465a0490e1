"""Real CUDA graphs kept across ``generate`` calls, at the real shapes: captured by the first call,
replayed by the next ones, recaptured when a weight is replaced or changed in place.

tests/test_fused_graphs.py checks the same paths on a CPU with a stand-in for the graphs; this
checks them with torch.cuda.CUDAGraph. Graph replays are compared with the eager fused launches
(the same kernels: equal bit for bit), so near-ties of random weights cannot make it flaky.
"""

import copy

import pytest
import torch
from torch import nn

import labkit

from .conftest import REAL_PRESETS

NEW_TOKENS = 12


def _pooled_decoders(model):
    pool = model.attachments.get("labkit.decoder_pool", {})
    return [d for cache in pool.values() for d in cache.attachments.values()]


@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_graphs_are_captured_once_and_recaptured_after_a_weight_change(real_model, preset):
    model = copy.deepcopy(real_model(preset))  # its own weights: this test changes them
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0)).to("cuda")

    def run(backend):
        return labkit.generate(model, prompt, NEW_TOKENS, backend=backend, progress=False)

    eager = run("fused").tokens
    first, second = run("fused+graph"), run("fused+graph")
    assert torch.equal(first.tokens, eager) and torch.equal(second.tokens, eager)
    graph_decoders = [d for d in _pooled_decoders(model) if d.graph]
    assert len(graph_decoders) == 1 and graph_decoders[0].captures == 1
    assert second.setup_s < 0.5 * first.setup_s, (first.setup_s, second.setup_s)  # no capture the second time

    block = model.layers[-1]
    block.mlp.down.mul_(-2.0)  # in place: a new _version
    changed = run("fused").tokens
    assert not torch.equal(changed, eager)  # the change shows in the tokens, so a stale replay would too
    assert torch.equal(run("fused+graph").tokens, changed)
    assert graph_decoders[0].captures == 2

    block.mlp.down = nn.Parameter(-0.5 * block.mlp.down.detach(), requires_grad=False)  # replaced: back to the start
    assert torch.equal(run("fused+graph").tokens, eager)
    assert graph_decoders[0].captures == 3


@pytest.mark.parametrize("backend", ["fused+graph", "fused+graph+pdl", "persistent"])
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_a_pooled_cache_s_stale_keys_and_values_are_never_read(real_model, preset, backend):
    """generate zeroes a pooled cache's states and lengths between calls, not its keys and values
    (the prefill writes them before attention reads them): NaN in every key and value of the pooled
    cache, where the call writes and past it, must not change a replay's tokens
    (tests/test_generate.py checks the CPU rungs, and a given cache)."""
    from labkit.decode.registry import leased_decoder

    model = real_model(preset)
    prompt = torch.randint(0, model.cfg.vocab_size, (3, 77), generator=torch.Generator().manual_seed(77)).to("cuda")
    want = labkit.generate(model, prompt, NEW_TOKENS, backend=backend, progress=False).tokens
    with leased_decoder(backend, model, 3, 77 + NEW_TOKENS) as (_, cache):
        for t in (*cache.keys.values(), *cache.values.values()):
            t.fill_(float("nan"))
    assert torch.equal(labkit.generate(model, prompt, NEW_TOKENS, backend=backend, progress=False).tokens, want)
