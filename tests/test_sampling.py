"""Sampling at its boundaries: temperature, top-k and top-p at their edges, and the values refused.

The rules, in the order Hugging Face's logits warpers apply them: logits are divided by the
temperature (0 means greedy: the first argmax, filters ignored); top-k keeps every token scoring
at least the k-th score (ties with it stay); top-p then renormalises what is left and keeps the
smallest set of most likely tokens whose probability reaches top_p: the token that reaches it is
kept, the ones after it are not, and the most likely token always stays.

Distributions are checked by drawing N tokens with a seeded generator: each frequency must lie
within Z standard errors, sqrt(p (1 - p) / N), of its probability, and a token outside the kept
set must never be drawn.
"""

import math

import pytest
import torch

from labkit.sampling import SamplingParams, sample

N = 20_000
Z = 5.0  # a band this wide holds a correct frequency with probability 1 - 6e-7
LN2 = math.log(2.0)
# Probabilities 1/2, 1/4, 1/8, 1/16, 1/16, exact in float32 (so cumulative sums hit top_p exactly),
# laid out out of order so that the filters must map sorted positions back to token ids.
ORDER = [3, 0, 4, 1, 2]  # token ORDER[r] is the r-th most likely
POWERS = torch.tensor([0.0, -1.0, -2.0, -3.0, -4.0 + 1.0])  # log2 of each rank's probability
TWOS = torch.empty(5).index_put_((torch.tensor(ORDER),), (POWERS * LN2).clone())


def _draw(logits: torch.Tensor, params: SamplingParams, n: int = N, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = sample(logits.expand(n, -1), params, gen)
    assert tokens.shape == (n,) and tokens.dtype == torch.long
    return tokens


def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


def _assert_distribution(tokens: torch.Tensor, want: torch.Tensor) -> None:
    """Frequencies within Z standard errors of ``want``; zero-probability tokens never drawn."""
    want = want.double()
    got = _frequencies(tokens, want.numel())
    band = Z * (want * (1 - want) / tokens.numel()).sqrt()
    assert bool((got[want == 0] == 0).all()), f"drew excluded tokens: {got[want == 0].tolist()}"
    assert bool(((got - want).abs() <= band).all()), f"frequencies {got.tolist()} vs probabilities {want.tolist()}"


def _kept(tokens: torch.Tensor) -> set[int]:
    return set(torch.unique(tokens).tolist())


def _renormalised(probs: torch.Tensor, keep: list[int]) -> torch.Tensor:
    out = torch.zeros_like(probs)
    out[keep] = probs[keep] / probs[keep].sum()
    return out


# -- temperature ---------------------------------------------------------------------------------
def test_temperature_zero_is_the_first_argmax_and_draws_nothing():
    logits = torch.randn(6, 37, generator=torch.Generator().manual_seed(1))
    logits[2, 5] = logits[2, 30] = logits[2].max() + 1  # a tie: the first index wins
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    for params in (SamplingParams(), SamplingParams(0.0, top_k=3, top_p=0.5)):
        assert params.greedy
        assert torch.equal(sample(logits, params, gen), logits.argmax(-1))
    assert int(sample(logits, SamplingParams(), gen)[2]) == 5
    assert torch.equal(gen.get_state(), state)  # greedy consumes no randomness


@pytest.mark.parametrize("temperature", [1e-4, 1e-30, 1e-42])
def test_a_tiny_temperature_is_the_argmax(temperature):
    """The limit T -> 0 is greedy, down to temperatures whose 1/T overflows float32."""
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(2)) * 8
    params = SamplingParams(temperature)
    assert not params.greedy
    tokens = sample(logits, params, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_temperature_samples_softmax_of_logits_over_t(temperature):
    logits = torch.tensor([1.0, -0.5, 2.0, 0.0, -2.0, 0.7])
    want = (logits.double() / temperature).softmax(-1)
    if temperature != 1.0:  # the test can tell T from 1: the distributions differ by many bands
        assert float((want - logits.double().softmax(-1)).abs().max()) > 10 * Z * math.sqrt(0.25 / N)
    _assert_distribution(_draw(logits, SamplingParams(temperature)), want)


def test_logits_in_bfloat16_sample_like_their_float32_values():
    logits = torch.tensor([1.0, -0.5, 2.0, 0.0, -2.0, 0.7]).bfloat16()
    _assert_distribution(_draw(logits, SamplingParams(0.8)), (logits.double() / 0.8).softmax(-1))


# -- top-k ---------------------------------------------------------------------------------------
def test_top_k_one_is_the_argmax():
    logits = torch.randn(16, 41, generator=torch.Generator().manual_seed(3))
    assert torch.equal(sample(logits, SamplingParams(1.0, top_k=1), torch.Generator().manual_seed(0)), logits.argmax(-1))


@pytest.mark.parametrize("k", [2, 3])
def test_top_k_keeps_exactly_the_k_most_likely(k):
    probs = TWOS.softmax(-1)
    top = ORDER[:k]
    _assert_distribution(_draw(TWOS, SamplingParams(1.0, top_k=k)), _renormalised(probs, top))


def test_top_k_of_all_but_one_drops_the_least_likely():
    logits = torch.tensor([3.0, 1.0, 2.0, 0.0, 4.0])
    assert _kept(_draw(logits, SamplingParams(1.0, top_k=4), n=2000)) == {0, 1, 2, 4}


@pytest.mark.parametrize("k", [5, 6, 1000])
def test_top_k_of_the_whole_vocabulary_or_more_keeps_everything(k):
    _assert_distribution(_draw(TWOS, SamplingParams(1.0, top_k=k)), TWOS.softmax(-1))


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    assert _kept(_draw(logits, SamplingParams(1.0, top_k=2), n=2000)) == {0, 2, 3}


# -- top-p ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "top_p,ranks_kept",
    [
        (1e-6, 1),
        (0.5, 1),  # the most likely token alone reaches 1/2: it is the boundary, and kept
        (0.51, 2),
        (0.75, 2),  # 1/2 + 1/4 reaches 3/4 exactly: the third token is not needed
        (0.76, 3),
        (0.875, 3),
        (0.9, 4),
        (1.0, 5),
    ],
)
def test_top_p_keeps_the_smallest_set_that_reaches_it(top_p, ranks_kept):
    probs = TWOS.softmax(-1)
    assert probs[ORDER].tolist() == [0.5, 0.25, 0.125, 0.0625, 0.0625]  # exact: the boundaries are exact
    keep = ORDER[:ranks_kept]
    _assert_distribution(_draw(TWOS, SamplingParams(1.0, top_p=top_p)), _renormalised(probs, keep))


def test_top_p_one_keeps_even_very_unlikely_tokens():
    logits = torch.tensor([0.0] * 9 + [-6.0])  # the last has probability 2.8e-4: about 1 in 3,600
    tokens = _draw(logits, SamplingParams(1.0, top_p=1.0), n=50_000)
    assert _kept(tokens) == set(range(10))


def test_top_p_applies_to_the_distribution_after_temperature_and_top_k():
    # after top_k=2 the two survivors have 1/2 / 3/4 and 1/4 / 3/4: top_p = 0.6 needs only the first
    probs = TWOS.softmax(-1)
    _assert_distribution(_draw(TWOS, SamplingParams(1.0, top_k=2, top_p=0.6)), _renormalised(probs, ORDER[:1]))
    # at T = 2 the first token falls below 1/2 (0.36), so top_p = 0.5 needs the second too
    hot = (TWOS / 2).softmax(-1)
    assert float(hot[ORDER[0]]) < 0.5 < float(hot[ORDER[:2]].sum())
    _assert_distribution(_draw(TWOS, SamplingParams(2.0, top_p=0.5)), _renormalised(hot, ORDER[:2]))


def test_filters_act_per_row():
    logits = torch.stack([TWOS, TWOS.flip(0), TWOS.roll(2)])
    tokens = sample(logits.repeat(2000, 1), SamplingParams(1.0, top_k=1), torch.Generator().manual_seed(0))
    assert torch.equal(tokens.view(2000, 3), logits.argmax(-1).expand(2000, 3))
    tokens = sample(logits.repeat(2000, 1), SamplingParams(1.0, top_p=0.75), torch.Generator().manual_seed(0))
    for row in range(3):
        kept = _kept(tokens.view(2000, 3)[:, row])
        assert kept == set(logits[row].topk(2).indices.tolist())


def test_a_seed_fixes_the_draws():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(5))
    params = SamplingParams(0.9, top_k=10, top_p=0.8)
    a, b = (sample(logits.repeat(50, 1), params, torch.Generator().manual_seed(11)) for _ in range(2))
    c = sample(logits.repeat(50, 1), params, torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)


# -- refused values ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=-1e-9), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=1.0, top_k=0), "top_k"),
        (dict(temperature=1.0, top_k=-3), "top_k"),
        (dict(temperature=1.0, top_p=0.0), "top_p"),
        (dict(temperature=1.0, top_p=-0.2), "top_p"),
        (dict(temperature=1.0, top_p=1.0001), "top_p"),
        (dict(temperature=1.0, top_p=float("nan")), "top_p"),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_boundary_values_are_accepted():
    SamplingParams(0.0)
    SamplingParams(1e-42, top_k=1, top_p=1.0)
    SamplingParams(1.0, top_p=1e-9)
