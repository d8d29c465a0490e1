"""labkit.weights.weights_key on a GPU, at the real shapes: the fingerprint (sampled values, one copy to
the host) sees an edit through ``.data`` that the version counter misses, and a memoized key costs
what its docstring says (printed: compare with data/bench/nvidia-h200/hit-host.json's 0.22 ms)."""

import copy
import time

import pytest
import torch

from labkit.weights import weights_key

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
