"""labkit.weights.weights_key on a GPU, at the real shapes: the fingerprint (sampled values, one copy to
the host) sees an edit through ``.data`` that the version counter misses, and a memoized key costs
what its docstring says (printed: compare with data/bench/nvidia-h200/hit-host.json's 0.22 ms)."""

import copy
import time

import pytest
import torch

from labkit.weights import values_later, weights_key

from .conftest import REAL_PRESETS


def _ms(f, n=200) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e3


@pytest.mark.serial  # it reads the host clock: alone, not beside other workers' compiles
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_the_key_sees_a_data_edit_and_stays_cheap(real_model, preset):
    model = copy.deepcopy(real_model(preset))  # its own weights: this test edits them
    key = weights_key(model)
    tensors_key = weights_key(model, values=False)
    ms = _ms(lambda: weights_key(model) is key or pytest.fail("the memoized key changed"))
    rung_ms = _ms(lambda: weights_key(model, values=False) is tensors_key or pytest.fail("the rung's key changed"))
    print(f"{preset}: a memoized weights_key: {rung_ms:.3f} ms without the fingerprint (the rungs), "
          f"{ms:.3f} ms with it (PrefixCache)")
    model.layers[3].mlp.down.data.mul_(3)
    after = weights_key(model)
    assert after.places == key.places and after != key
    assert ms < 1.0, ms  # the key is paid on every prefill: it must stay well under a hit's ~3 ms


def test_a_read_after_an_event_sees_the_edits_before_it_and_does_not_wait_for_the_work_after():
    """``values_later(after=)``, as PrefixCache takes the key while a replayed prefill runs: the read
    runs on a stream of its own once the event has passed, so an edit queued before the event is
    seen (behind ~30 ms of queued work), and ~1 s of work queued after it is not waited for."""
    model = torch.nn.Linear(1024, 1024, device="cuda")
    key = weights_key(model)
    torch.cuda._sleep(60_000_000)  # the edit below waits behind this on the current stream
    model.weight.data.mul_(3)  # no version counter moves: only the fingerprint sees it
    after = torch.cuda.Event()
    after.record()
    torch.cuda._sleep(2_000_000_000)  # a replay's stand-in, launched before the key is taken
    t0 = time.perf_counter()
    got = values_later(model, after=after)()
    waited = time.perf_counter() - t0
    assert not torch.cuda.current_stream().query(), "the work after the event ended before the check"
    torch.cuda.synchronize()
    assert got.places == key.places and got != key  # the edit queued before the event was read
    assert waited < 0.4, waited
