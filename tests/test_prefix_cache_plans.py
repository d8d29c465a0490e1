"""PrefixCache's restore plans and snapshot slots: the span table of a hit is made once per (cache,
path) and reused, dropped with the nodes it restores; evicted slots are reused; none of it changes
what a hit computes (tokens equal to no cache)."""

import pytest
import torch

import labkit
from conftest import rel_err
from labkit.decode.registry import make_decoder
from labkit.prefix_cache import _PlanTable, _block_keys, block_key

BS = 8
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-qwen3.5", dtype=torch.float32, device=DEVICE, seed=3)


def _ids(length, batch=1, seed=0):
    return torch.randint(0, 263, (batch, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _decoder(model, batch=1, max_len=64):
    return make_decoder("reference", model, model.new_cache(batch, max_len))


def _table(prefix, decoder) -> dict:
    """The restore plans ``prefix`` keeps for the decoder's cache (empty if none)."""
    return decoder.cache.attachments.get(prefix._plans_key, _PlanTable()).plans


def _exact(model, prefix, decoder, ids, new=4):
    """A prefill through ``prefix`` gives no-cache logits, then no-cache greedy tokens."""
    got = prefix.prefill(decoder, ids)
    assert rel_err(got.logits, model(ids)[:, -1]) < 1e-5
    token, tokens = got.logits.argmax(-1), []
    for _ in range(new):
        tokens.append(token)
        token = decoder.step(token).argmax(-1)
    assert torch.equal(torch.stack(tokens, 1), labkit.generate(model, ids, new, backend="reference").tokens)
    return got


def test_block_keys_are_the_bytes_of_each_block():
    ids = torch.arange(20, dtype=torch.int32).reshape(1, 20)
    keys = _block_keys(ids, BS)[0]
    assert len(keys) == 2 and keys[1] == block_key(ids[0, 8:16]) == block_key(list(range(8, 16)))
    assert keys[0] == torch.arange(8, dtype=torch.int64).numpy().tobytes()


def test_a_second_identical_hit_reuses_the_plan(model):
    prefix, decoder, ids = labkit.PrefixCache(model, BS, budget_bytes=10**8), _decoder(model), _ids(27)
    prefix.prefill(decoder, ids)  # the miss stores 3 snapshots
    assert len(_table(prefix, decoder)) == 0
    first = _exact(model, prefix, decoder, ids)
    assert first.restored == 24
    (plan,) = _table(prefix, decoder).values()
    second = _exact(model, prefix, decoder, ids)
    assert second.restored == 24
    (again,) = _table(prefix, decoder).values()
    assert again is plan and plan.uses == 2 and len(plan.nodes) == 3
    # the trie still finds a node by the tuple of its tokens (the old key), through block_key
    assert prefix.root.children[tuple(ids[0, :BS].tolist())] is plan.nodes[0]


def test_a_plan_is_dropped_when_a_node_on_its_path_is_evicted(model):
    size = labkit.PrefixCache(model, BS, budget_bytes=10**8).snapshot_bytes
    prefix, decoder = labkit.PrefixCache(model, BS, budget_bytes=3 * size), _decoder(model)
    ids = _ids(27)
    prefix.prefill(decoder, ids)
    _exact(model, prefix, decoder, ids)  # a hit: one plan through the 3 nodes
    (plan,) = _table(prefix, decoder).values()
    prefix.prefill(decoder, _ids(9, seed=5))  # a full budget: one leaf of the first path goes
    assert prefix.evictions == 1 and len(_table(prefix, decoder)) == 0
    got = _exact(model, prefix, decoder, ids)  # shorter, and exact
    assert got.restored == 16
    (new,) = _table(prefix, decoder).values()
    assert new is not plan and len(new.nodes) == 2


def test_clear_drops_the_plans(model):
    prefix, decoder, ids = labkit.PrefixCache(model, BS, budget_bytes=10**8), _decoder(model), _ids(19)
    prefix.prefill(decoder, ids)
    prefix.prefill(decoder, ids)
    assert len(_table(prefix, decoder)) == 1
    prefix.clear()
    assert len(_table(prefix, decoder)) == 0 and len(prefix) == 0
    assert _exact(model, prefix, decoder, ids).restored == 0


def test_a_restore_is_one_span_table_of_every_piece(model):
    """A hit's plan copies each node's KV block head by head and the deepest node's states, one span
    each, and the snapshots it reads hold what the cache held at their boundaries."""
    prefix, decoder, ids = labkit.PrefixCache(model, BS, budget_bytes=10**8), _decoder(model), _ids(27)
    prefix.prefill(decoder, ids)
    stored = {i: decoder.cache.keys[i][0, :, :3 * BS].clone() for i in decoder.cache.keys}
    _exact(model, prefix, decoder, ids)
    (plan,) = _table(prefix, decoder).values()
    cfg, cache = model.cfg, decoder.cache
    heads = len(cache.keys) * 2 * cfg.num_kv_heads
    assert len(plan.spans) == 3 * heads + len(cache.conv_states) + len(cache.recurrent_states)
    for depth, node in enumerate(plan.nodes):
        for i, keys in node.keys.items():  # views of the node's slot
            assert torch.equal(keys, stored[i][:, depth * BS:(depth + 1) * BS])


def test_an_eviction_storm_then_a_restore_matches_no_cache(model):
    size = labkit.PrefixCache(model, BS, budget_bytes=10**8).snapshot_bytes
    prefix = labkit.PrefixCache(model, BS, budget_bytes=4 * size + size // 2, policy="flops")
    decoder = _decoder(model, batch=2)
    shared = _ids(16, batch=2, seed=100)
    for seed in range(10):  # hits on the shared blocks (plans made) between prompts that evict
        ids = torch.cat([shared, _ids(17, batch=2, seed=seed)], 1) if seed % 2 else _ids(33, batch=2, seed=seed)
        prefix.prefill(decoder, ids)
        assert prefix.nbytes <= prefix.budget_bytes
        live = {id(n) for n in _all_nodes(prefix)}
        assert all(id(n) in live for plan in _table(prefix, decoder).values() for n in plan.nodes)
    assert prefix.evictions > 0
    last = torch.cat([shared, _ids(17, batch=2, seed=9)], 1)
    assert _exact(model, prefix, decoder, last).restored > 0


def test_evicted_slots_are_reused_within_the_budget(model):
    """The pools grow to what the budget holds and then reuse the slots of evicted snapshots: a
    stream of unrelated prompts through a budget of three snapshots reserves no more memory."""
    size = labkit.PrefixCache(model, BS, budget_bytes=10**8).snapshot_bytes
    prefix, decoder = labkit.PrefixCache(model, BS, budget_bytes=3 * size), _decoder(model)
    reserved = []
    for seed in range(6):
        ids = _ids(25, seed=seed)
        prefix.prefill(decoder, ids)
        assert prefix.nbytes <= prefix.budget_bytes
        reserved.append(prefix.reserved_bytes)
    assert prefix.evictions > 0 and reserved[-1] == reserved[1] <= prefix.budget_bytes
    assert _exact(model, prefix, decoder, _ids(25, seed=5)).restored == 24
    prefix.clear()
    assert prefix.reserved_bytes == 0


def _all_nodes(prefix):
    out, stack = [], list(prefix.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def test_generate_passes_the_fused_decoders_weights_key(model, monkeypatch):
    from labkit import prefix_cache as pc_module

    prefix, ids = labkit.PrefixCache(model, BS, budget_bytes=10**8), _ids(19)
    want = labkit.generate(model, ids, 3, backend="fused").tokens
    labkit.generate(model, ids, 3, backend="fused", prefix_cache=prefix)  # the miss
    taken = []
    monkeypatch.setattr(pc_module, "weights_key", lambda m: taken.append(m) or pytest.fail("key taken twice"))
    out = labkit.generate(model, ids, 3, backend="fused", prefix_cache=prefix)
    assert out.prefix_hit == 16 and torch.equal(out.tokens, want) and not taken
