"""labkit.PrefixCache: restoring a cached prefix gives the logits and greedy tokens of no cache at all.

The truth is the model's one-shot forward over the whole prompt (no prefix cache) and labkit.generate;
a hit must match it within float32 rounding (1e-5 relative) and give identical greedy tokens. Each
test also checks the hit it reports, so a cache that silently misses cannot pass as exact, and one
test corrupts a stored snapshot to show that the comparison would catch a wrong restore.
"""

import pytest
import torch

import labkit
from conftest import rel_err
from labkit.decode.registry import make_decoder
from labkit.cache import HybridCache

BS = 8  # block size
NEW = 6  # greedy tokens compared


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ids(length, batch=1, seed=0):
    return torch.randint(0, 263, (batch, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _decoder(model, backend, batch, max_len=64):
    return make_decoder(backend, model, model.new_cache(batch, max_len))


def _greedy(decoder, logits, n=NEW):
    """n greedy tokens after a prefill's logits, as generate takes them (the backend's greedy step)."""
    step = decoder.step_greedy
    token, out = logits.argmax(-1), []
    for _ in range(n):
        out.append(token)
        token = step(token)
    return torch.stack(out, 1)


def _check_exact(model, backend, prefix, decoder, ids):
    """Prefill through ``prefix``; the logits and greedy tokens must be those of no prefix cache."""
    got = prefix.prefill(decoder, ids)
    assert rel_err(got.logits, model(ids)[:, -1]) < 1e-5
    want = labkit.generate(model, ids, NEW, backend=backend).tokens
    assert torch.equal(_greedy(decoder, got.logits), want)
    return got


@pytest.fixture(scope="module", params=["tiny-lfm2", "tiny-qwen3.5"])
def model(request):
    return labkit.build(request.param, dtype=torch.float32, device=DEVICE, seed=3)


@pytest.mark.parametrize(
    "backend,length", [("reference", 5), ("reference", 19), ("reference", 33), ("fused", 19), ("fused+graph", 33),
                       ("persistent", 19)]
)
def test_a_hit_is_exact(model, backend, length):
    if backend == "fused+graph" and DEVICE != "cuda":
        pytest.skip("captures CUDA graphs")
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    decoder = _decoder(model, backend, batch=3)
    ids = _ids(length, batch=3)
    miss = _check_exact(model, backend, prefix, decoder, ids)
    hit = _check_exact(model, backend, prefix, decoder, ids)
    blocks = (length - 1) // BS  # the last token always runs
    assert miss.restored == 0 and hit.restored == blocks * BS and hit.row_hits == [blocks * BS] * 3
    assert len(prefix) == 3 * (length // BS)  # a snapshot per full block per row
    assert prefix.nbytes == len(prefix) * prefix.snapshot_bytes
    if length < BS:  # shorter than a block: nothing stored, nothing restored
        assert len(prefix) == 0 and prefix.lookup(ids[0]) == 0


def test_shared_prefixes_hit_per_row_and_the_batch_restores_the_shortest(model):
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    shared = _ids(16, seed=1)[0]
    a = torch.cat([shared, _ids(3, seed=2)[0]])[None]
    b = torch.cat([shared, _ids(11, seed=3)[0]])[None]
    one = _decoder(model, "reference", batch=1)
    _check_exact(model, "reference", prefix, one, a)
    assert prefix.lookup(b[0]) == 16
    assert _check_exact(model, "reference", prefix, one, b).restored == 16
    # A batch of a 16-token hit, a 24-token hit and a miss: every row restores the shortest (0).
    c = torch.cat([b, torch.cat([shared, _ids(11, seed=3)[0][:8], _ids(3, seed=4)[0]])[None], _ids(27, seed=5)])
    got = _check_exact(model, "reference", prefix, _decoder(model, "reference", batch=3), c)
    assert got.row_hits == [24, 24, 0] and got.restored == 0
    # All three rows now cached: the batch restores each row's own 24 tokens.
    assert _check_exact(model, "reference", prefix, _decoder(model, "reference", batch=3), c).restored == 24


def test_a_whole_block_prompt_still_runs_its_last_token(model):
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    ids = _ids(BS)
    decoder = _decoder(model, "reference", batch=1)
    _check_exact(model, "reference", prefix, decoder, ids)
    assert len(prefix) == 1 and prefix.lookup(ids[0]) == 0  # stored for longer prompts, not restored for this one
    assert _check_exact(model, "reference", prefix, decoder, ids).restored == 0
    assert prefix.lookup(torch.cat([ids[0], ids[0, :1]])) == BS


def test_a_corrupted_snapshot_is_caught_by_the_comparison(model):
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    decoder = _decoder(model, "reference", batch=1)
    ids = _ids(19)
    _check_exact(model, "reference", prefix, decoder, ids)
    node = prefix.root.children[tuple(ids[0, :BS].tolist())].children[tuple(ids[0, BS : 2 * BS].tolist())]
    state = next(iter(node.recurrent_states.values()), None)
    (state if state is not None else next(iter(node.conv_states.values()))).add_(0.05)
    got = prefix.prefill(decoder, ids)
    assert got.restored == 16 and rel_err(got.logits, model(ids)[:, -1]) > 1e-4


@pytest.mark.parametrize("policy", ["lru", "flops"])
def test_an_eviction_storm_stays_in_budget_and_exact(model, policy):
    size = labkit.PrefixCache(model, BS, budget_bytes=10**8).snapshot_bytes
    prefix = labkit.PrefixCache(model, BS, budget_bytes=3 * size + size // 2, policy=policy)
    decoder = _decoder(model, "reference", batch=2)
    for seed in range(8):
        prefix.prefill(decoder, _ids(33, batch=2, seed=seed))  # 8 blocks of snapshots wanted per call
        assert prefix.nbytes <= prefix.budget_bytes and len(prefix) <= 3
    assert prefix.evictions > 0
    last = _ids(33, batch=2, seed=7)
    assert prefix.lookup(last[0]) > 0
    got = _check_exact(model, "reference", prefix, decoder, last)
    assert got.restored > 0


def test_lru_and_flops_evict_different_leaves(model):
    size = labkit.PrefixCache(model, BS, budget_bytes=10**8).snapshot_bytes
    kept = {}
    for policy in ("lru", "flops"):
        prefix = labkit.PrefixCache(model, BS, budget_bytes=3 * size, policy=policy)
        decoder = _decoder(model, "reference", batch=1)
        deep, shallow, new = _ids(17, seed=1), _ids(9, seed=2), _ids(9, seed=3)
        for ids in (deep, shallow, new):  # 2 + 1 snapshots fill the budget; the third prompt evicts one
            prefix.prefill(decoder, ids)
        kept[policy] = (prefix.lookup(torch.cat([deep[0], new[0, :1]])), prefix.lookup(torch.cat([shallow[0], new[0, :1]])))
    assert kept["lru"] == (8, 8)  # the deep path's leaf was least recently used
    assert kept["flops"] == (16, 0)  # the shallow leaf saves fewest FLOPs per byte


def test_bad_input_is_refused_and_changes_nothing(model):
    with pytest.raises(ValueError, match="smaller than one snapshot"):
        labkit.PrefixCache(model, BS, budget_bytes=100)
    with pytest.raises(ValueError, match="block_size"):
        labkit.PrefixCache(model, 0, budget_bytes=10**8)
    with pytest.raises(ValueError, match="policy"):
        labkit.PrefixCache(model, BS, budget_bytes=10**8, policy="random")
    prefix = labkit.PrefixCache(model, BS, budget_bytes=10**8)
    decoder = _decoder(model, "reference", batch=1, max_len=30)
    ids = _ids(19)
    prefix.prefill(decoder, ids)
    held, cached = (len(prefix), prefix.nbytes), [b.clone() for b in decoder.cache.buffers()]

    other = "tiny-qwen3.5" if model.cfg.name == "tiny-lfm2" else "tiny-lfm2"
    for wrong, match in [
        (labkit.build(other, dtype=torch.float32, device=DEVICE), "configuration"),
        (labkit.build(model.cfg.name, dtype=torch.bfloat16, device=DEVICE), "bfloat16"),
        (labkit.build(model.cfg.name, dtype=torch.float32, device=DEVICE, seed=9), "weights are not the ones"),
    ]:
        with pytest.raises(ValueError, match=match):
            prefix.prefill(_decoder(wrong, "reference", batch=1), ids)
    with pytest.raises(labkit.CacheFullError, match="max_len=30"):
        prefix.prefill(decoder, _ids(31))
    with pytest.raises(ValueError, match="batch"):
        prefix.prefill(decoder, _ids(19, batch=2))
    with pytest.raises(ValueError, match="token ids"):
        prefix.prefill(decoder, torch.full((1, 9), 263, device=DEVICE))
    with pytest.raises(ValueError, match="cache made by the model"):  # the right model, a foreign cache
        prefix.prefill(make_decoder("reference", model, HybridCache(model.cfg, 1, 30, torch.bfloat16, DEVICE)), ids)
    for host in (ids.cpu()[:, :18], ids.cpu().float(), ids.cpu()[0]):  # another prompt's shape, or not ids
        with pytest.raises(ValueError, match="host_ids"):
            prefix.prefill(decoder, ids, host_ids=host)
    # the refused calls stored nothing and left the decoder's cache as the miss did
    assert (len(prefix), prefix.nbytes) == held
    assert all(torch.equal(a, b) for a, b in zip(cached, decoder.cache.buffers()))
    assert _check_exact(model, "reference", prefix, decoder, ids).restored == 16


def test_host_ids_handed_over_give_the_same_hit(model):
    """generate hands prefill the prompt it copied to the host for its own range check: the look-up
    then reads that copy, and the hit, its logits and what it stores are those of a call without it."""
    ids = _ids(3 * BS + 5, seed=4)
    plain, handed = labkit.PrefixCache(model, BS, 10**8), labkit.PrefixCache(model, BS, 10**8)
    want = [plain.prefill(_decoder(model, "reference", batch=1), ids) for _ in range(2)]  # a miss, then its hit
    got = [handed.prefill(_decoder(model, "reference", batch=1), ids, host_ids=ids.cpu()) for _ in range(2)]
    assert [g.restored for g in got] == [w.restored for w in want] == [0, 3 * BS]
    assert all(torch.equal(g.logits, w.logits) for g, w in zip(got, want))
    assert torch.isfinite(got[1].logits).all()
