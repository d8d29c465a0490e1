import math

import pytest

from labkit.bench.tune_kernels import geomean_ratio
from labkit.lab import tuned_winners as tw


def _entry(m, n, k, rb, cfg, us, argmax=False, method="chain"):
    return {"key": {"m_bucket": m, "n": n, "k": k, "row_blocks": rb, "argmax": argmax}, "config": cfg,
            "us": {"tuned": us}, "ops": [f"p{n}"], "method": method}


CFG = {"block_m": 1, "block_n": 4, "block_k": 512, "split_k": 1, "num_warps": 4, "num_stages": 1}


def test_bytes_and_requests_on_an_irregular_shape():
    key = {"m_bucket": 1, "n": 1001, "k": 777, "row_blocks": 3, "argmax": False}
    assert tw.weight_bytes(key) == 1001 * 3 * 777 * 2
    # ceil(1001 / 4) = 251 programs of 4 x 512 x 3 rows of bf16, over 7 SMs
    assert tw.requested_per_sm(key, CFG, 7) == pytest.approx(251 * 4 * 512 * 3 * 2 / 7)
    with pytest.raises(ValueError):
        tw.requested_per_sm(key, CFG, 0)


def test_batch1_winners_keeps_only_batch1_chain_rows_largest_first():
    tf = {"linear": [_entry(1, 100, 64, 1, CFG, 2.0), _entry(1, 300, 64, 1, CFG, 3.0),
                     _entry(16, 300, 64, 1, CFG, 9.0), _entry(1, 500, 64, 1, CFG, 5.0, argmax=True),
                     _entry(1, 700, 64, 1, CFG, 5.0, method="alone")]}
    pts = tw.batch1_winners(tf, sms=3)
    assert [p["bytes"] for p in pts] == [300 * 64 * 2, 100 * 64 * 2]
    assert pts[0]["bytes_per_s"] == pytest.approx(300 * 64 * 2 / 3e-6)
    with pytest.raises(ValueError, match="labkit tune"):
        tw.batch1_winners({"linear": tf["linear"][2:]}, sms=3)


def test_the_two_models():
    assert tw.littles_law_bytes_per_s(1000, 10, 1e-6, 1e12) == pytest.approx(1e10)
    assert tw.littles_law_bytes_per_s(1e9, 10, 1e-6, 1e12) == 1e12  # capped by the copy bandwidth
    # 1 MB at 1 TB/s is 1 µs of stream; a 1 µs fixed cost halves the bandwidth
    assert tw.fixed_cost_bytes_per_s(1e6, 1e-6, 1e12) == pytest.approx(0.5e12)
    assert tw.fixed_cost_bytes_per_s(1e6, 0.0, 1e12) == pytest.approx(1e12)
    with pytest.raises(ValueError):
        tw.littles_law_bytes_per_s(1, 1, 0.0, 1.0)
    with pytest.raises(ValueError):
        tw.fixed_cost_bytes_per_s(1, -1e-6, 1.0)


def test_candidates_table_marks_the_winner_and_sorts_by_score():
    entry = {"values": {"a": 2}, "candidates": [{"values": {"a": 1}, "us": {"B=1": 4.0, "B=7": 8.0}},
                                                {"values": {"a": 2}, "us": {"B=1": 2.0, "B=7": 8.0}},
                                                {"values": {"a": 3}, "error": "failed its check"}]}
    table, n = tw.candidates_table(entry, geomean_ratio)
    lines = table.splitlines()
    assert n == 3 and lines[2].startswith("| **a=2**") and lines[3].startswith("| a=1 |")
    assert lines[2].endswith(f"| {math.sqrt(0.5):.3f} |")
    with pytest.raises(ValueError):
        tw.candidates_table({"values": {}, "candidates": [{"values": {}, "error": "x"}]}, geomean_ratio)


def test_projection_growth_uses_what_the_step_runs():
    key = {"m_bucket": 1, "n": 333, "k": 77, "row_blocks": 1, "argmax": False}
    tf = {"linear": [{"key": key, "us": {"tuned": 2.0}},
                     {"key": dict(key, m_bucket=16), "us": {"tuned": 9.0, "torch": 5.0}, "impl": "torch"},
                     {"key": dict(key, n=5), "us": {"tuned": 1.0}},
                     {"key": dict(key, n=5, m_bucket=16), "us": {"tuned": 1.5}}]}
    groups = [{"key": key, "kernels": 3}, {"key": dict(key, n=5), "kernels": 2}]
    assert tw.projection_growth_us(tf, groups, 16) == pytest.approx(3 * (5.0 - 2.0) + 2 * 0.5)
    with pytest.raises(KeyError, match="labkit tune"):
        tw.projection_growth_us(tf, groups, 64)


def test_heuristic_speedup_is_a_geometric_mean():
    key = {"m_bucket": 16, "n": 3, "k": 5, "row_blocks": 1, "argmax": False}
    tf = {"linear": [{"key": key, "us": {"heuristic": 4.0, "tuned": 1.0}},
                     {"key": key, "us": {"heuristic": 1.0, "tuned": 1.0}},
                     {"key": dict(key, m_bucket=1), "us": {"heuristic": 9.0, "tuned": 1.0}},
                     {"key": key, "us": {"tuned": 1.0}}]}
    assert tw.heuristic_speedup(tf, 16) == pytest.approx(2.0)
    with pytest.raises(KeyError):
        tw.heuristic_speedup(tf, 64)
