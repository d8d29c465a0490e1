import pytest
import torch

import labkit


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=1)


def test_buffers_never_move(model):
    cache = model.new_cache(batch_size=3, max_len=30)
    ptrs = [b.data_ptr() for b in cache.buffers()]
    ids = torch.randint(0, model.cfg.vocab_size, (3, 10))
    model(ids, cache=cache)
    for t in range(5):
        model(ids[:, t : t + 1], cache=cache)
    cache.reset()
    model(ids, cache=cache)
    assert [b.data_ptr() for b in cache.buffers()] == ptrs
    assert cache.host_lengths == (10, 10, 10)
    assert cache.lengths.tolist() == [10, 10, 10]


def test_overflow_is_a_clear_error_and_loses_nothing(model):
    cache = model.new_cache(batch_size=1, max_len=12)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 12))
    model(ids[:, :10], cache=cache)
    snapshot = [b.clone() for b in cache.buffers()]
    with pytest.raises(labkit.CacheFullError, match="max_len=12"):
        model(ids[:, :3], cache=cache)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, cache.buffers()))
    model(ids[:, 10:12], cache=cache)  # exactly full is fine
    with pytest.raises(labkit.CacheFullError):
        model(ids[:, :1], cache=cache)


def test_reset_gives_the_same_logits_as_a_fresh_cache(model):
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    fresh = model(ids, cache=model.new_cache(2, 16))
    cache = model.new_cache(2, 16)
    model(torch.randint(0, model.cfg.vocab_size, (2, 7)), cache=cache)
    cache.reset()
    assert torch.equal(model(ids, cache=cache), fresh)


@pytest.mark.parametrize("kind", ["all", "states", "lengths"])
def test_reset_zeroes_what_it_says_and_a_prompt_from_zero_reads_no_stale_key(model, kind):
    """reset() zeroes every buffer; reset(keys_values=False) the states and lengths only (a
    prefix-cache miss); reset(zero=False) the lengths only. A prompt from position 0 then gives the
    fresh cache's logits bit for bit in the first two cases: stale keys and values are never read."""
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9))
    fresh = model(ids, cache=model.new_cache(2, 16))
    cache = model.new_cache(2, 16)
    model(torch.randint(0, model.cfg.vocab_size, (2, 13)), cache=cache)
    kv = [t.clone() for t in (*cache.keys.values(), *cache.values.values())]
    cache.reset(**{"all": {}, "states": {"keys_values": False}, "lengths": {"zero": False}}[kind])
    states = [*cache.conv_states.values(), *cache.recurrent_states.values()]
    assert cache.lengths.tolist() == [0, 0] and cache.host_lengths == (0, 0)
    assert all(bool(t.eq(0).all()) for t in states) == (kind != "lengths")
    after = [*cache.keys.values(), *cache.values.values()]
    assert all(bool(t.eq(0).all()) for t in after) == (kind == "all")
    if kind != "all":
        assert all(torch.equal(a, b) for a, b in zip(after, kv))
    if kind != "lengths":
        assert torch.equal(model(ids, cache=cache), fresh)


def test_wrong_batch_dtype_device_and_tokens_are_refused(model):
    cache = model.new_cache(batch_size=2, max_len=8)
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(3, 2, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match="int64"):
        model(torch.zeros(2, 2), cache=cache)
    with pytest.raises(ValueError, match="token ids"):
        model(torch.full((2, 2), model.cfg.vocab_size), cache=cache)
    other = labkit.build("tiny-qwen3.5", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        other(torch.zeros(2, 2, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="configuration"):
        labkit.build("tiny-lfm2", dtype=torch.float32)(torch.zeros(2, 2, dtype=torch.long), cache=cache)


def test_state_sizes(model):
    cfg = model.cfg
    cache = model.new_cache(batch_size=2, max_len=64)
    gdn = cfg.layer_types.index("gdn")
    attn = cfg.layer_types.index("attention")
    assert cache.recurrent_states[gdn].shape == (2, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
    assert cache.recurrent_states[gdn].dtype == torch.float32
    assert cache.conv_states[gdn].shape == (2, cfg.gdn_conv_kernel - 1, cfg.gdn_conv_dim)
    assert cache.keys[attn].shape == (2, cfg.num_kv_heads, 64, cfg.head_dim)
