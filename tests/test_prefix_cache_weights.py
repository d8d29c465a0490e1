"""A PrefixCache restores snapshots only into the weights they were made from (labkit.weights.weights_key):
edits torch does not count are refused, another model is refused even before anything is stored,
and the same checkpoint loaded twice is accepted."""

import pytest
import torch

import labkit
from conftest import random_prompt, rel_err
from labkit.decode.registry import make_decoder

BS = 4


def _model(seed=0):
    return labkit.build("tiny-lfm2", dtype=torch.float32, seed=seed)


def _prefill(prefix, model, ids):
    return prefix.prefill(make_decoder("reference", model, model.new_cache(1, 32)), ids)


def test_an_edit_through_data_after_snapshots_were_stored_is_refused():
    """``p.data.mul_(3)`` moves no version counter: without the fingerprint the cache restored the old
    states (logits off by ~1 from no cache)."""
    model = _model()
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    ids = random_prompt(model, 1, 13)
    _prefill(prefix, model, ids)
    assert _prefill(prefix, model, ids).restored == 12
    model.embed.weight.data.mul_(3)
    with pytest.raises(ValueError, match="weights changed"):
        _prefill(prefix, model, ids)


def test_a_fresh_cache_refuses_another_models_decoder_on_its_first_miss():
    """Nothing stored yet is no reason to skip the check: the snapshots this miss stores would be the
    other model's, restored later into this one."""
    model, other = _model(seed=0), _model(seed=1)
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    ids = random_prompt(model, 1, 13)
    with pytest.raises(ValueError, match="not the ones this PrefixCache"):
        _prefill(prefix, other, ids)
    assert len(prefix) == 0  # refused before anything was stored
    _prefill(prefix, model, ids)  # the right model still works, and then hits exactly
    got = _prefill(prefix, model, ids)
    assert got.restored == 12 and rel_err(got.logits, model(ids)[:, -1]) < 1e-5


def test_the_same_checkpoint_loaded_twice_shares_one_cache(tmp_path):
    labkit.save(_model(), tmp_path / "ckpt")
    first, second = (labkit.load(tmp_path / "ckpt", dtype=torch.float32) for _ in range(2))
    prefix = labkit.PrefixCache(first, BS, budget_bytes=10**8)
    ids = random_prompt(first, 1, 13)
    labkit.generate(first, ids, 3, prefix_cache=prefix)
    out = labkit.generate(second, ids, 3, prefix_cache=prefix)  # another object, the same weights
    assert out.prefix_hit == 12 and torch.equal(out.tokens, labkit.generate(second, ids, 3).tokens)
    second.embed.weight.data.mul_(3)  # once accepted, it is bound like the first: an edit is refused
    with pytest.raises(ValueError, match="weights changed"):
        labkit.generate(second, ids, 3, prefix_cache=prefix)
