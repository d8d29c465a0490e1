"""The persistent step's tuner, on a CPU: the choice it makes from measured rows, and a decoder that
refuses settings it does not know (the timing itself needs a GPU: python -m labkit tune --persistent)."""

import pytest
import torch

import labkit
from labkit.bench.tune_persistent import CANDIDATES, choose, close_enough
from labkit.decode.persistent import PersistentDecoder


def _row(cand, **us):
    return {"candidate": cand, "presets": {m: ({"us": t} if isinstance(t, float) else {"refused": t})
                                           for m, t in us.items()}}


def test_the_best_geometric_mean_wins_and_a_refused_candidate_never_does():
    rows = [_row({}, a=100.0, b=200.0), _row({"x": 1}, a=50.0, b=300.0), _row({"y": 1}, a=80.0, b=180.0),
            _row({"z": 1}, a=10.0, b="does not fit")]
    best = choose(rows, ["a", "b"])
    assert best["candidate"] == {"y": 1} and best["speedup"] == pytest.approx((100 / 80 * 200 / 180) ** 0.5)
    assert rows[1]["speedup"] == pytest.approx((2 * 2 / 3) ** 0.5) and rows[3]["speedup"] is None
    assert choose([_row({}, a="does not fit", b=1.0)], ["a", "b"]) is None  # no heuristic time: nothing chosen


def test_every_candidate_names_known_settings():
    assert CANDIDATES[0] == {}  # the heuristic first: the baseline of every speed-up
    known = set(labkit.tuning.HEURISTICS["persistent_decode"])
    assert all(set(c) <= known for c in CANDIDATES)


def test_an_unknown_setting_is_refused():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    with pytest.raises(ValueError, match="unknown persistent_decode settings"):
        PersistentDecoder(model, model.new_cache(1, 16), settings={"warps": 8})


def test_a_candidate_passes_only_as_close_to_the_truth_as_its_peer():
    assert close_enough(0.05, 0.05) and close_enough(0.09, 0.05)
    assert not close_enough(0.2, 0.05)  # a race corrupts a step by far more than bf16 rounding
    assert not close_enough(float("nan"), 0.05)
