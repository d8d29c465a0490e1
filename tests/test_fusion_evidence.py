"""The arithmetic behind notebook 02's evidence (labkit.bench.fusion_evidence), on a CPU."""

import math

import pytest

from labkit.bench import fusion_evidence as fe


def test_fit_recovers_fixed_cost_and_bandwidth():
    t0, bw = 2.6, 2.7e12
    nbytes = [2.1e6, 4.2e6, 6.3e6, 9.4e6, 18.9e6]
    us = [t0 + b / bw * 1e6 for b in nbytes]
    fit = fe.fit_fixed_cost(nbytes, us)
    assert fit.t0_us == pytest.approx(t0, rel=1e-9)
    assert fit.bytes_per_s == pytest.approx(bw, rel=1e-9)
    assert fit.points == 5 and fit.rms_residual_us < 1e-9
    assert fit.predict_us(1e6) == pytest.approx(t0 + 1e6 / bw * 1e6)


def test_fit_with_noise_is_least_squares():
    # symmetric +-0.1 µs noise on two points at each size leaves the line where it was
    nbytes = [1e6, 1e6, 5e6, 5e6, 9e6, 9e6]
    us = [3.0 + 0.1, 3.0 - 0.1, 5.0 + 0.1, 5.0 - 0.1, 7.0 + 0.1, 7.0 - 0.1]
    fit = fe.fit_fixed_cost(nbytes, us)
    assert fit.t0_us == pytest.approx(2.5)
    assert fit.bytes_per_s == pytest.approx(2e12)
    assert fit.rms_residual_us == pytest.approx(0.1)


@pytest.mark.parametrize("nbytes, us, match", [
    ([1e6], [3.0], "at least 2 points"),
    ([], [], "at least 2 points"),
    ([1e6, 1e6], [3.0, 4.0], "same bytes"),
    ([1e6, 2e6], [4.0, 3.0], "does not grow"),
    ([1e6, 2e6], [3.0], "as many"),
    ([1e6, math.nan], [3.0, 4.0], "finite"),
])
def test_fit_rejects_what_it_cannot_fit(nbytes, us, match):
    with pytest.raises(ValueError, match=match):
        fe.fit_fixed_cost(nbytes, us)


def test_resident_programs_per_sm():
    # 64 K registers: 128 regs x 32 threads x 16 warps = 64 K -> one program; warps cap 4-warp programs at 16
    assert fe.resident_programs_per_sm(128, 16) == 1
    assert fe.resident_programs_per_sm(32, 4) == 16
    assert fe.resident_programs_per_sm(255, 16) == 0  # does not fit at all
    with pytest.raises(ValueError):
        fe.resident_programs_per_sm(0, 4)


def test_timeline_summary_counts_overlaps_and_gaps():
    spans = [dict(start_us=9.0, dur_us=1.0), dict(start_us=0.0, dur_us=5.0), dict(start_us=4.0, dur_us=3.0)]
    s = fe.timeline_summary(spans)  # sorted by start: 0-5, 4-7, 9-10
    assert s == dict(kernels=3, span_us=10.0, busy_sum_us=9.0, overlapping=1, median_gap_us=2.0)
    with pytest.raises(ValueError):
        fe.timeline_summary([])


def test_collect_rejects_unknown_parts():
    with pytest.raises(ValueError, match="unknown parts"):
        fe.collect({}, parts=["fit", "spills"])
