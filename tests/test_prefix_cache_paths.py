"""PrefixCache's faster paths and its surroundings, each against the run without a prefix cache.

- snapshots read during one prefill of the rest (the chunk kernel's state checkpoints where the
  block is a multiple of its chunk, the delta rule cut at boundaries elsewhere) are exact on both
  shipped checkpoints;
- a hit whose tail is shorter than a block replays a captured continuation prefill, and one whose
  tail reaches a boundary a captured prefill that reads the boundaries, the restore inside both
  (fused+graph; on a CPU through conftest's stand-in for CUDA graphs);
- ``labkit.generate(..., prefix_cache=...)`` reports its hit and keeps the tokens;
- the workloads are deterministic; the cache anatomy counts the right bytes; bf16 snapshots cost
  a measured error.
"""

import pytest
import torch

import labkit
from conftest import RecordingGraphs, rel_err
from labkit.decode import graphs as graph_seam
from labkit.lab import workloads
from labkit.decode.registry import make_decoder
from labkit.cache import bytes_by_kind
from labkit.ops import chunk_delta_rule as chunk_ops
from labkit.lab.snapshot_precision import snapshot_precision

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _ids(vocab, length, batch=1, seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.fixture(scope="module", params=labkit.available_checkpoints())
def trained(request):
    return labkit.load(labkit.checkpoint_path(request.param), dtype=torch.float32, device=DEVICE)


def _miss_then_hit(model, backend, block, batch, new_tokens):
    """A prompt of two blocks and a tail: the first prefill stores snapshots read while it ran, the
    second restores them; both give the one-shot forward's logits and generate's tokens."""
    prefix = labkit.PrefixCache(model, block, budget_bytes=10**9)
    decoder = make_decoder(backend, model, model.new_cache(batch, 2 * block + 16))
    ids = _ids(model.cfg.vocab_size, 2 * block + 5, batch=batch)
    want = model(ids)[:, -1]
    miss = prefix.prefill(decoder, ids)
    assert miss.restored == 0 and len(prefix) == 2 * batch
    assert rel_err(miss.logits, want) < 1e-5
    hit = prefix.prefill(decoder, ids)
    assert hit.restored == 2 * block and rel_err(hit.logits, want) < 1e-5
    out = labkit.generate(model, ids, new_tokens, backend=backend, prefix_cache=prefix)
    assert out.prefix_hit == 2 * block
    assert torch.equal(out.tokens, labkit.generate(model, ids, new_tokens, backend=backend).tokens)


def test_snapshots_of_one_prefill_are_exact_on_the_shipped_checkpoints(trained):
    _miss_then_hit(trained, "reference", block=16, batch=2, new_tokens=6)


@pytest.mark.parametrize("block", [64, 24])
def test_the_chunk_kernel_writes_the_snapshots_where_the_block_allows(block, monkeypatch):
    calls = []
    kernel = chunk_ops.chunk_delta_rule

    def spy(*args, **kwargs):
        calls.append(kwargs.get("checkpoint_every"))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(chunk_ops, "chunk_delta_rule", spy)
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device=DEVICE, seed=4)
    _miss_then_hit(model, "fused", block, batch=2, new_tokens=2)
    gdn = model.cfg.layer_types.count("gdn")
    # the miss: one kernel call per GDN layer with checkpoints every block (a multiple of the 64-token
    # chunk); otherwise the delta rule is cut at the boundaries (3 calls per layer), no checkpoints
    if block % 64 == 0:
        assert calls[:gdn] == [block] * gdn
    else:
        assert calls[: 3 * gdn] == [None] * (3 * gdn)


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_a_short_tail_replays_a_captured_continuation(preset, monkeypatch):
    """On a CPU through the stand-in (its captures counted); on a GPU through real CUDA graphs."""
    graphs = graph_seam.GRAPHS
    if DEVICE == "cpu":
        graphs = RecordingGraphs()
        monkeypatch.setattr(graph_seam, "GRAPHS", graphs)
    model = labkit.build(preset, dtype=torch.float32, device=DEVICE, seed=2)
    prefix = labkit.PrefixCache(model, 8, budget_bytes=10**8)
    shared = _ids(model.cfg.vocab_size, 16, seed=1)
    prompts = [torch.cat([shared, _ids(model.cfg.vocab_size, 3, seed=s)], 1) for s in (2, 3, 4)]
    outs = [labkit.generate(model, p, 4, backend="fused+graph", prefix_cache=prefix) for p in prompts]
    assert [o.prefix_hit for o in outs] == [0, 16, 16]
    for p, o in zip(prompts, outs):
        assert torch.equal(o.tokens, labkit.generate(model, p, 4, backend="reference").tokens)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 32))
    prefix.prefill(decoder, prompts[0])  # a hit of 16: the first of this tail shape runs eagerly
    prefix.prefill(decoder, prompts[2])  # the second captures it
    before = decoder.captures
    got = prefix.prefill(decoder, prompts[1])  # the third replays the capture
    assert decoder.captures == before and got.restored == 16
    assert rel_err(got.logits, model(prompts[1])[:, -1]) < 1e-5
    if DEVICE == "cpu":
        assert graphs.captures >= 2 and graphs.replays > 0


@pytest.mark.parametrize("block", [8, 64])
@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_a_tail_past_a_boundary_replays_the_restore_and_its_reading_in_one_graph(preset, block, monkeypatch):
    """A hit whose tail reaches a block boundary: the restore and the tail's prefill, its boundaries
    read for new snapshots, captured together (FusedPrefill.prefill_reading with before=) once the
    shape comes back, then replayed. The logits are no cache's, and the snapshot the replay read
    past the restored prefix restores exactly. Block 64 (the chunk kernel's checkpoints taken from a
    restored state) on a GPU only: the interpreter is slow at that length."""
    if block == 64 and DEVICE == "cpu":
        pytest.skip("block 64 runs on a GPU (the interpreter is slow at that length)")
    if DEVICE == "cpu":
        monkeypatch.setattr(graph_seam, "GRAPHS", RecordingGraphs())
    model = labkit.build(preset, dtype=torch.float32, device=DEVICE, seed=3)
    prefix = labkit.PrefixCache(model, block, budget_bytes=10**8)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 4 * block))
    shared = _ids(model.cfg.vocab_size, 2 * block, seed=1)
    prompts = [torch.cat([shared, _ids(model.cfg.vocab_size, block + 3, seed=s)], 1) for s in range(2, 6)]
    assert prefix.prefill(decoder, prompts[0]).restored == 0  # a miss: stores the shared blocks
    due = decoder.prefill_policy["capture_at"]
    for i, p in enumerate(prompts[1:], start=1):
        captures = decoder.prefill_captures
        got = prefix.prefill(decoder, p)
        assert got.restored == 2 * block and rel_err(got.logits, model(p)[:, -1]) < 1e-5
        assert decoder.prefill_captures - captures == (i == due)  # eager until due, then one capture
        assert len(decoder._reading_graphs) == (i >= due) + (due == 1)  # and the miss's, if it was due at once
        again = prefix.prefill(decoder, p)  # the block the tail's prefill read, restored
        assert again.restored == 3 * block and rel_err(again.logits, model(p)[:, -1]) < 1e-5


def test_workloads_are_deterministic_and_shaped():
    a = workloads.multi_turn(2, 3, 10, 4, 2, vocab=50, seed=1)
    assert a == workloads.multi_turn(2, 3, 10, 4, 2, vocab=50, seed=1)
    assert [(r.session, r.turn, len(r)) for r in a[:3]] == [("chat-0", 0, 10), ("chat-1", 0, 10), ("chat-0", 1, 16)]
    assert a[2].tokens[:10] == a[0].tokens  # a turn extends the chat's previous prompt
    shared = workloads.shared_prefix(3, 12, 2, vocab=50)
    assert all(r.tokens[:12] == shared[0].tokens[:12] for r in shared)
    assert workloads.reusable_tokens(shared, 4) == 2 * 12  # the first request only stores
    assert workloads.reusable_tokens(workloads.unrelated(4, 20, vocab=50), 4) == 0
    with pytest.raises(ValueError, match="vocab"):
        workloads.unrelated(2, 3, vocab=1)


def test_cache_anatomy_counts_the_buffers():
    cfg = labkit.PRESETS["qwen3.5-0.8b"]
    gdn = cfg.layer_types.count("gdn")
    one, long, batch = (bytes_by_kind(cfg, b, n) for b, n in [(1, 1024), (1, 4096), (3, 1024)])
    assert one["GDN state"] == gdn * 2**20  # 1 MiB of float32 per layer per sequence
    assert long["GDN state"] == one["GDN state"] and long["attention KV"] == 4 * one["attention KV"]
    assert batch["GDN state"] == 3 * one["GDN state"] and batch["attention KV"] == 3 * one["attention KV"]
    lfm = bytes_by_kind(labkit.PRESETS["lfm2-350m"], 1, 4096)
    assert lfm["GDN state"] == 0 and lfm["conv window"] > 0


def test_bf16_snapshots_halve_the_state_and_cost_a_measured_error():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device=DEVICE, seed=1)
    r = snapshot_precision(model, _ids(model.cfg.vocab_size, 20)[0], steps=4)
    assert r.state_bytes_rounded * 2 == r.state_bytes_float32 and r.bytes_saved > 0
    assert len(r.rel_err) == 4 and 0 < max(r.rel_err) < 0.1
    with pytest.raises(ValueError, match="no Gated DeltaNet"):
        snapshot_precision(labkit.build("tiny-lfm2", dtype=torch.float32, device=DEVICE), _ids(50, 8)[0], steps=2)


@pytest.mark.parametrize("policy", ["lru", "flops"])
def test_admission_at_ends_and_branch_points_is_exact_and_smaller(policy):
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device=DEVICE, seed=5)
    v, bs = model.cfg.vocab_size, 8
    every = labkit.PrefixCache(model, bs, budget_bytes=10**8, policy=policy)
    ends = labkit.PrefixCache(model, bs, budget_bytes=10**8, policy=policy, admission="ends")
    decoder = make_decoder("reference", model, model.new_cache(1, 48))
    shared = _ids(v, 16, seed=1)
    a = torch.cat([shared, _ids(v, 13, seed=2)], 1)  # 3 blocks + 5: states at depth 3 only
    b = torch.cat([shared, _ids(v, 11, seed=3)], 1)  # leaves a's path after 2 blocks: its branch point
    c = torch.cat([shared, _ids(v, 4, seed=4)], 1)
    for prefix in (every, ends):
        for ids, hit in [(a, 0), (b, 16 if prefix is every else 0), (c, 16), (a, 24)]:
            got = prefix.prefill(decoder, ids)
            assert got.restored == hit, (prefix.admission, hit, got.restored)
            assert rel_err(got.logits, model(ids)[:, -1]) < 1e-5
    # the same 4 blocks; states at a's end, b's end and their branch point (depth 2), not at depth 1
    assert len(ends) == len(every) == 4 and every.nbytes == 4 * every.snapshot_bytes
    assert ends.nbytes == 4 * ends.snapshot_bytes - ends._states_bytes
    with pytest.raises(ValueError, match="admission"):
        labkit.PrefixCache(model, bs, budget_bytes=10**8, admission="some")


def test_an_eviction_storm_with_admission_at_ends_stays_in_budget_and_exact():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device=DEVICE, seed=6)
    size = labkit.PrefixCache(model, 8, budget_bytes=10**8).snapshot_bytes
    # room for one prompt's two rows (4 blocks of KV + states at the end, each), not for six prompts
    prefix = labkit.PrefixCache(model, 8, budget_bytes=6 * size, policy="flops", admission="ends")
    decoder = make_decoder("reference", model, model.new_cache(2, 40))
    for seed in range(6):
        prefix.prefill(decoder, _ids(model.cfg.vocab_size, 33, batch=2, seed=seed))
        assert prefix.nbytes <= prefix.budget_bytes
    assert prefix.evictions > 0
    last = _ids(model.cfg.vocab_size, 33, batch=2, seed=5)
    got = prefix.prefill(decoder, last)
    assert got.restored == 32 and rel_err(got.logits, model(last)[:, -1]) < 1e-5
    out = labkit.generate(model, last, 4, backend="reference", prefix_cache=prefix)
    assert out.prefix_hit == 32 and torch.equal(out.tokens, labkit.generate(model, last, 4, backend="reference").tokens)
