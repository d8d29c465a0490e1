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
    decoder = make_decoder("reference", model, model.new_cache(1, 32))
    with pytest.raises(ValueError, match="weights changed"):
        prefix.prefill(decoder, ids)
    # the look-up had set the cache up for the restore: refused, it is left empty, not half-restored
    assert decoder.cache.seq_len == 0 and decoder.cache.lengths.tolist() == [0]


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


def test_a_replayed_hit_takes_the_weights_key_while_it_runs_and_drops_the_replay_if_refused(graphs, monkeypatch):
    """fused+graph: a hit whose restore and tail are captured is replayed first and the weights are
    checked after the launch (the walk of the model overlaps the device's work); a check that fails
    then still refuses, leaves the decoder's cache empty and the snapshots as they were."""
    import labkit.prefix_cache as pc

    model = _model()
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 32))
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    ids = random_prompt(model, 1, 13)
    want = model(ids)[:, -1]
    for _ in range(3):  # a miss, then hits: the tail's graph is captured when its shape comes back
        prefix.prefill(decoder, ids)
    taken_at = []  # how many replays had run when each weights key was taken
    later = pc.values_later
    monkeypatch.setattr(pc, "values_later", lambda *a, **k: (taken_at.append(graphs.replays), later(*a, **k))[1])
    replays = graphs.replays
    got = prefix.prefill(decoder, ids)
    assert got.restored == 12 and rel_err(got.logits, want) < 1e-5
    assert taken_at == [replays + 1]  # the replay was launched before the key was taken
    held = (len(prefix), prefix.nbytes)
    model.embed.weight.data.mul_(3)
    with pytest.raises(ValueError, match="weights changed"):
        prefix.prefill(decoder, ids)
    assert graphs.replays == replays + 2 and taken_at[-1] == replays + 2  # refused after its replay
    assert decoder.cache.seq_len == 0 and (len(prefix), prefix.nbytes) == held
    fresh = labkit.PrefixCache(model, BS, budget_bytes=10**8)  # the edited model, cached anew, is exact
    for restored in (0, 12, 12, 12):
        got = fresh.prefill(decoder, ids)
        assert got.restored == restored and rel_err(got.logits, model(ids)[:, -1]) < 1e-5
    replays = graphs.replays  # a miss of a captured shape (its third time here) replays first too
    got = labkit.PrefixCache(model, BS, budget_bytes=10**8).prefill(decoder, ids)
    assert got.restored == 0 and taken_at[-1] == replays + 1 and rel_err(got.logits, model(ids)[:, -1]) < 1e-5
