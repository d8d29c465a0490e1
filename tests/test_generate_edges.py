"""labkit.generate at its edges: stop tokens and padding per sequence, bounds checked before any work,
and the greedy fast path taken exactly when decoding is greedy."""

import pytest
import torch

import labkit
from labkit.decode import registry as backends
from labkit.decode.reference import ReferenceDecoder


@pytest.fixture(scope="module")
def model():
    return labkit.build("tiny-lfm2", dtype=torch.float32, seed=4)


@pytest.fixture(scope="module")
def prompt(model):
    return torch.randint(0, model.cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(3))


# Seeded sampling: a random tiny model's greedy output repeats one token, too few distinct ids to stop on.
SAMPLED = dict(temperature=1.0, seed=0)


@pytest.fixture(scope="module")
def free(model, prompt):
    """Tokens with no stop tokens: what every stopped run must agree with up to its stop."""
    tokens = labkit.generate(model, prompt, max_new_tokens=8, **SAMPLED).tokens
    assert len(set(tokens[0].tolist())) == 8 and not set(tokens[0].tolist()) & set(tokens[1].tolist())
    return tokens


def _unused_token(model, *runs):
    used = set(torch.cat([r.flatten() for r in runs]).tolist())
    return next(t for t in range(model.cfg.vocab_size) if t not in used)


def test_one_sequence_stopping_does_not_stop_the_other(model, prompt, free):
    stop = int(free[0, 2])
    assert stop not in free[1].tolist()  # sequence 1 never produces it
    out = labkit.generate(model, prompt, max_new_tokens=8, stop_tokens=[stop], pad_token_id=0, **SAMPLED)
    assert out.tokens.shape == (2, 8) and out.steps == 7
    assert out.tokens[0, :3].tolist() == free[0, :3].tolist()
    assert out.tokens[0, 3:].tolist() == [0] * 5
    assert torch.equal(out.tokens[1], free[1])
    assert out.finished.tolist() == [True, False]


def test_generation_ends_when_every_sequence_has_stopped(model, prompt, free):
    stops = [int(free[0, 1]), int(free[1, 3])]
    out = labkit.generate(model, prompt, max_new_tokens=8, stop_tokens=stops, pad_token_id=0, **SAMPLED)
    last = max(free[0].tolist().index(stops[0]), free[1].tolist().index(stops[1]))
    assert out.tokens.shape == (2, last + 1) and out.steps == last
    assert out.finished.tolist() == [True, True]


def test_a_stop_token_from_the_prefill_ends_at_once(model, prompt, free):
    first = int(free[0, 0])
    out = labkit.generate(model, prompt, max_new_tokens=8, stop_tokens=[first, int(free[1, 0])], **SAMPLED)
    assert out.tokens.tolist() == free[:, :1].tolist() and out.steps == 0 and out.finished.all()


def test_padding_defaults_to_the_first_stop_token_given(model, prompt, free):
    """Like transformers' pad_token_id = eos_token_id[0]; the other stop token never appears here."""
    stop = int(free[0, 2])
    other = _unused_token(model, free)
    for stops in ([stop, other], [other, stop]):
        out = labkit.generate(model, prompt, max_new_tokens=8, stop_tokens=stops, **SAMPLED)
        assert out.tokens[0, 3:].tolist() == [stops[0]] * 5


def test_stop_tokens_outside_the_vocabulary_are_refused(model, prompt):
    for bad in (model.cfg.vocab_size, -1):
        with pytest.raises(ValueError, match="stop tokens"):
            labkit.generate(model, prompt, max_new_tokens=2, stop_tokens=[3, bad])


def test_nothing_to_generate_is_refused(model, prompt):
    with pytest.raises(ValueError, match="max_new_tokens"):
        labkit.generate(model, prompt, max_new_tokens=0)


def test_a_one_dimensional_prompt_is_one_sequence(model, prompt):
    out = labkit.generate(model, prompt[1], max_new_tokens=3)
    assert torch.equal(out.tokens, labkit.generate(model, prompt[1:], max_new_tokens=3).tokens)


def test_a_cache_too_small_is_refused_before_any_work(model, prompt):
    cache = model.new_cache(batch_size=2, max_len=10)
    labkit.generate(model, prompt, max_new_tokens=7, cache=cache)  # 4 + 7 - 1 = 10 positions: exactly full
    assert cache.seq_len == 10
    with pytest.raises(labkit.CacheFullError):
        labkit.generate(model, prompt, max_new_tokens=8, cache=cache)
    assert cache.seq_len == 10  # refused before the reset: the cache is as it was


def test_tokens_per_second_counts_every_sequence(model, prompt):
    out = labkit.generate(model, prompt, max_new_tokens=3)
    assert out.decode_tokens_per_s == pytest.approx(2 * 2 / out.decode_s)


class _CountingDecoder(ReferenceDecoder):
    """The reference decoder with a greedy step that records its use."""

    def __init__(self, model, cache):
        super().__init__(model, cache)
        self.calls = {"step": 0, "step_greedy": 0}
        _CountingDecoder.last = self

    def step(self, tokens):
        self.calls["step"] += 1
        return super().step(tokens)

    def step_greedy(self, tokens):
        self.calls["step_greedy"] += 1
        return super().step(tokens).argmax(-1)


def test_the_greedy_step_is_used_exactly_when_decoding_is_greedy(model, prompt, monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "counting", _CountingDecoder)
    out = labkit.generate(model, prompt, max_new_tokens=5, backend="counting")
    assert torch.equal(out.tokens, labkit.generate(model, prompt, max_new_tokens=5).tokens)
    assert _CountingDecoder.last.calls == {"step": 0, "step_greedy": 4}
    labkit.generate(model, prompt, max_new_tokens=5, backend="counting", temperature=0.7, seed=0)
    assert _CountingDecoder.last.calls == {"step": 4, "step_greedy": 0}


def test_the_timed_prefill_takes_over_what_generate_checked(prompt, device, monkeypatch):
    """generate checks the ids' range and (fused: fetching the decoder refreshes it) takes the weights
    key before its timing starts; the fused prefill takes both over instead of walking the model and
    reading the ids back again inside the time to first token. The tokens do not change."""
    from labkit.decode import fused

    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=4, device=device)
    prompt = prompt.to(device)
    want = labkit.generate(model, prompt, max_new_tokens=3, backend="fused").tokens  # the decoder exists now
    walks, reads = [], []
    key = fused.weights_key
    monkeypatch.setattr(fused, "weights_key", lambda *a, **k: walks.append(1) or key(*a, **k))
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: reads.append(1) or aminmax(*a, **k))
    out = labkit.generate(model, prompt, max_new_tokens=3, backend="fused")
    assert torch.equal(out.tokens, want)
    assert len(walks) == 1, "the weights key is taken when the decoder is fetched, not again by its prefill"
    assert len(reads) == 1, "the ids' range is read once, by generate's own check"
    with pytest.raises(ValueError, match="token ids"):  # a caller that checked nothing still gets the check
        backends.make_decoder("fused", model, model.new_cache(2, 8)).prefill(prompt + model.cfg.vocab_size)
