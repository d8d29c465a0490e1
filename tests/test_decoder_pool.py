"""The decoder pool of ``generate`` (labkit.decode.registry.leased_decoder): a pooled decoder and its
cache are lent to one caller at a time, so threads calling ``generate`` on one model each decode
their own sequences; and the pool's keys keep apart what must not share a decoder."""

import threading

import pytest
import torch

import labkit
from conftest import random_prompt
from labkit.decode import registry
from labkit.decode.registry import leased_decoder, make_decoder, release_pooled

THREADS = 4


@pytest.fixture
def one_kernel_at_a_time(monkeypatch):
    """Triton's interpreter is not thread-safe (it patches triton.language while a kernel runs), so
    each interpreted kernel runs under one lock; calls still interleave between kernels, as they do
    on a GPU, where each launch returns at once."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    lock, run = threading.Lock(), interpreter.GridExecutor.__call__

    def locked(self, *args, **kwargs):
        with lock:
            return run(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", locked)


def test_threads_calling_generate_on_one_model_get_what_a_sequential_run_gets(one_kernel_at_a_time):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    prompts = [random_prompt(model, 1, 5, seed=s) for s in range(THREADS)]  # one shape: one pool key
    want = [labkit.generate(model, p, 5, backend="fused").tokens for p in prompts]
    got, errors = [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def run(i):
        start.wait()  # all at once: each call's prefill and steps interleave with the others'
        try:
            got[i] = labkit.generate(model, prompts[i], 5, backend="fused").tokens
        except Exception as e:  # noqa: BLE001 - reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(THREADS):
        assert torch.equal(got[i], want[i]), (i, got[i], want[i])
    pool = model.attachments["labkit.decoder_pool"]
    assert 1 <= len(pool) <= registry.POOL_SIZE  # the concurrent callers' entries went back, bounded


def test_a_lent_entry_is_not_lent_again_until_given_back():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    with leased_decoder("fused", model, 1, 16) as (first, cache):
        with leased_decoder("fused", model, 1, 16) as (second, other):
            assert other is not cache and second is not first and second.cache is other
    with leased_decoder("fused", model, 1, 16) as (_, again):
        assert again in (cache, other)  # given back: reused, not made again
    release_pooled(model)
    assert "labkit.decoder_pool" not in model.attachments


def test_one_cache_keeps_a_decoder_per_graph_setting(graphs):
    """fused and fused+graph on the same cache are two decoders: the key of the decoders a cache
    keeps (labkit.decode.fused.fused_decoder) holds ``graph``, so an eager call never replays the
    graph rung's capture and a graph call never runs eagerly."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    cache = model.new_cache(1, 16)
    graph = make_decoder("fused+graph", model, cache)
    eager = make_decoder("fused", model, cache)
    assert graph.graph and not eager.graph and eager is not graph
    assert make_decoder("fused+graph", model, cache) is graph and make_decoder("fused", model, cache) is eager
    prompt = random_prompt(model, 1, 4)
    replays = graphs.replays
    out = labkit.generate(model, prompt, 3, backend="fused", cache=cache)
    assert graphs.replays == replays  # the eager rung replayed nothing
    assert torch.equal(out.tokens, labkit.generate(model, prompt, 3).tokens)
    labkit.generate(model, prompt, 3, backend="fused+graph", cache=cache)
    assert graphs.replays == replays + 2  # the graph rung's two steps
