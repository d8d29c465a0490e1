"""HybridCache bookkeeping at its bounds, through its own API (no model runs): sizes refused at
construction, batch mismatches either way, and a reset that really empties the host mirror."""

import pytest
import torch

import labkit
from labkit.cache import HybridCache


def _cache(batch_size=2, max_len=8, preset="tiny-qwen3.5"):
    return HybridCache(labkit.PRESETS[preset], batch_size, max_len, torch.float32, "cpu")


@pytest.mark.parametrize("batch_size,max_len,name", [(0, 8, "batch_size"), (2, 0, "max_len"), (-1, 8, "batch_size")])
def test_empty_caches_are_refused(batch_size, max_len, name):
    with pytest.raises(ValueError, match=name):
        _cache(batch_size, max_len)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_batch_of_another_size_is_refused(batch):
    with pytest.raises(ValueError, match="batch"):
        _cache(batch_size=2).check_room(batch, 1)


def test_room_is_counted_to_the_last_position():
    cache = _cache(max_len=8)
    cache.check_room(2, 8)
    with pytest.raises(labkit.CacheFullError, match="max_len=8"):
        cache.check_room(2, 9)
    cache.advance(5)
    assert cache.host_lengths == (5, 5) and cache.lengths.tolist() == [5, 5]
    cache.check_room(2, 3)
    with pytest.raises(labkit.CacheFullError, match="holds 5"):
        cache.check_room(2, 4)


def test_reset_empties_the_host_lengths_and_every_buffer():
    cache = _cache(max_len=8)
    for buf in cache.buffers():
        buf.fill_(1)
    cache.advance(7)
    cache.reset()
    assert cache.host_lengths == (0, 0) and cache.seq_len == 0
    cache.check_room(2, 8)  # the whole length is free again
    assert all(not buf.any() for buf in cache.buffers())
    assert len(cache.buffers()) == len(cache.keys) + len(cache.values) + len(cache.conv_states) + len(
        cache.recurrent_states) + 1


def test_advance_host_leaves_the_device_lengths_to_the_graph():
    cache = _cache()
    cache.advance_host(3)
    assert cache.host_lengths == (3, 3) and cache.lengths.tolist() == [0, 0]
