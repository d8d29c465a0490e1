"""ArticleCache under misuse (issue 24 item 5): a refused call leaves the ArticleCache (and the model's
cache) as they were, so the next good call works as if the bad one never happened."""

import pytest
import torch

import labkit
from labkit.lab.article_cache import ArticleCache


def _ids(model, batch, length, seed=0):
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def _buffers(cache):
    return [b.clone() for b in cache.buffers()]


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_a_batch_that_does_not_fit_the_cache_changes_nothing(preset):
    model = labkit.build(preset, dtype=torch.float32, seed=1)
    ids = _ids(model, 3, 5)
    ac, cache = ArticleCache(model), model.new_cache(3, 8)
    with pytest.raises(ValueError, match="input batch 2 does not match the cache's batch 3"):
        ac(ids[:2], cache)
    with pytest.raises(ValueError, match="token ids"):
        ac(torch.full((3, 2), model.cfg.vocab_size), cache)
    got = ac(ids, cache)  # the good call after the bad ones: as if they never happened
    fresh, fresh_cache = ArticleCache(model), model.new_cache(3, 8)
    assert torch.equal(got, fresh(ids, fresh_cache))
    assert all(torch.equal(a, b) for a, b in zip(cache.buffers(), fresh_cache.buffers()))


@pytest.mark.parametrize("layers", [("gdn", "gdn", "gdn", "attention", "gdn"), ("attention", "gdn", "attention")])
def test_a_prefill_over_waiting_tokens_is_refused_before_any_layer_runs(layers):
    """With an attention layer first, a refusal from the GDN core came after that layer wrote its KV."""
    model = labkit.build(labkit.PRESETS["tiny-qwen3.5"].replace(layer_types=layers), dtype=torch.float32, seed=1)
    ac, cache = ArticleCache(model, threshold=float("inf")), model.new_cache(2, 12)
    ids = _ids(model, 2, 8)
    ac(ids[:, :4], cache)
    for t in range(4, 7):  # level 2 is reused: these tokens wait in level 1
        ac(ids[:, t : t + 1], cache)
    assert any(st.pending for st in ac._state.values())
    before, work = _buffers(cache), {i: (w.decisions, w.done_flops) for i, w in ac.work.items()}
    with pytest.raises(RuntimeError, match="waiting in level 1"):
        ac(ids[:, 6:8], cache)
    assert all(torch.equal(a, b) for a, b in zip(cache.buffers(), before))
    assert {i: (w.decisions, w.done_flops) for i, w in ac.work.items()} == work
    assert all(st.valid.all() for st in ac._state.values())  # level 2 still holds every output
    ac(ids[:, 7:8], cache)  # decoding goes on


def test_a_cache_that_is_not_one_is_named():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=1)
    with pytest.raises(ValueError, match="pass the model's HybridCache, got dict"):
        ArticleCache(model)(_ids(model, 1, 3), {})
