"""The bank-conflict demo on the GPU: the three transposes equal ``x.t()`` on irregular sizes, and
where ncu can read counters, the [32][32] tile's column reads conflict (at least half the bank
arithmetic's 31 per warp read) and the padded and swizzled tiles' a tenth of that at most."""

import pytest

from labkit.lab import bank_conflicts as bc
from labkit.lab import counters

pytestmark = pytest.mark.xdist_group("bank-conflicts")  # one worker builds the extension


@pytest.mark.heavy(seconds=60)
def test_the_transposes_match_torch():
    assert bc.check() == []


def test_the_naive_tile_conflicts_and_the_others_do_not():
    reason = counters.ncu_missing_reason()  # a refused counter is a skip too (below)
    if reason:
        pytest.skip(reason)
    rows = cols = 1024
    try:
        measured, _ = bc.profile_layouts(rows, cols, timeout_s=150)
    except counters.CountersNotPermitted as exc:
        pytest.skip(str(exc))
    naive = measured["naive"]["bank_conflicts_ld"]
    predicted = bc.predict("naive", rows, cols).ld_conflicts
    assert naive is not None and predicted > 0
    assert naive >= 0.5 * predicted, (naive, predicted)  # bench bank-conflicts sets the two side by side
    for layout in ("padded", "swizzled"):
        other = measured[layout]["bank_conflicts_ld"]
        assert other is not None and other < naive / 10, (layout, other, naive)
