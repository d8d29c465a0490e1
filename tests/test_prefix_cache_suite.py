"""Hybrid prefix caching, edge by edge, on the shipped trained checkpoints: a correctness suite.

Serving engines break exactly at these edges: vLLM's hybrid cache gave NaN logits after a hit a few
tokens past a block boundary, 0% hits for prefixes shorter than its blocks, and wrong output with
prefix caching and speculative decoding; SGLang's Mamba radix cache gave zero hits on identical
prompts. Here every case runs ``labkit.generate(..., prefix_cache=...)`` as a user would and holds it
to the run without a prefix cache:

- the same tokens (greedy, or sampled with a seed) and the same finished flags (stop tokens);
- the prefill's last-token logits within 1e-5 relative of the one-shot forward (NaN fails);
- the hit where it belongs: the tokens restored (the prefill's ``restored`` and ``row_hits``, read
  from the very call ``generate`` made, and ``GenerationResult.prefix_hit``), stated per case, so a
  cache that silently misses cannot pass as exact.

The cases: (1) a hit at every offset 1..block past a boundary; (2) prompts shorter than a block and
of exactly one block; (3) prompts that end on a boundary; (4) batches mixing hits and misses at
different depths, and identical rows; (5) eviction under a budget of a few snapshots, for both
policies and both admissions; (6) weights changed after snapshots were stored (refused, by the
contract in labkit/prefix_cache.py's docstring); (7) seeded sampling; (8) stop tokens.

Backends on a CPU: ``reference`` (its prefill lends its cores: the snapshots are read during one
prefill of the rest) and ``reference+graph`` through conftest's stand-in for CUDA graphs (it lends
none: the prefix cache prefills block by block through it), both families, every case. ``fused``
runs its kernels in Triton's interpreter at ~1 s per LFM2 prefill and ~13 s per Qwen3.5 prefill on
this 2-core machine, so it is here for LFM2 at two offsets only; the GPU twin
(tests/gpu/test_gpu_prefix_cache_suite.py) runs fused and fused+graph at the real shapes.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import labkit
from conftest import RecordingGraphs, rel_err, shipped_float32
from labkit.decode import graphs as graph_seam
from labkit.decode.registry import make_decoder
from labkit.tokenizer import ByteTokenizer
from labkit.weights import weights_key

BS = 8  # block size: small, so that a loop over every offset of a block is cheap
NEW = 3  # tokens generated per case: the first from the prefill's logits, two decode steps after it
TOL = 1e-5  # relative error of the last-token logits against the one-shot forward

# Prompts are Python source (what the checkpoints were trained on), so the greedy choices are
# confident: a token that changes means a wrong state, not a near tie.
TEXTS = [
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n",
    "import os\nimport sys\n\n\ndef main(argv):\n    path = argv[1]\n    with open(path) as f:\n        return f.read()\n",
    "    if not isinstance(key, str):\n        raise TypeError('key must be a string')\n    return self._data[key]\n",
    "for i in range(10):\n    print(i * i, end=' ')\nprint()\n# the squares of the first ten integers\n",
    "try:\n    import json\nexcept ImportError:\n    json = None\n\n\ndef dump(obj, fp):\n    fp.write(json.dumps(obj))\n",
]
_TOKENIZER = ByteTokenizer()


def _text(i: int, length: int, batch: int = 1) -> torch.Tensor:
    """The first ``length`` ids of text ``i`` (its <bos> first), as a [batch, length] prompt."""
    ids = _TOKENIZER.encode(TEXTS[i])
    assert len(ids) >= length, (i, len(ids), length)
    return torch.tensor([ids[:length]] * batch)


def _join(*parts: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts, dim=1)


class RecordingPrefixCache(labkit.PrefixCache):
    """A PrefixCache that keeps what each of its prefills returned (the logits cloned: a graph
    replay overwrites them), so a test reads the restored length of the very call ``generate`` made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list = []

    def prefill(self, decoder, input_ids, **kwargs):
        out = super().prefill(decoder, input_ids, **kwargs)
        self.seen.append(type(out)(out.logits.clone(), out.restored, list(out.row_hits)))
        return out


def _prefix(model, budget: float = math.inf, **kwargs) -> RecordingPrefixCache:
    return RecordingPrefixCache(model, BS, budget_bytes=budget, **kwargs)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(labkit.CHECKPOINTS))
def model(request):
    return shipped_float32(request.param)


@pytest.fixture(params=["reference", "reference+graph"])
def backend(request, monkeypatch):
    """The CPU rungs: reference lends its prefill cores (snapshots read inside one prefill of the
    rest), reference+graph lends none (the prefix cache prefills it block by block); its decode
    step is captured and replayed through the recording stand-in for CUDA graphs."""
    if request.param == "reference+graph":
        monkeypatch.setattr(graph_seam, "GRAPHS", RecordingGraphs())
    return request.param


_truths: dict = {}


def _no_cache(model, ids: torch.Tensor, new: int, options: dict):
    """(tokens, finished, last-token logits) of the reference rung without a prefix cache, remembered
    per weights and prompt (the key holds the model's weights key: an edited model gets its own
    truth). Every rung is held to it: each decodes the reference's tokens without a cache
    (test_shipped_checkpoints), so a difference here is the prefix cache's."""
    chosen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(options.items()))
    key = (weights_key(model), new, chosen, tuple(ids.shape), ids.numpy().tobytes())
    if key not in _truths:
        out = labkit.generate(model, ids, new, backend="reference", progress=False, **options)
        with torch.no_grad():
            logits = model(ids)[:, -1]
        _truths[key] = (out.tokens, out.finished, logits)
    return _truths[key]


def generate_through(model, prefix: RecordingPrefixCache, ids: torch.Tensor, hit: int | None, backend: str,
                     new: int, row_hits: list[int] | None, **options):
    """``generate`` through ``prefix``, which it must prefill through once, restoring ``hit`` tokens
    (None: not stated) and, per row, ``row_hits`` (None: not stated). Returns (the prefill, the result)."""
    before = len(prefix.seen)
    got = labkit.generate(model, ids, new, backend=backend, prefix_cache=prefix, progress=False, **options)
    assert len(prefix.seen) == before + 1, "generate did not prefill through the prefix cache once"
    pre = prefix.seen[-1]
    assert got.prefix_hit == pre.restored
    if hit is not None:
        assert pre.restored == hit, (pre.restored, pre.row_hits, hit)
    if row_hits is not None:
        assert pre.row_hits == row_hits
    return pre, got


def _check(model, prefix: RecordingPrefixCache, ids: torch.Tensor, hit: int | None, *, backend: str = "reference",
           new: int = NEW, row_hits: list[int] | None = None, **options):
    """:func:`generate_through` ``prefix``, then the tokens and finished flags of no prefix cache and the
    prefill's logits within TOL of the one-shot forward. Returns (the prefill, the result)."""
    pre, got = generate_through(model, prefix, ids, hit, backend, new, row_hits, **options)
    tokens, finished, logits = _no_cache(model, ids, new, options)
    err = rel_err(pre.logits, logits)
    assert err < TOL, f"logits {err:.2e} from no cache after restoring {pre.restored} tokens"
    assert torch.equal(got.tokens, tokens), (got.tokens, tokens)
    assert torch.equal(got.finished, finished)
    return pre, got


def held_bytes(prefix) -> int:
    """The bytes the trie's nodes hold, summed over their own tensors (not the cache's counter)."""
    total, stack = 0, list(prefix.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        total += node.nbytes
    return total


# 1 --------------------------------------------------------------------------------------------------
def test_a_hit_is_exact_at_every_offset_past_a_boundary(model, backend):
    """A prompt of 2 cached blocks and a tail of 1..BS tokens: 16 tokens restored every time (a tail
    of BS runs a whole block after the restore, a shorter one has no boundary in it)."""
    prefix = _prefix(model)
    stem = _text(0, 3 * BS + 1)
    _check(model, prefix, stem, 0, backend=backend)  # stores 3 blocks
    assert len(prefix) == 3
    for tail in range(1, BS + 1):
        _check(model, prefix, stem[:, : 2 * BS + tail], 2 * BS, backend=backend, row_hits=[2 * BS])
    # every prompt was a prefix of the first: nothing new stored, nothing duplicated
    assert len(prefix) == 3 and prefix.nbytes == held_bytes(prefix) == 3 * prefix.snapshot_bytes
    # one block cached: offsets past the first boundary restore 8 (spot-checked both kinds of tail)
    for tail in (1, BS):
        _check(model, prefix, stem[:, : BS + tail], BS, backend=backend)


# 2 --------------------------------------------------------------------------------------------------
def test_prompts_shorter_than_a_block_never_hit_and_store_nothing(model, backend):
    prefix = _prefix(model)
    for length in (1, BS - 1):
        for _ in range(2):  # the repeat of an identical short prompt misses too
            _check(model, prefix, _text(1, length), 0, backend=backend, row_hits=[0])
        assert len(prefix) == 0 and prefix.nbytes == 0
    # one block exactly: stored (for longer prompts), never restored for itself (its last token runs)
    one = _text(1, BS)
    for _ in range(2):
        _check(model, prefix, one, 0, backend=backend, row_hits=[0])
    assert len(prefix) == 1 and prefix.nbytes == prefix.snapshot_bytes
    # a shorter prompt inside that cached block still misses, cleanly; one token more hits the block
    _check(model, prefix, _text(1, BS - 3), 0, backend=backend)
    _check(model, prefix, _text(1, 1), 0, backend=backend)
    _check(model, prefix, _text(1, BS + 1), BS, backend=backend)
    assert len(prefix) == 1


# 3 --------------------------------------------------------------------------------------------------
def test_a_prompt_ending_on_a_boundary_reruns_its_last_block(model, backend):
    prefix = _prefix(model)
    three = _text(2, 3 * BS)
    _check(model, prefix, three, 0, backend=backend)
    assert len(prefix) == 3
    held = prefix.nbytes
    # the same prompt again: its last token must run, so the last block is recomputed (2 restored)
    assert prefix.lookup(three[0]) == 2 * BS
    _check(model, prefix, three, 2 * BS, backend=backend, row_hits=[2 * BS])
    assert len(prefix) == 3 and prefix.nbytes == held  # the recomputed block's snapshot was found, not stored twice
    _check(model, prefix, _text(2, 3 * BS + 1), 3 * BS, backend=backend)  # one token more: all three
    _check(model, prefix, _text(2, 2 * BS), BS, backend=backend)  # an earlier boundary
    _check(model, prefix, _text(2, 4 * BS), 3 * BS, backend=backend)  # the next boundary: stores its 4th
    assert len(prefix) == 4


# 4 --------------------------------------------------------------------------------------------------
def test_a_batch_mixing_hits_and_misses_restores_its_shortest_row(model, backend):
    prefix = _prefix(model)
    T = 3 * BS + 3
    _check(model, prefix, _text(0, T), 0, backend=backend)  # 3 blocks of text 0
    _check(model, prefix, _text(1, BS + 3), 0, backend=backend)  # 1 block of text 1
    batch = torch.cat([_text(0, T), _text(1, T), _text(2, T)])  # cached 3, 1, 0 blocks deep
    _check(model, prefix, batch, 0, backend=backend, row_hits=[3 * BS, BS, 0])
    assert [prefix.lookup(row) for row in batch] == [3 * BS] * 3  # the miss stored every row's blocks
    _check(model, prefix, batch, 3 * BS, backend=backend, row_hits=[3 * BS] * 3)
    # rows cached 3, 3 and 1 blocks deep (the third leaves text 2 after its first block): 1 restored
    third = _join(_text(2, BS), _text(3, T)[:, BS:])
    mixed = torch.cat([_text(1, T), _text(0, T), third])
    _check(model, prefix, mixed, BS, backend=backend, row_hits=[3 * BS, 3 * BS, BS])
    # identical rows: one path stored for all three, then every row hits it
    size = len(prefix)
    same = _text(4, T, batch=3)
    _check(model, prefix, same, 0, backend=backend, row_hits=[0] * 3)
    assert len(prefix) == size + 3
    _check(model, prefix, same, 3 * BS, backend=backend, row_hits=[3 * BS] * 3)


# 5 --------------------------------------------------------------------------------------------------
def best_possible(seen: list[torch.Tensor], ids: torch.Tensor, block: int) -> int:
    """The longest restore any cache could give ``ids`` after the prompts ``seen``: the blocks shared
    with one of them, within both prompts' whole blocks and the (T - 1) // block a prefill may restore."""
    best, usable = 0, (ids.shape[1] - 1) // block
    for old in seen:
        n = 0
        while (n < min(usable, old.shape[1] // block)
               and torch.equal(old[:, n * block : (n + 1) * block], ids[:, n * block : (n + 1) * block])):
            n += 1
        best = max(best, n * block)
    return best


def run_under_budget(prefix, prompts: list[torch.Tensor], check) -> list[int]:
    """Each prompt through ``check(ids, hit)`` (which holds it to no cache, ``hit`` tokens restored,
    and returns the prefill), where ``hit`` is what the trie holds for it just before: never more than
    any cache could restore (:func:`best_possible`), the byte counter equal to the trie's bytes and
    within the budget after each. The budget must have bitten: evictions, and some hit shorter than
    an unbounded cache's. Returns the hits."""
    seen, hits, shorter = [], [], 0
    for ids in prompts:
        pre = check(ids, prefix.lookup(ids[0]))
        best = best_possible(seen, ids, prefix.block_size)
        assert pre.restored <= best
        shorter += pre.restored < best
        hits.append(pre.restored)
        seen.append(ids)
        assert prefix.nbytes == held_bytes(prefix) <= prefix.budget_bytes
    assert prefix.evictions > 0 and shorter > 0, (hits, prefix.evictions)
    return hits


# every policy and admission on the rung that lends its cores; the block-by-block path (its own
# admission bookkeeping) at one policy per admission
@pytest.mark.parametrize("backend, policy, admission", [
    ("reference", "lru", "every"), ("reference", "flops", "every"), ("reference", "lru", "ends"),
    ("reference", "flops", "ends"), ("reference+graph", "lru", "ends"), ("reference+graph", "flops", "every"),
], indirect=["backend"])
def test_eviction_under_a_budget_of_a_few_snapshots_stays_exact(model, backend, policy, admission):
    """A budget of 3.5 snapshots and prompts that share a 2-block stem: every result stays exact,
    hits come out shorter than an unbounded cache would give, the bytes stay within the budget."""
    size = labkit.PrefixCache(model, BS, budget_bytes=math.inf).snapshot_bytes
    prefix = _prefix(model, budget=3 * size + size // 2, policy=policy, admission=admission)
    stem = _text(0, 2 * BS)
    # odd texts: the stem and one block of their own (3 blocks); even ones: 3 blocks and a token, unrelated
    prompts = [_join(stem, _text(i, BS + 1)[:, 1:]) if i % 2 else _text(i, 3 * BS + 1)
               for i in (1, 3, 2, 1, 4, 3, 2, 5)]
    hits = run_under_budget(prefix, prompts, lambda ids, hit: _check(model, prefix, ids, hit, backend=backend)[0])
    if admission == "every":  # a prompt's chain fits the budget: the stem's blocks are restored
        assert max(hits) >= 2 * BS, hits


# 6 --------------------------------------------------------------------------------------------------
def _edit_in_place(m):
    with torch.no_grad():
        m.embed.weight.mul_(1.001)  # a version counter torch counts


def _edit_through_data(m):
    m.embed.weight.data.mul_(1.001)  # no version counter moves: the fingerprint sees it


def _edit_by_replacing(m):
    norm = m.final_norm
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 1.001)  # another tensor in its place


def _edit_by_loading(m):
    state = {k: v * 1.001 if k.endswith("norm.weight") else v for k, v in m.state_dict().items()}
    m.load_state_dict(state)  # copied in place: versions move


@pytest.mark.parametrize("edit", [_edit_in_place, _edit_through_data, _edit_by_replacing, _edit_by_loading],
                         ids=["in-place", "through-data", "replaced", "load-state-dict"])
def test_weights_changed_after_snapshots_are_refused(model, edit):
    """The contract: the same model after its weights changed is refused with a clear error (never a
    restore of stale states), by generate and by prefill, and nothing stored changes. A fresh cache
    on the edited model is exact again (the refusal is not a broken model)."""
    edited = copy.deepcopy(model)
    prefix = _prefix(edited)
    ids = _text(3, 2 * BS + 3)
    _check(edited, prefix, ids, 0)
    _check(edited, prefix, ids, 2 * BS)
    held = (len(prefix), prefix.nbytes, len(prefix.seen))
    edit(edited)
    with pytest.raises(ValueError, match="weights changed"):
        labkit.generate(edited, ids, NEW, prefix_cache=prefix, progress=False)
    with pytest.raises(ValueError, match="weights changed"):
        prefix.prefill(make_decoder("reference", edited, edited.new_cache(1, 32)), ids)
    assert (len(prefix), prefix.nbytes, len(prefix.seen)) == held
    fresh = _prefix(edited)
    _check(edited, fresh, ids, 0)
    _check(edited, fresh, ids, 2 * BS)


def test_weights_changed_are_refused_through_the_fused_decoders_key():
    """generate hands the fused rung's weights key to the prefix cache; an edit torch does not count
    (through ``.data``) must still be seen there. LFM2 only: its fused decoder is cheap to make."""
    model = shipped_float32("byte-lfm2-6m")
    prefix = _prefix(model)
    ids = _text(3, 2 * BS + 3)
    _check(model, prefix, ids, 0)  # stored by the reference rung: snapshots belong to the weights
    _edit_through_data(model)
    with pytest.raises(ValueError, match="weights changed"):
        labkit.generate(model, ids, 1, backend="fused", prefix_cache=prefix, progress=False)


# 7 --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend, options", [
    ("reference", dict(temperature=0.8, top_p=0.9, seed=1234)),
    ("reference+graph", dict(temperature=0.8, top_p=0.9, seed=1234)),
    ("reference", dict(temperature=1.3, top_k=20, seed=7)),
], ids=["reference-top-p", "reference+graph-top-p", "reference-top-k"], indirect=["backend"])
def test_seeded_sampling_draws_the_same_tokens_after_a_hit(model, backend, options):
    prefix = _prefix(model)
    ids = torch.cat([_text(5, 2 * BS + 5), _text(0, 2 * BS + 5)])
    new = 8
    _check(model, prefix, ids, 0, backend=backend, new=new, **options)
    _, got = _check(model, prefix, ids, 2 * BS, backend=backend, new=new, **options)
    greedy, _, _ = _no_cache(model, ids, new, {})
    assert not torch.equal(got.tokens, greedy), "the sampling options drew the greedy tokens: nothing was sampled"


# 8 --------------------------------------------------------------------------------------------------
def test_stop_tokens_stop_generation_at_the_same_place(model, backend):
    """Stop tokens taken from the run without a cache (a different step per row): with the cache,
    every row stops at the same step and the batch ends at the same length."""
    new = 12
    prefix = _prefix(model)
    ids = torch.cat([_text(0, 2 * BS + 2), _text(2, 2 * BS + 2), _text(4, 2 * BS + 2)])
    free, _, _ = _no_cache(model, ids, new, {})
    stops = sorted({int(free[0, 2]), int(free[1, 5]), int(free[2, 3])})
    _check(model, prefix, ids, 0, backend=backend, new=new, stop_tokens=stops)
    _, got = _check(model, prefix, ids, 2 * BS, backend=backend, new=new, stop_tokens=stops)
    assert bool(got.finished.all()) and got.tokens.shape[1] <= 6  # it did stop early: the check could fail
    # a stop at the very first token: one token, then done
    _, got = _check(model, prefix, ids[:1], 2 * BS, backend=backend, new=new, stop_tokens=[int(free[0, 0])])
    assert got.tokens.shape == (1, 1) and bool(got.finished[0])


# fused ----------------------------------------------------------------------------------------------
def test_fused_hits_after_a_boundary_are_exact_on_lfm2():
    """The fused rung's own prefill (the cores it lends, its continuation of a short tail) at the two
    kinds of tail: one token past the boundary, and a whole block."""
    model = shipped_float32("byte-lfm2-6m")
    prefix = _prefix(model)
    stem = _text(1, 3 * BS + 1)
    _check(model, prefix, stem, 0, backend="fused", new=1)
    _check(model, prefix, stem[:, : 2 * BS + 1], 2 * BS, backend="fused", new=2)  # one decode step after it
    _check(model, prefix, stem[:, : 3 * BS], 2 * BS, backend="fused", new=1)
