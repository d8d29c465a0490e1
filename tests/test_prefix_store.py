"""labkit.prefix_store: the snapshot layout, the slot pools, and the span tables that move snapshots,
each against plain tensor slicing (the prefix cache's own tests check whole prefills)."""

import numpy as np
import pytest
import torch

import labkit
from labkit.cache import HybridCache
from labkit.prefix_store import ALIGN, CacheSpans, SlotPool, SnapshotLayout, state_sources, store_states

BS = 5  # an odd block: the KV rows are not multiples of 16 bytes for every model


@pytest.fixture(scope="module", params=["tiny-qwen3.5", "tiny-lfm2"])
def cfg(request):
    return labkit.PRESETS[request.param]


def _filled_cache(cfg, batch=3, max_len=17, seed=0):
    cache = HybridCache(cfg, batch, max_len, torch.float32, "cpu")
    gen = torch.Generator().manual_seed(seed)
    for buf in cache.buffers()[:-1]:
        buf.copy_(torch.randn(buf.shape, generator=gen))
    return cache


def test_the_layout_holds_every_piece_once_and_aligned(cfg):
    layout = SnapshotLayout(cfg, torch.float32, BS)
    probe = HybridCache(cfg, 1, BS, torch.float32, "meta")
    for pieces, size in ((layout.kv_pieces, layout.kv_bytes), (layout.state_pieces, layout.state_bytes)):
        ends = [p.offset + p.nbytes for p in pieces]
        assert all(p.offset % ALIGN == 0 for p in pieces) and size % ALIGN == 0
        assert all(a <= b.offset for a, b in zip(ends, pieces[1:])) and (not ends or ends[-1] <= size)
    kv = sum(b.numel() * b.element_size() for b in [*probe.keys.values(), *probe.values.values()])
    states = sum(b.numel() * b.element_size() for b in [*probe.conv_states.values(), *probe.recurrent_states.values()])
    assert sum(p.nbytes for p in layout.kv_pieces) == kv and sum(p.nbytes for p in layout.state_pieces) == states


def test_stored_then_restored_spans_move_exactly_the_cache_slices(cfg):
    layout = SnapshotLayout(cfg, torch.float32, BS)
    src, dst = _filled_cache(cfg, seed=1), _filled_cache(cfg, seed=2)
    pool_kv, pool_states = SlotPool(layout.kv_bytes, torch.device("cpu")), SlotPool(layout.state_bytes, torch.device("cpu"))
    rows, depths = np.array([2, 0]), np.array([1, 2])
    kv = [pool_kv.take() for _ in rows]
    st = [pool_states.take() for _ in rows]
    addresses = lambda slots: np.array([s.address for s in slots], dtype=np.int64)  # noqa: E731
    CacheSpans.of(src, layout).kv(rows, depths, addresses(kv), to_slot=True).run()
    sources = state_sources(layout, {i: s[:, None] for i, s in src.conv_states.items()},
                            {i: s[:, None] for i, s in src.recurrent_states.items()})
    store_states(layout, sources, rows, addresses(st), torch.device("cpu")).run()
    for slot, r, d in zip(kv, rows, depths):  # the slot's views hold the cache's block
        views = layout.views(slot, ("keys", "values"))
        for i in src.keys:
            assert torch.equal(views["keys"][i], src.keys[i][r, :, d * BS:(d + 1) * BS])
            assert torch.equal(views["values"][i], src.values[i][r, :, d * BS:(d + 1) * BS])
    spans = CacheSpans.of(dst, layout)
    spans.kv(np.array([1, 1]), np.array([0, 1]), addresses(kv), to_slot=False).run()
    spans.states_to_cache(np.array([1]), addresses(st[:1])).run()
    for i in src.keys:  # sequence 1 of dst, blocks 0 and 1, from the two snapshots; the rest untouched
        assert torch.equal(dst.keys[i][1, :, :BS], src.keys[i][2, :, BS:2 * BS])
        assert torch.equal(dst.values[i][1, :, BS:2 * BS], src.values[i][0, :, 2 * BS:3 * BS])
        assert not torch.equal(dst.keys[i][0], src.keys[i][0])
    for i in src.conv_states:
        assert torch.equal(dst.conv_states[i][1], src.conv_states[i][2])
    for i in src.recurrent_states:
        assert torch.equal(dst.recurrent_states[i][1], src.recurrent_states[i][2])


def test_a_pool_reuses_and_releases_its_slots():
    pool = SlotPool(48, torch.device("cpu"))
    a, b = pool.take(), pool.take()
    assert pool.reserved == 96 and a.address != b.address
    pool.give(a)
    assert pool.take() is a and pool.reserved == 96  # reused, nothing allocated
    pool.give(b)
    pool.release_free()
    assert pool.reserved == 48 and not pool.free


def test_boundary_states_that_do_not_fit_the_layout_are_refused(cfg):
    layout = SnapshotLayout(cfg, torch.float32, BS)
    cache = _filled_cache(cfg)
    conv = {i: s[:, None] for i, s in cache.conv_states.items()}
    recurrent = {i: s[:, None] for i, s in cache.recurrent_states.items()}
    layer = next(iter(conv))
    with pytest.raises(RuntimeError, match="no conv state was read"):
        state_sources(layout, {k: v for k, v in conv.items() if k != layer}, recurrent)
    with pytest.raises(RuntimeError, match="a snapshot needs"):
        state_sources(layout, {**conv, layer: conv[layer].to(torch.bfloat16)}, recurrent)
    strided = conv[layer].repeat_interleave(2, dim=-1)[..., ::2]  # the same values, not contiguous
    with pytest.raises(RuntimeError, match="contiguous: False"):
        state_sources(layout, {**conv, layer: strided}, recurrent)
    with pytest.raises(RuntimeError, match="disagree on the number of boundaries"):
        state_sources(layout, {**conv, layer: conv[layer].expand(-1, 2, -1, -1).contiguous()}, recurrent)
