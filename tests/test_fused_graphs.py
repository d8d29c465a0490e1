"""The graph backends' own code paths, on a CPU: capture, replay, reuse across generate calls, and
recapture when the weights change.

CUDA graphs need a GPU, so ``labkit.decode.graphs.GRAPHS`` (the one seam) is replaced by a stand-in whose
capture records the step without running it and whose replay re-runs it. Like a real graph, a
recording binds the plan it was made with: replaying it after a parameter was replaced would read
the old tensor, so a missing recapture shows up as wrong tokens. Without the stand-in the graph
backends still refuse a CPU model (test_fused_backend.py checks the message).
"""

import pytest
import torch
from torch import nn

import labkit
from conftest import RecordedStep, random_prompt, rel_err
from labkit.decode import fused_prefill
from labkit.decode.registry import make_decoder, release_pooled

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-in replaces real CUDA graphs")


@pytest.mark.parametrize("preset,batch", [("tiny-lfm2", 3), ("tiny-qwen3.5", 1)])  # interpreted GDN is slow
def test_replayed_steps_match_eager_and_reference(preset, batch, graphs):
    model = labkit.build(preset, dtype=torch.float32, seed=3)
    prompt = random_prompt(model, batch, 5)
    ref = make_decoder("reference", model, model.new_cache(batch, max_len=12))
    eager = make_decoder("fused", model, model.new_cache(batch, max_len=12))
    graph = make_decoder("fused+graph", model, model.new_cache(batch, max_len=12))
    assert (graphs.captures, graphs.warm_ups) == (2, 2)  # logits and greedy steps, at construction
    for buf in graph.plan.activations():
        buf.fill_(float("nan"))
    token = ref.prefill(prompt).argmax(-1)
    eager.prefill(prompt)
    graph.prefill(prompt)  # a length seen once: eager (the fused_prefill setting capture_at)
    assert (graphs.captures, graphs.warm_ups, graphs.replays) == (2, 2, 0)
    for step in range(4):
        want = ref.step(token)
        if step % 2:
            got = graph.step_greedy(token)
            assert torch.equal(got, want.argmax(-1)), step
            eager.step_greedy(token)
        else:
            got = graph.step(token)
            assert torch.equal(got, eager.step(token)), step  # the same launches, replayed
            assert rel_err(got, want) < 1e-4, step
        token = want.argmax(-1)
    assert graphs.replays == 4 and graphs.captures == 2
    # the captured step advances the device lengths itself; the host mirror follows (advance_host)
    assert graph.cache.host_lengths == ref.cache.host_lengths == (9,) * batch
    assert graph.cache.lengths.tolist() == [9] * batch
    # the warm-up run before capture left no trace in the states
    for i in ref.cache.conv_states:
        assert rel_err(graph.cache.conv_states[i], ref.cache.conv_states[i]) < 1e-5
    for i in ref.cache.recurrent_states:
        assert rel_err(graph.cache.recurrent_states[i], ref.cache.recurrent_states[i]) < 1e-5


def test_generate_captures_once_for_calls_of_the_same_shape(graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=1)
    prompt = random_prompt(model, 2, 5)
    want = labkit.generate(model, prompt, 4).tokens
    first = labkit.generate(model, prompt, 4, backend="fused+graph")
    again = labkit.generate(model, prompt, 4, backend="fused+graph")
    assert torch.equal(first.tokens, want) and torch.equal(again.tokens, want)
    # one logits graph and one greedy graph for both calls; the prompt length's second call captures its prefill
    assert graphs.captures == 3
    assert graphs.replays == 3 + (1 + 3)
    # the first call's set-up ran the interpreted step (warm-up before capture); the second only checked the weights
    assert again.setup_s < first.setup_s / 10, (first.setup_s, again.setup_s)
    wall = again.setup_s + again.prefill_s + again.decode_s
    assert again.wall_tokens_per_s == pytest.approx(again.tokens.numel() / wall)
    # a longer prompt in the same cache bucket shares the step graphs (its prefill runs eagerly, seen
    # once); another batch size does not
    longer = random_prompt(model, 2, 9, seed=1)
    assert torch.equal(labkit.generate(model, longer, 3, backend="fused+graph").tokens,
                       labkit.generate(model, longer, 3).tokens)
    assert graphs.captures == 3
    labkit.generate(model, prompt[:1], 2, backend="fused+graph")
    assert graphs.captures == 5
    release_pooled(model)
    labkit.generate(model, prompt, 2, backend="fused+graph")
    assert graphs.captures == 7


def _modify_by_replacing(model):
    block = model.layers[-1]
    block.mlp.down = nn.Parameter(-2.0 * block.mlp.down.detach(), requires_grad=False)


def _modify_in_place(model):
    model.layers[-1].mlp.down.mul_(-2.0)


@pytest.mark.parametrize("modify", [_modify_by_replacing, _modify_in_place], ids=["replaced", "in-place"])
def test_changed_weights_are_recaptured(modify, graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=2)
    prompt = random_prompt(model, 2, 5)
    before = labkit.generate(model, prompt, 4, backend="fused+graph").tokens
    assert torch.equal(before, labkit.generate(model, prompt, 4).tokens)
    assert graphs.captures == 2
    modify(model)
    want = labkit.generate(model, prompt, 4).tokens
    assert not torch.equal(want, before)  # the change matters, so stale weights would show
    got = labkit.generate(model, prompt, 4, backend="fused+graph")
    assert graphs.captures == 5  # the step graphs again, and the prefill of the length now seen twice
    assert torch.equal(got.tokens, want)


def test_a_decoder_kept_with_a_cache_checks_the_weights_at_prefill(graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=2)
    prompt = random_prompt(model, 1, 5)
    cache = model.new_cache(1, max_len=12)
    decoder = make_decoder("fused+graph", model, cache)
    _modify_by_replacing(model)
    want = labkit.generate(model, prompt, 4).tokens
    cache.reset()
    token = decoder.prefill(prompt).argmax(-1)  # notices the new parameter, recaptures
    assert graphs.captures == 4
    got = [token]
    for _ in range(3):
        got.append(decoder.step_greedy(got[-1]).clone())
    assert torch.equal(torch.stack(got, 1), want)


def test_a_model_converted_to_another_dtype_is_not_replayed(graphs):
    model = labkit.build("tiny-lfm2", dtype=torch.bfloat16, seed=0)
    prompt = random_prompt(model, 1, 4)
    cache = model.new_cache(1, max_len=8)
    labkit.generate(model, prompt, 2, backend="fused+graph")  # pooled
    labkit.generate(model, prompt, 2, backend="fused+graph", cache=cache)  # kept with the caller's cache
    model.float()
    with pytest.raises(ValueError, match="cache of torch.bfloat16 on cpu; the model is 'tiny-lfm2' in torch.float32"):
        labkit.generate(model, prompt, 2, backend="fused+graph", cache=cache)
    out = labkit.generate(model, prompt, 3, backend="fused+graph")  # a new pooled entry, in float32
    assert torch.equal(out.tokens, labkit.generate(model, prompt, 3).tokens)
    pool = model.attachments["labkit.decoder_pool"]
    assert [key[-1] for key, _ in pool] == [(torch.device("cpu"), torch.float32)]  # the bf16 one is gone


def test_prefill_graphs_per_length_match_the_eager_prefill(graphs):
    """fused+graph prefill of a fresh cache: a graph per prompt length from its second time (the
    least recently used dropped past the policy's ``graphs``), the same logits and cache as the eager
    fused prefill; a prompt that continues a sequence runs eagerly."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=4)
    eager = make_decoder("fused", model, model.new_cache(2, max_len=16))
    graph = make_decoder("fused+graph", model, model.new_cache(2, max_len=16))
    graph.prefill_policy = {**graph.prefill_policy, "graphs": 2}  # tuning.settings("fused_prefill"): 4
    for length in (5, 7, 5, 3, 7, 3, 5):
        prompt = random_prompt(model, 2, length, seed=length)
        eager.cache.reset()
        graph.cache.reset()
        want = eager.prefill(prompt)
        got = graph.prefill(prompt)
        assert rel_err(got, want) < 1e-6, length
        assert graph.cache.host_lengths == (length, length) and graph.cache.lengths.tolist() == [length] * 2
        for i in eager.cache.conv_states:
            assert rel_err(graph.cache.conv_states[i], eager.cache.conv_states[i]) < 1e-6
    # captured at their second time: 5, 7, then 3 (dropping 5, the least recently used), then 5 (dropping 7)
    assert graph.prefill_captures == 4 and list(graph._prefill_graphs) == [3, 5]
    captures = graphs.captures
    more = random_prompt(model, 2, 2, seed=9)
    eager_more, graph_more = eager.prefill(more), graph.prefill(more)  # continues: eager, no capture
    assert graphs.captures == captures and rel_err(graph_more, eager_more) < 1e-6


@pytest.mark.parametrize("modify", [_modify_by_replacing, _modify_in_place], ids=["replaced", "in-place"])
def test_a_replayed_prefill_checks_the_weights_while_it_runs(modify, graphs):
    """decoder.prefill of a captured length replays first and checks the weights while it runs (the
    graph holds the tensors it was captured with, so a stale replay reads memory still theirs). When
    they changed, that replay's result is dropped: the cache is reset and the prompt prefilled anew,
    so the logits and the cache are the new weights' (device lengths counted once, not twice)."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=3)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 16))
    prompt = random_prompt(model, 1, 6, seed=1)
    for _ in range(decoder.prefill_policy["capture_at"]):
        decoder.cache.reset()
        decoder.prefill(prompt)
    entry = decoder._prefill_graphs[6]
    old = model.layers[-1].mlp.down
    assert any(t.data_ptr() == old.data_ptr() for t in entry.tensors)
    replays, captures = graphs.replays, decoder.prefill_captures
    decoder.cache.reset()
    assert rel_err(decoder.prefill(prompt), model(prompt)[:, -1]) < 1e-6
    assert graphs.replays == replays + 1 and decoder.prefill_captures == captures  # replayed, nothing else
    replays = graphs.replays
    modify(model)
    want = model(prompt)[:, -1]
    decoder.cache.reset()
    captures = decoder.prefill_captures
    got = decoder.prefill(prompt)
    # the stale replay, then the refresh dropped the graph and this length, frequent, is captured anew
    assert graphs.replays > replays + 1 and decoder.prefill_captures == captures + 1
    assert rel_err(got, want) < 1e-6
    assert decoder.cache.host_lengths == (6,) and decoder.cache.lengths.tolist() == [6]
    token = got.argmax(-1)
    assert torch.equal(decoder.step_greedy(token), model(torch.cat([prompt, token[:, None]], 1))[:, -1].argmax(-1))


def test_generate_checks_the_weights_while_its_prompt_graph_runs(graphs, monkeypatch):
    """A generate call that reuses a pooled fused+graph decoder with its prompt length captured walks
    the model's tensors once, after the prompt's graph was launched (the walk overlaps the device
    work), not in its set-up ahead of it."""
    from labkit.decode import fused as fused_module

    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=1)
    prompt = random_prompt(model, 1, 5)
    for _ in range(3):  # the length is captured at its second call
        labkit.generate(model, prompt, 2, backend="fused+graph")
    events = []
    walk, replay = fused_module.weights_key, RecordedStep.replay
    monkeypatch.setattr(fused_module, "weights_key", lambda *a, **k: events.append("walk") or walk(*a, **k))
    monkeypatch.setattr(RecordedStep, "replay", lambda self: events.append("replay") or replay(self))
    out = labkit.generate(model, prompt, 2, backend="fused+graph")
    assert events[:2] == ["replay", "walk"] and events.count("walk") == 1, events
    assert torch.equal(out.tokens, labkit.generate(model, prompt, 2).tokens)


def test_a_refresh_drops_the_captured_continuations(graphs):
    """A captured continuation (the tail after a restored prefix, FusedPrefill.prefill_continuation)
    binds the weights of its capture, as a real CUDA graph binds their tensors: after the weights
    change, the same (restored length, tail) shape is captured again, not replayed."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=2)
    decoder = make_decoder("fused+graph", model, model.new_cache(1, 32))
    prompt = random_prompt(model, 1, 11)
    prefix = labkit.PrefixCache(model, 4, budget_bytes=10**8)
    prefix.prefill(decoder, prompt)  # a miss: stores the snapshots
    captured = graphs.captures
    hit = prefix.prefill(decoder, prompt)  # a hit: the 3-token tail runs eagerly
    assert hit.restored == 8 and rel_err(hit.logits, model(prompt)[:, -1]) < 1e-5
    assert graphs.captures == captured
    prefix.prefill(decoder, prompt)  # the shape's second hit: captured
    assert graphs.captures == captured + 1
    captured = graphs.captures
    prefix.prefill(decoder, prompt)
    assert graphs.captures == captured  # and replayed
    _modify_by_replacing(model)
    prefix = labkit.PrefixCache(model, 4, budget_bytes=10**8)  # the old snapshots describe the old weights
    # a miss: the decoder refreshes (its two step graphs recaptured), and this prompt shape's second
    # miss is captured too (PrefixCache reads a miss's boundaries through Decoder.prefill_reading)
    prefix.prefill(decoder, prompt)
    got = prefix.prefill(decoder, prompt)
    assert graphs.captures == captured + 4  # and the continuation of the same shape, captured anew
    assert rel_err(got.logits, model(prompt)[:, -1]) < 1e-5
