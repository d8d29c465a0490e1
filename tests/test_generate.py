import importlib

import pytest
import torch

import labkit
from labkit.sampling import SamplingParams, sample


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-lfm2", dtype=torch.float32, seed=4)


def test_greedy_equals_argmax_of_the_full_forward(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0))
    out = labkit.generate(model, prompt, max_new_tokens=12)
    assert out.tokens.shape == (3, 12) and out.steps == 11 and out.prompt_len == 7
    # Re-run the whole sequence without a cache: each generated token must be its argmax.
    full = torch.cat([prompt, out.tokens], 1)
    logits = model(full)
    assert torch.equal(logits[:, 6:-1].argmax(-1), out.tokens)
    assert out.ttft_s > 0 and out.decode_tokens_per_s > 0
    assert out.prefill_s == out.ttft_s  # the older name of the same measurement
    assert out.wall_s == out.setup_s + out.ttft_s + out.decode_s


def test_sampling_is_reproducible_and_seed_dependent(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5))
    kw = dict(max_new_tokens=20, temperature=1.0, top_k=50, top_p=0.9)
    a = labkit.generate(model, prompt, seed=1, **kw).tokens
    b = labkit.generate(model, prompt, seed=1, **kw).tokens
    c = labkit.generate(model, prompt, seed=2, **kw).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_stop_tokens_end_each_sequence(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(3))
    free = labkit.generate(model, prompt, max_new_tokens=10).tokens
    stop = int(free[0, 2])
    out = labkit.generate(model, prompt, max_new_tokens=10, stop_tokens=[stop], pad_token_id=0)
    row = out.tokens[0].tolist()
    assert row[: row.index(stop) + 1] == free[0, : row.index(stop) + 1].tolist()
    assert all(t == 0 for t in row[row.index(stop) + 1 :])
    assert bool(out.finished[0])


def test_a_one_token_call_waits_for_the_device_at_its_first_token_and_not_after(model, monkeypatch):
    """Before set-up, after it and at the first token (written into the output inside the time to
    first token): three waits for generate(..., 1), none for decode steps it does not have; a longer
    call waits once more, after its steps. A first token that is a stop token ends the call there."""
    gen = importlib.import_module("labkit.generate")  # the module: labkit.generate is also the function

    waits = []
    real = gen._sync
    monkeypatch.setattr(gen, "_sync", lambda device: (waits.append(device), real(device)))
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(8))
    one = labkit.generate(model, prompt, 1)
    assert len(waits) == 3 and one.steps == 0 and one.tokens.shape == (2, 1)
    waits.clear()
    four = labkit.generate(model, prompt, 4)
    assert len(waits) == 4 and four.steps == 3 and torch.equal(four.tokens[:, :1], one.tokens)
    stopped = labkit.generate(model, prompt, 4, stop_tokens=one.tokens[:, 0].tolist())
    assert torch.equal(stopped.tokens, one.tokens) and bool(stopped.finished.all()) and stopped.steps == 0


def test_generate_reuses_a_given_cache_and_checks_its_size(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 6))
    cache = model.new_cache(1, max_len=10)
    a = labkit.generate(model, prompt, 5, cache=cache).tokens
    b = labkit.generate(model, prompt, 5, cache=cache).tokens
    assert torch.equal(a, b)
    with pytest.raises(labkit.CacheFullError):
        labkit.generate(model, prompt, 6, cache=cache)
    with pytest.raises(ValueError, match="unknown backend"):
        labkit.generate(model, prompt, 2, backend="warp-drive")


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 100)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sample(logits, SamplingParams(1.0, top_k=1), gen), logits.argmax(-1))
    assert torch.equal(sample(logits, SamplingParams(1.0, top_p=1e-6), gen), logits.argmax(-1))
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


@pytest.mark.parametrize("backend", ["reference", "fused"])
def test_stale_keys_and_values_are_never_read(backend):
    """generate resets a reused cache's states and lengths, not its keys and values (the prefill
    writes them before attention reads them): NaN left in every key and value of the cache, pooled
    or given, must not reach the tokens of the next prompt (batch 3, a shorter prompt than before)."""
    from labkit.decode.registry import leased_decoder

    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=5)  # attention and conv layers
    first, prompt = (torch.randint(0, model.cfg.vocab_size, (3, n), generator=torch.Generator().manual_seed(n))
                     for n in (11, 7))
    want = labkit.generate(model, prompt, 3, backend=backend, cache=model.new_cache(3, 10)).tokens

    def poison(cache):
        for t in (*cache.keys.values(), *cache.values.values()):
            t.fill_(float("nan"))

    given = model.new_cache(3, 14)
    labkit.generate(model, first, 3, backend=backend, cache=given)
    poison(given)
    assert torch.equal(labkit.generate(model, prompt, 3, backend=backend, cache=given).tokens, want)
    assert all(t.isnan().any() for t in given.keys.values())  # what was not overwritten stayed NaN
    labkit.generate(model, first, 3, backend=backend)  # a pooled backend keeps its cache for the next call
    with leased_decoder(backend, model, 3, 10) as (_, pooled):
        poison(pooled)
    assert torch.equal(labkit.generate(model, prompt, 3, backend=backend).tokens, want)
