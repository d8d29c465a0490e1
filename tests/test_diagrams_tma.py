"""The TMA pipeline model behind notebook 04's drawing: its steady rate has the bounds the notebook
states (one stage: nothing overlaps; enough stages: the slower of consuming and transferring)."""

import pytest

from labkit.lab.diagrams import tma_pipeline_schedule


def _period(stages, lat, transfer, consume, rounds=10):
    s = tma_pipeline_schedule(stages, 2 * rounds * stages + 1, lat, transfer, consume)
    return (s[-1]["end"] - s[-1 - rounds * stages]["end"]) / (rounds * stages)  # whole rounds of the ring


def test_one_stage_serialises_latency_and_work():
    assert _period(1, 1.0, 0.1, 0.2) == pytest.approx(1.2)


def test_enough_stages_hide_the_latency():
    assert _period(16, 1.0, 0.1, 0.2) == pytest.approx(0.2)  # consumer-bound
    assert _period(16, 1.0, 0.3, 0.2) == pytest.approx(0.3)  # bandwidth-bound
    assert _period(2, 1.0, 0.1, 0.2) == pytest.approx(0.6, rel=0.01)  # (latency + work) / stages


def test_boxes_never_start_before_they_land_or_overlap():
    s = tma_pipeline_schedule(3, 17, 0.7, 0.05, 0.3)
    for i, r in enumerate(s):
        assert r["start"] >= r["land"] >= r["issue"] + 0.7 - 1e-12
        if i:
            assert r["start"] >= s[i - 1]["end"] and r["land"] >= s[i - 1]["land"] + 0.05 - 1e-12
        if i >= 3:
            assert r["issue"] >= s[i - 3]["end"]  # its slot was freed first
    with pytest.raises(ValueError):
        tma_pipeline_schedule(0, 3, 1, 1, 1)
