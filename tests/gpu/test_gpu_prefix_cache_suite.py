"""The prefix-cache suite of tests/test_prefix_cache_suite.py at real shapes on the GPU: Qwen3.5-0.8B
in float32 (random weights), 64-token blocks, prompts of a few hundred tokens, the fused rungs.

    python -m pytest -q -s -m gpu tests/gpu/test_gpu_prefix_cache_suite.py
    python -m pytest -q -s -m gpu tests/gpu/test_gpu_prefix_cache_suite.py -k "offsets and not graph"   # a first check

Each case runs ``labkit.generate(..., prefix_cache=...)`` and holds it to the same rung without a
prefix cache: the same tokens and finished flags, the prefill's last-token logits within
:data:`TOL` of that rung's own prefills without a cache (see below), and the tokens restored stated per case
(read from the very prefill ``generate`` made). The cases: a hit at offsets 1, 2, 17, 63 and 64 past
3 cached blocks; prompts of 1, 63 and 64 tokens and ones that end on a boundary; a batch of 3 mixing
depths (fused, prefill and first token only: float32 decode kernels at batch 3 take minutes to
compile, and the CPU suite decodes such batches); eviction under a budget of a few snapshots for both
policies and both admissions; weights edited after snapshots were stored (refused); seeded
sampling; stop tokens.

The tolerance. A hit computes what a prefill without any cache computes when split at the
restored boundary (the first part's state, then the rest in a second call); random float32 weights
amplify the rounding of where such a split falls, layer by layer. Measured on a CPU at these shapes
(131 tokens, 2 blocks restored, the reference rung): the split prefill without a cache lands
1.02e-5 from the one-call prefill, and the hit lands exactly on the split (0.0). A wrong state
moves the logits by 1e-1 (a conv window one token off, on the shipped LFM2). So each hit is held to
:data:`TOL` from both no-cache prefills of its rung, one call and split; the errors are printed
(``-s``) for the record.

Greedy tokens with random weights can meet a genuine tie (top two logits closer than 1e-3 of the
spread, judged on the reference forward of the run without a cache): either token is then right,
and that sequence is compared no further (as in test_gpu_decode.py).

Cost: compiling the float32 kernels of Qwen3.5 at batch 1 (the chunked delta rule with and without
checkpoints, the decode step) is most of it, once per process: the module is one xdist group, so
one worker compiles and runs it all, first (``heavy``). The test functions were dry-run on a CPU
(tiny presets, Triton's interpreter, conftest's stand-in for CUDA graphs, ``DEVICE`` and ``BS``
set from outside: block 8 on tiny-lfm2, block 64 on tiny-qwen3.5 for the chunk kernel's checkpoints).
"""

import copy
import math

import pytest
import torch

import labkit
from labkit.bench.ops import rel_err
from labkit.decode.registry import make_decoder

from test_prefix_cache_suite import RecordingPrefixCache, generate_through, run_under_budget

PRESET = "qwen3.5-0.8b"
DEVICE = "cuda"
BS = 64
NEW = 6
TOL = 5e-5
TIE = 1e-3  # of the logits' standard deviation: a genuine tie of the top two
BACKENDS = ["fused", "fused+graph"]

# The first test compiles the float32 kernels of Qwen3.5 at batch 1 (test_gpu_decode.py's float32 case of that
# shape, with two rungs more, took 128 s cold): a limit above the folder's 170 s per test, so a cold
# compile is not cut short; a stall still ends the test.
pytestmark = [pytest.mark.xdist_group("prefix-cache-suite"), pytest.mark.heavy(seconds=120),
              pytest.mark.timeout(400, method="signal")]


@pytest.fixture(scope="module")
def model(real_model):
    return real_model(PRESET, torch.float32)


def _ids(vocab: int, length: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(DEVICE)


def _prefix(model, budget: float = math.inf, **kwargs) -> RecordingPrefixCache:
    return RecordingPrefixCache(model, BS, budget_bytes=budget, **kwargs)


_plain: dict = {}


def _plain_prefill(model, backend: str, ids: torch.Tensor, split: int = 0) -> torch.Tensor:
    """The rung's own last-token logits of the prompt without a prefix cache: in one prefill, or in
    two split after ``split`` tokens (what a hit computes: the first part's state, then the rest)."""
    key = (id(model), backend, ids.shape[0])
    if key not in _plain or _plain[key].model is not model:
        _plain[key] = make_decoder(backend, model, model.new_cache(ids.shape[0], 1024))
    decoder = _plain[key]
    decoder.cache.reset()
    if split:
        decoder.prefill(ids[:, :split])
    return decoder.prefill(ids[:, split:]).clone()


def _same_tokens(model, ids: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` == ``want`` row by row, up to a genuine tie (see the module's docstring)."""
    if torch.equal(got, want):
        return
    assert got.shape == want.shape, (got.shape, want.shape)
    with torch.no_grad():
        logits = model(torch.cat([ids, want], 1))[:, ids.shape[1] - 1 : -1].float()
    for b in range(got.shape[0]):
        diff = (got[b] != want[b]).nonzero()
        if len(diff):
            t = int(diff[0])
            row = logits[b, t]
            margin = float(row[want[b, t]] - row[got[b, t]])
            assert margin <= TIE * float(row.std()), (
                f"sequence {b}, step {t}: token {int(got[b, t])} instead of {int(want[b, t])}, whose logit is "
                f"higher by {margin:.3g} (spread {float(row.std()):.3g})")


def _check(model, prefix, ids, hit, backend, *, new=NEW, row_hits=None, **options):
    """``hit`` tokens restored (and ``row_hits``), the logits within TOL of both no-cache prefills, the
    tokens and finished flags of the same rung without a cache. Returns (the prefill, the result)."""
    pre, got = generate_through(model, prefix, ids, hit, backend, new, row_hits, **options)
    err = rel_err(pre.logits, _plain_prefill(model, backend, ids))
    split = rel_err(pre.logits, _plain_prefill(model, backend, ids, pre.restored)) if pre.restored else err
    print(f"{backend} T={ids.shape[1]} B={ids.shape[0]} restored {pre.restored}: logits {err:.2e} from no cache "
          f"in one prefill, {split:.2e} from no cache split there")
    assert err < TOL and split < TOL, f"logits {err:.2e} ({split:.2e} split) from no cache, {pre.restored} restored"
    want = labkit.generate(model, ids, new, backend=backend, progress=False, **options)
    if options.get("temperature"):
        assert torch.equal(got.tokens, want.tokens)  # a seeded draw: no tie to allow for
    else:
        _same_tokens(model, ids, got.tokens, want.tokens)
    assert torch.equal(got.finished, want.finished)
    return pre, got


@pytest.mark.parametrize("backend", BACKENDS)
def test_offsets_past_a_boundary(model, backend):
    v = model.cfg.vocab_size
    prefix = _prefix(model)
    stem = _ids(v, 4 * BS + 1)
    _check(model, prefix, stem, 0, backend)  # 4 blocks stored
    for tail in (1, 2, BS // 4 + 1, BS - 1, BS):
        _check(model, prefix, stem[:, : 3 * BS + tail], 3 * BS, backend, row_hits=[3 * BS])
    assert len(prefix) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_short_one_block_and_boundary_prompts(model, backend):
    v = model.cfg.vocab_size
    prefix = _prefix(model)
    ids = _ids(v, 4 * BS, seed=1)
    for length in (1, BS - 1):
        _check(model, prefix, ids[:, :length], 0, backend)
        _check(model, prefix, ids[:, :length], 0, backend)
    assert len(prefix) == 0 and prefix.nbytes == 0
    _check(model, prefix, ids[:, :BS], 0, backend)
    _check(model, prefix, ids[:, :BS], 0, backend)  # its last token runs: never a hit
    assert len(prefix) == 1
    _check(model, prefix, ids[:, : BS + 1], BS, backend)
    _check(model, prefix, ids, BS, backend)  # ends on its 4th boundary: 4 blocks stored
    _check(model, prefix, ids, 3 * BS, backend, row_hits=[3 * BS])  # the last block runs again
    assert len(prefix) == 4
    _check(model, prefix, torch.cat([ids, ids[:, :1]], 1), 4 * BS, backend)


def test_a_batch_mixing_depths(model):
    """Prefill and first token only, on the eager rung: a fused+graph decoder captures its decode step
    when made, which at batch 3 in float32 compiles for minutes (tests/gpu/test_gpu_decode.py)."""
    backend = "fused"
    v = model.cfg.vocab_size
    prefix = _prefix(model)
    T = 3 * BS + 5
    rows = [_ids(v, T, seed=s) for s in (10, 11, 12)]
    _check(model, prefix, rows[0], 0, backend, new=1)
    _check(model, prefix, rows[1][:, : BS + 5], 0, backend, new=1)
    batch = torch.cat(rows)
    _check(model, prefix, batch, 0, backend, new=1, row_hits=[3 * BS, BS, 0])
    _check(model, prefix, batch, 3 * BS, backend, new=1, row_hits=[3 * BS] * 3)
    mixed = torch.cat([rows[1], rows[0], torch.cat([rows[2][:, :BS], _ids(v, T - BS, seed=13)], 1)])
    _check(model, prefix, mixed, BS, backend, new=1, row_hits=[3 * BS, 3 * BS, BS])


@pytest.mark.parametrize("admission", ["every", "ends"])
@pytest.mark.parametrize("policy", ["lru", "flops"])
def test_eviction_under_a_small_budget(model, policy, admission):
    v = model.cfg.vocab_size
    size = labkit.PrefixCache(model, BS, budget_bytes=math.inf).snapshot_bytes
    prefix = _prefix(model, budget=3 * size + size // 2, policy=policy, admission=admission)
    stem = _ids(v, 2 * BS, seed=20)
    prompts = [torch.cat([stem, _ids(v, BS + 3, seed=s)], 1) if s % 2 else _ids(v, 3 * BS + 3, seed=s)
               for s in (21, 23, 22, 21, 24, 23)]
    hits = run_under_budget(prefix, prompts, lambda ids, hit: _check(model, prefix, ids, hit, "fused", new=3)[0])
    if admission == "every":
        assert max(hits) >= 2 * BS, hits


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_edited_after_snapshots_are_refused(model, backend):
    edited = copy.deepcopy(model)  # its own weights: this test edits them
    try:
        _refused_after_edits(edited, backend)
    finally:  # the no-cache decoders made for the copy hold it: let it go
        for key in [k for k, d in _plain.items() if d.model is edited]:
            del _plain[key]


def _refused_after_edits(edited, backend):
    prefix = _prefix(edited)
    ids = _ids(edited.cfg.vocab_size, 2 * BS + 3, seed=30)
    _check(edited, prefix, ids, 0, backend, new=2)
    for _ in range(2):  # the second hit captures the restore and tail (fused+graph): the third replays
        _check(edited, prefix, ids, 2 * BS, backend, new=2)
    held = (len(prefix), prefix.nbytes)
    edited.embed.weight.data.mul_(1.001)  # no version counter moves: the fingerprint must see it
    # fused+graph launches the replay first and checks the weights while it runs: refused all the same
    with pytest.raises(ValueError, match="weights changed"):
        labkit.generate(edited, ids, 2, backend=backend, prefix_cache=prefix, progress=False)
    with torch.no_grad():
        edited.final_norm.weight.mul_(1.001)  # an edit torch counts
    with pytest.raises(ValueError, match="weights changed"):
        labkit.generate(edited, ids, 2, backend=backend, prefix_cache=prefix, progress=False)
    assert (len(prefix), prefix.nbytes) == held


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_sampling_and_stop_tokens(model, backend):
    v = model.cfg.vocab_size
    prefix = _prefix(model)
    ids = _ids(v, 3 * BS + 5, seed=40)
    sampling = dict(temperature=0.8, top_p=0.9, seed=1234)
    _check(model, prefix, ids, 0, backend, **sampling)
    _, got = _check(model, prefix, ids, 3 * BS, backend, **sampling)
    free = labkit.generate(model, ids, NEW, backend=backend, progress=False).tokens
    assert not torch.equal(got.tokens, free), "the sampling options drew the greedy tokens: nothing was sampled"
    stop = int(free[0, 3])
    _, got = _check(model, prefix, ids, 3 * BS, backend, stop_tokens=[stop])
    assert bool(got.finished[0]) and got.tokens.shape[1] <= 4  # it stopped early: the check could fail
