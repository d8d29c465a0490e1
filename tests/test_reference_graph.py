"""The "reference+graph" rung (labkit.decode.reference_graph): the reference decode step captured in a CUDA
graph. On a CPU, labkit.decode.graphs.GRAPHS is replaced by the recording stand-in of conftest
(capture records the step without running it, replay re-runs it), so capture and replay run here."""

import pytest
import torch

import labkit
from conftest import random_prompt, rel_err
from labkit.decode.registry import make_decoder


@pytest.mark.parametrize("preset,batch", [("tiny-lfm2", 3), ("tiny-qwen3.5", 1)])
def test_replayed_reference_matches_eager(preset, batch, graphs):
    model = labkit.build(preset, dtype=torch.float32, seed=5)
    prompt = random_prompt(model, batch, 5)
    eager = make_decoder("reference", model, model.new_cache(batch, max_len=13))
    cache = model.new_cache(batch, max_len=13)  # a buffer longer than the sequences: masked keys
    replayed = make_decoder("reference+graph", model, cache)
    a, b = eager.prefill(prompt), replayed.prefill(prompt)
    token = a.argmax(-1)
    assert torch.equal(token, b.argmax(-1))
    for _ in range(4):
        want = eager.step(token)
        got = replayed.step(token).clone()
        assert torch.isfinite(got).all()
        assert rel_err(got, want) < 1e-5
        token = want.argmax(-1)
        greedy = replayed.step_greedy(token).clone()  # the other graph, one more position
        token_eager = eager.step(token).argmax(-1)
        assert torch.equal(greedy, token_eager)
        token = token_eager
    assert cache.host_lengths == (5 + 8,) * batch
    assert int(cache.lengths.min()) == int(cache.lengths.max()) == 13
    assert graphs.captures == 2  # one graph per output kind, replayed for every later step


def test_graph_needs_a_gpu_without_the_stand_in():
    model = labkit.build("tiny-lfm2", dtype=torch.float32)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*backend='reference'"):
        make_decoder("reference+graph", model, model.new_cache(1, 8))


def test_changed_weights_are_recaptured(graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=1)
    prompt = random_prompt(model, 1, 4)
    dec = make_decoder("reference+graph", model, model.new_cache(1, 12))
    dec.prefill(prompt)
    dec.step(torch.tensor([3]))
    with torch.no_grad():
        model.final_norm.weight.mul_(2.0)  # in place: the recorded graph would read stale values
    ref = make_decoder("reference", model, model.new_cache(1, 12))
    ref.prefill(prompt)
    ref.step(torch.tensor([3]))
    dec.cache.reset()
    dec.prefill(prompt)  # sees the changed weights and drops the graphs
    dec.step(torch.tensor([3]))
    assert dec.captures == 2
    assert rel_err(dec.step(torch.tensor([5])), ref.step(torch.tensor([5]))) < 1e-5


def test_bad_tokens_are_refused(graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.float32)
    dec = make_decoder("reference+graph", model, model.new_cache(2, 8))
    with pytest.raises(ValueError, match=r"\[2\] tensor"):
        dec.step(torch.tensor([1]))
    with pytest.raises(TypeError, match="int64 or int32"):
        dec.step(torch.tensor([1.0, 2.0]))
