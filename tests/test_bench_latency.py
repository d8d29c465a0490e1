"""The pointer chase behind ``labkit bench latency`` on the CPU (Triton's interpreter): both loading
styles reach the row the Python walk reaches, on both chain patterns; bad tables are refused. The
timing itself reads the GPU's global timer (tests/gpu and the GPU runs)."""

import pytest
import torch

from labkit.bench import latency as lat

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter checks")


@pytest.mark.parametrize("pattern", lat.PATTERNS)
@pytest.mark.parametrize("style", lat.STYLES)
def test_the_chase_reaches_the_reference_row(pattern, style):
    table = lat.chain_table(37 * 128, pattern, "cpu", seed=3)  # 37 rows: odd, not a power of two
    links = table[:, 0].tolist()
    assert sorted(links) == list(range(37))  # a permutation ...
    row, seen = 0, set()
    for _ in range(37):
        seen.add(row)
        row = links[row]
    assert row == 0 and len(seen) == 37  # ... that is one cycle through every row
    for start, steps in ((0, 1), (5, 11), (36, 40)):
        got = int(lat.chase(table, start, steps, style).item())
        assert got == lat.chase_ref(table, start, steps), (start, steps)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="whole 128-byte rows"):
        lat.chain_table(100, "random", "cpu")
    with pytest.raises(ValueError, match="pattern"):
        lat.chain_table(1024, "zigzag", "cpu")
    for rows in (33, 3 * 37):  # sharing a factor with the stride: several short cycles, not one
        with pytest.raises(ValueError, match="no factor"):
            lat.chain_table(rows * 128, "stride", "cpu")
    table = lat.chain_table(8 * 128, "random", "cpu")
    with pytest.raises(ValueError, match="style"):
        lat.chase(table, 0, 3, "texture")
    with pytest.raises(ValueError, match="start"):
        lat.chase(table, 8, 3)
    with pytest.raises(ValueError, match="int32"):
        lat.chase(table.long(), 0, 3)
    with pytest.raises(ValueError, match="global timer"):
        lat.chase(table, 0, 3, stamps=torch.zeros(2, dtype=torch.int64))


def test_the_cli_says_it_needs_a_gpu(capsys):
    from labkit.bench.cli import main

    assert main(["latency", "--name", "x"]) == 2
    assert "CUDA" in capsys.readouterr().out
