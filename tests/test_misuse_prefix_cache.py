"""PrefixCache under misuse (issue 24 item 5) and its byte accounting (issue 23 item 9).

The eviction tests of test_prefix_cache.py assert ``nbytes <= budget_bytes``: the very counter that
eviction enforces, so a counter that drifts from what the trie holds cannot fail them. Here the
bytes are summed over the nodes' own tensors and compared with the counter and the budget.
"""

import math

import pytest
import torch

import labkit
from labkit.decode.registry import make_decoder

BS = 4


@pytest.fixture(scope="module", params=["tiny-lfm2", "tiny-qwen3.5"])
def model(request):
    return labkit.build(request.param, dtype=torch.float32, seed=3)


def _held_bytes(prefix):
    """What the trie really holds: every node's tensors, summed (not the cache's own counter)."""
    total, stack = 0, list(prefix.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        tensors = [*node.keys.values(), *node.values.values(), *node.conv_states.values(), *node.recurrent_states.values()]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


@pytest.mark.parametrize("admission", ["ends", "every"])
@pytest.mark.parametrize("policy", ["lru", "flops"])
def test_the_byte_counter_is_what_the_trie_holds_through_evictions(model, policy, admission):
    """With admission "ends" the nodes differ in size (KV only, or KV and states), so subtracting a
    snapshot's bytes instead of the victim's makes the counter drift from the trie."""
    size = labkit.PrefixCache(model, BS, budget_bytes=math.inf).snapshot_bytes
    prefix = labkit.PrefixCache(model, BS, budget_bytes=4 * size + size // 3, policy=policy, admission=admission)
    decoder = make_decoder("reference", model, model.new_cache(1, 40))
    gen = torch.Generator().manual_seed(0)
    stem = torch.randint(0, model.cfg.vocab_size, (1, 3 * BS), generator=gen)
    for i in range(10):  # prompts that share a stem and leave it at different depths: branch points
        cut = (i % 3) * BS
        tail = torch.randint(0, model.cfg.vocab_size, (1, 2 * BS + 1 + i % 4), generator=gen)
        prefix.prefill(decoder, torch.cat([stem[:, :cut], tail], 1))
        held = _held_bytes(prefix)
        assert prefix.nbytes == held, (i, prefix.nbytes, held)
        assert held <= prefix.budget_bytes
    assert prefix.evictions > 0
    prefix.clear()
    assert prefix.nbytes == _held_bytes(prefix) == 0


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(block_size=16.5), TypeError, r"block_size must be an int .*got 16.5"),
    (dict(block_size="16"), TypeError, r"block_size must be an int .*got '16'"),
    (dict(block_size=True), TypeError, r"block_size must be an int .*got True"),
    (dict(block_size=0), ValueError, r"block_size must be >= 1, got 0"),
    (dict(budget_bytes=float("nan")), TypeError, r"budget_bytes must be a number of bytes .*got nan"),
    (dict(budget_bytes="1e9"), TypeError, r"budget_bytes must be a number of bytes .*got '1e9'"),
    (dict(budget_bytes=100), ValueError, r"smaller than one snapshot"),
    (dict(policy="random"), ValueError, r"unknown policy 'random'"),
    (dict(admission=None), ValueError, r"unknown admission None"),
])
def test_bad_constructor_arguments_are_refused_by_name(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        labkit.PrefixCache(model, **{"block_size": BS, "budget_bytes": 10**8, **kwargs})


def test_a_non_model_is_refused():
    decoder = make_decoder("reference", labkit.build("tiny-lfm2"), labkit.build("tiny-lfm2").new_cache(1, 8))
    for wrong in (decoder, "tiny-lfm2", None):
        with pytest.raises(TypeError, match="PrefixCache needs a labkit HybridLM"):
            labkit.PrefixCache(wrong, BS, budget_bytes=10**8)


def test_an_unbounded_budget_is_inf(model):
    prefix = labkit.PrefixCache(model, BS, budget_bytes=math.inf)
    decoder = make_decoder("reference", model, model.new_cache(1, 40))
    prefix.prefill(decoder, torch.randint(0, model.cfg.vocab_size, (1, 33), generator=torch.Generator().manual_seed(1)))
    assert len(prefix) == 8 and prefix.evictions == 0
