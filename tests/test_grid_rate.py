"""labkit.lab.grid_rate: the per-grid streaming rate interpolates the sweep and predicts it back."""

import pytest

from labkit.lab.grid_rate import GridRate


def test_rate_reproduces_its_rows_and_interpolates_between_them():
    rows = [dict(programs=16, bytes=2e6, us=10.0), dict(programs=64, bytes=2e6, us=6.0), dict(programs=256, bytes=2e6, us=5.0)]
    g = GridRate.from_rows(rows, t0_us=2.0)
    for r in rows:
        assert g.predict_us(r["bytes"], r["programs"]) == pytest.approx(r["us"])
    assert g.bytes_per_s(16) < g.bytes_per_s(32) < g.bytes_per_s(64)   # between its neighbours
    assert g.bytes_per_s(3) == g.bytes_per_s(16) and g.bytes_per_s(10**6) == g.bytes_per_s(256)  # held at the ends


def test_bad_rows_are_refused():
    with pytest.raises(ValueError, match="two or more"):
        GridRate.from_rows([dict(programs=16, bytes=1e6, us=5.0)], 1.0)
    with pytest.raises(ValueError, match="not above t0"):
        GridRate.from_rows([dict(programs=16, bytes=1e6, us=1.0), dict(programs=32, bytes=1e6, us=3.0)], 2.0)
    g = GridRate.from_rows([dict(programs=16, bytes=1e6, us=5.0), dict(programs=32, bytes=1e6, us=3.0)], 1.0)
    with pytest.raises(ValueError, match="programs"):
        g.bytes_per_s(0)
