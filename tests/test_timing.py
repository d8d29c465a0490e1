"""labkit.lab.timing.measure, the one timer: medians per call, untimed set-up, clear refusals (CPU here;
the GPU paths run in tests/gpu and every benchmark)."""

import time

import pytest
import torch

from labkit.lab.timing import cold_l2_copies, measure


def test_per_call_median_over_a_rotation_and_setup_is_not_timed():
    calls, setups = [], []
    work = [lambda i=i: (calls.append(i), time.sleep(0.002)) for i in range(3)]
    t = measure(work, device="cpu", warmup=1, repeats=4, setup=lambda: (setups.append(1), time.sleep(0.05)))
    assert calls == [0, 1, 2] * 5 and len(setups) == 5  # warm-up + repeats, each run calls all in order
    runs = sorted(t.runs_ms)
    assert len(runs) == 4 and t.ms == pytest.approx((runs[1] + runs[2]) / 2)
    assert 1.5 < t.ms < 40 and t.us == t.ms * 1e3  # per call (one sleep), not per run, and without the set-up


def test_refusals():
    with pytest.raises(ValueError, match="empty"):
        measure([], device="cpu")
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, device="cpu", repeats=0)
    with pytest.raises(RuntimeError, match="CUDA graph needs a CUDA device"):
        measure(lambda: None, device="cpu", graph=True)
    with pytest.raises(RuntimeError, match="L2"):
        cold_l2_copies(1 << 20, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the graph path needs a GPU")
def test_graph_replay_runs_the_captured_work():
    x = torch.zeros(1, device="cuda")
    t = measure(lambda: x.add_(1.0), device="cuda", warmup=2, repeats=5)
    # one eager warm-up call before the capture, then 7 replays; the capture itself runs nothing
    assert x.item() == 8 and t.ms > 0
    assert cold_l2_copies(torch.cuda.get_device_properties(0).L2_cache_size, "cuda") == 3
