"""generate under misuse (issue 24 item 5): every argument checked at the door, with a message that
names the argument, the value and the fix, and a failed call leaves the given cache as it was."""

import pytest
import torch

import labkit


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-lfm2", dtype=torch.float32, seed=2)


@pytest.fixture
def prompt(model):
    return torch.randint(0, model.cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("ids, error, message", [
    (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, r"input_ids .*\[batch, T\].*shape \(1, 2, 3\)"),
    (torch.tensor(5), ValueError, r"input_ids .*got shape \(\)"),
    (torch.zeros(2, 0, dtype=torch.long), ValueError, r"non-empty.*shape \(2, 0\)"),
    ([[1, 2, 3]], TypeError, r"input_ids must be a tensor.*list.*torch.tensor"),
    (torch.ones(1, 3), TypeError, r"input_ids must be int64 or int32.*float32"),
    (torch.tensor([[263]]), ValueError, r"input_ids must be token ids in \[0, 263\).*\[263, 263\]"),
    (torch.tensor([-1]), ValueError, r"input_ids must be token ids in \[0, 263\).*\[-1, -1\]"),
])
def test_bad_prompts_are_refused_by_name(model, ids, error, message):
    with pytest.raises(error, match=message):
        labkit.generate(model, ids, max_new_tokens=2)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_new_tokens=2.5), ValueError, r"max_new_tokens must be an int >= 1, got 2.5"),
    (dict(max_new_tokens="3"), ValueError, r"max_new_tokens must be an int >= 1, got '3'"),
    (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be an int >= 1, got 0"),
    (dict(top_k=2.5, temperature=1.0), ValueError, r"top_k must be None or an int >= 1.*got 2.5"),
    (dict(top_k=0, temperature=1.0), ValueError, r"top_k .*got 0"),
    (dict(top_p=0.0, temperature=1.0), ValueError, r"top_p must be None or a number in \(0, 1\].*got 0.0"),
    (dict(top_p=1.5, temperature=1.0), ValueError, r"top_p .*got 1.5"),
    (dict(top_p=float("nan"), temperature=1.0), ValueError, r"top_p .*got nan"),
    (dict(temperature=-0.5), ValueError, r"temperature must be a finite number >= 0.*got -0.5"),
    (dict(temperature="0.7"), ValueError, r"temperature .*got '0.7'"),
    (dict(seed="1", temperature=1.0), TypeError, r"seed must be None or an int, got '1'"),
    (dict(stop_tokens=[10.7]), ValueError, r"stop tokens must be int token ids.*\[10.7\]"),
    (dict(stop_tokens=[torch.tensor(10.7)]), ValueError, r"stop tokens must be int token ids"),
    (dict(stop_tokens=torch.tensor([10.7])), TypeError, r"stop_tokens must be a list"),
    (dict(stop_tokens=["7"]), ValueError, r"stop tokens must be int token ids.*\['7'\]"),
    (dict(stop_tokens=7), TypeError, r"stop_tokens must be a list .*e.g. \[7\], got 7"),
    (dict(stop_tokens="7"), TypeError, r"stop_tokens must be a list"),
    (dict(pad_token_id=-1), ValueError, r"pad_token_id must be None .*\[0, 263\), got -1"),
    (dict(pad_token_id=263), ValueError, r"pad_token_id .*got 263"),
    (dict(pad_token_id=1.0), ValueError, r"pad_token_id .*got 1.0"),
    (dict(backend=["fused"]), ValueError, r"unknown backend \['fused'\]"),
    (dict(progress="no"), TypeError, r"progress must be None, True or False"),
    (dict(prefix_cache="yes"), TypeError, r"prefix_cache must be None or a labkit PrefixCache, got str"),
    (dict(cache={"keys": {}}), TypeError, r"cache must be None or a HybridCache.*dict"),
])
def test_bad_arguments_are_refused_by_name(model, prompt, kwargs, error, message):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=message):
        labkit.generate(model, prompt, **kwargs)


def test_a_non_model_is_refused(prompt):
    with pytest.raises(TypeError, match="model must be a labkit HybridLM.*dict"):
        labkit.generate({}, prompt, 2)


def test_stop_tokens_from_an_iterator_or_a_tensor_are_the_same(model, prompt):
    stop = int(labkit.generate(model, prompt, 3).tokens[0, 1])
    want = labkit.generate(model, prompt, 6, stop_tokens=[stop])
    for given in (iter([stop]), torch.tensor([stop]), [torch.tensor(stop)]):
        got = labkit.generate(model, prompt, 6, stop_tokens=given)
        assert torch.equal(got.tokens, want.tokens) and got.finished.tolist() == want.finished.tolist()


def _state(cache):
    return cache.seq_len, [b.clone() for b in cache.buffers()]


@pytest.mark.parametrize("kwargs, error", [
    (dict(backend="warp-drive"), ValueError),
    (dict(max_new_tokens=20), labkit.CacheFullError),
    (dict(stop_tokens=[10.7]), ValueError),
    (dict(top_k=2.5, temperature=1.0), ValueError),
])
def test_a_refused_call_leaves_the_given_cache_as_it_was(model, prompt, kwargs, error):
    cache = model.new_cache(2, max_len=10)
    labkit.generate(model, prompt, 5, cache=cache)
    length, buffers = _state(cache)
    with pytest.raises(error):
        labkit.generate(model, prompt, **{"max_new_tokens": 3, "cache": cache, **kwargs})
    assert cache.seq_len == length
    assert all(torch.equal(a, b) for a, b in zip(cache.buffers(), buffers))


def test_a_cache_of_another_batch_is_refused_before_it_is_reset(model, prompt):
    cache = model.new_cache(3, max_len=10)
    labkit.generate(model, torch.cat([prompt, prompt[:1]]), 3, cache=cache)
    with pytest.raises(ValueError, match="input batch 2 does not match the cache's batch 3"):
        labkit.generate(model, prompt, 3, cache=cache)
    assert cache.seq_len == 6
