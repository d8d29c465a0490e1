"""labkit.weights.weights_key on a GPU, at the real shapes: the fingerprint (sampled values, one copy to
the host) sees an edit through ``.data`` that the version counter misses, and a memoized key costs
what its docstring says (printed: compare with data/bench/nvidia-h200/hit-host.json's 0.22 ms)."""

import copy
import time

import pytest
import torch

from labkit.weights import weights_key

from tests.conftest import REAL_PRESETS


@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_the_key_sees_a_data_edit_and_stays_cheap(real_model, preset):
    model = copy.deepcopy(real_model(preset))  # its own weights: this test edits them
    key = weights_key(model)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        assert weights_key(model) is key
    ms = (time.perf_counter() - t0) / 200 * 1e3
    print(f"{preset}: a memoized weights_key with its fingerprint: {ms:.3f} ms")
    model.layers[3].mlp.down.data.mul_(3)
    after = weights_key(model)
    assert after.places == key.places and after != key
    assert ms < 1.0, ms  # the key is paid on every prefill: it must stay well under a hit's ~3 ms
