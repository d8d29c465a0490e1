"""labkit.lab.prefix_cache_report: the hit breakdown, the miss overhead and chapter 03's figures."""

import matplotlib

matplotlib.use("Agg")

import pytest

from labkit.lab import prefix_cache_report as pcr


def _row(workload, policy, budget, hit, restored, ttft, nocache, requests_hit=None):
    return dict(workload=workload, policy=policy, budget_snapshots=budget, hit_rate=hit, ceiling_hit_rate=0.9,
                restored_tokens=restored, ttft_ms_median=ttft, ttft_nocache_ms_median=nocache, requests=4,
                requests_hit=(4 if restored else 0) if requests_hit is None else requests_hit)


def test_arithmetic_speedup_counts_tokens():
    assert pcr.arithmetic_speedup(4096, 64) == pytest.approx(65.0)
    with pytest.raises(ValueError, match="suffix"):
        pcr.arithmetic_speedup(10, 0)


def test_hit_breakdown_sums_host_restore_and_tail():
    timeline = dict(hit_wall_median_ms=3.3, tail_continuation_median_ms=2.2, kernels_per_hit=333, busy_us_per_hit=1900.0)
    host = {"hit: pc.prefill, tail stubbed = host side (ms)": 0.9, "restore: the copies (ms)": 0.2}
    parts = pcr.hit_breakdown(timeline, host)
    assert parts["host"] == pytest.approx(0.7) and parts["restore"] == pytest.approx(0.2)
    assert parts["predicted"] == pytest.approx(0.7 + 0.2 + 2.2)
    assert parts["measured"] == 3.3 and parts["busy"] == pytest.approx(1.9)
    with pytest.raises(KeyError, match="hit-host"):
        pcr.hit_breakdown(timeline, {})
    with pytest.raises(KeyError, match="hit-timeline"):
        pcr.hit_breakdown({}, host)


def test_ttft_over_nocache_of_misses_uses_rows_that_restored_nothing():
    rows = [_row("unrelated", "lru", 8, 0.0, 0, 90.0, 30.0), _row("unrelated", "flops", 8, 0.0, 0, 60.0, 30.0),
            _row("shared-prefix", "lru", 8, 0.5, 100, 10.0, 40.0)]
    out = pcr.ttft_over_nocache(rows)
    assert set(out) == {"unrelated"}  # the shared-prefix row hit: not a miss
    assert out["unrelated"]["ratio_min"] == pytest.approx(2.0) and out["unrelated"]["ratio_max"] == pytest.approx(3.0)
    assert out["unrelated"]["nocache_ms"] == 30.0
    # a row with its requests' own ratios gives their median, not the ratio of its two medians
    rows[0]["ttft_ratio_median"] = 1.04
    assert pcr.ttft_over_nocache(rows)["unrelated"]["ratio_min"] == pytest.approx(1.04)
    assert pcr.ttft_over_nocache(rows)["unrelated"]["ratio_max"] == pytest.approx(2.0)


def test_hit_reading_says_whether_hits_paid_and_why_not_on_a_graph_rung():
    rows = [_row("shared-prefix", "lru", 8, 0.2, 512, 15.0, 6.0), _row("shared-prefix", "lru", 16, 0.4, 1024, 9.0, 6.0),
            _row("unrelated", "lru", 8, 0.0, 0, 3.8, 3.6)]
    for r in rows:
        r["backend"] = "fused+graph"
    text = pcr.hit_reading(rows)
    assert "shared-prefix **1.50× to 2.50×**" in text and "unrelated" not in text  # hit rows only
    assert "cost more than no cache" in text and "replays the CUDA graph" in text
    for r in rows:
        r["backend"] = "reference"
    assert "replays" not in pcr.hit_reading(rows) and "copies" in pcr.hit_reading(rows)
    rows[0]["ttft_ms_median"], rows[1]["ttft_ms_median"] = 3.0, 4.0
    assert "faster than no cache" in pcr.hit_reading(rows) and "cost more" not in pcr.hit_reading(rows)
    assert pcr.hit_reading(rows[2:]) == ""  # no row hit
    rows[0]["requests_hit"], rows[1]["requests_hit"] = 1, 1  # a hit or two among misses: the rows read as misses' rows
    assert pcr.hit_reading(rows) == "" and "shared-prefix" not in pcr.ttft_over_nocache(rows)


def _reading_rows(multi_turn_hits, shared_hits):
    """Rows at budgets 8 and 16 for lru, flops, flops+ends: hit rates given per (policy, budget)."""
    rows = []
    for workload, hits, ceiling in (("multi-turn", multi_turn_hits, 0.667), ("shared-prefix", shared_hits, 0.889)):
        for (policy, budget), hit in hits.items():
            rows.append(dict(_row(workload, policy, budget, hit, int(hit > 0), 1.0, 1.0), ceiling_hit_rate=ceiling,
                             block_size=64, evictions=budget * 10 + len(policy)))
    return rows


def test_the_workload_reading_says_what_the_rows_say():
    shared = {("lru", 8): 0.222, ("flops", 8): 0.222, ("flops+ends", 8): 0.0,
              ("lru", 16): 0.444, ("flops", 16): 0.444, ("flops+ends", 16): 0.808}
    starved = {("lru", 8): 0.0, ("flops", 8): 0.0, ("flops+ends", 8): 0.0,
               ("lru", 16): 0.0, ("flops", 16): 0.0, ("flops+ends", 16): 0.083}
    text = pcr.workload_reading(_reading_rows(starved, shared))
    assert "too kind" in text and "the best row, flops+ends at 16 snapshots, restores **8%**" in text and "ceiling of 67%" in text
    assert "lru and flops restore nothing at all" in text and "(83 to 170 evictions a stream)" in text
    assert "at 8 snapshots `flops+ends` restores 0% against 22% for lru" in text
    assert "at 16 snapshots `flops+ends` restores 81% against 44%" in text and "loses when it cannot" in text
    # a budget that holds the chats: the prediction held, and no revised reading is offered
    fed = {k: (0.6 if k[1] == 16 else 0.2) for k in starved}
    text = pcr.workload_reading(_reading_rows(fed, {k: v for k, v in shared.items() if k[1] == 16}))
    assert "as predicted" in text and "Revised" not in text and "paid at every budget here" in text


def test_the_admission_verdict_names_where_ends_won_and_lost():
    shared = {("lru", 8): 0.222, ("flops+ends", 8): 0.0, ("lru", 16): 0.444, ("flops+ends", 16): 0.808}
    starved = {("lru", 8): 0.0, ("flops+ends", 8): 0.0, ("lru", 16): 0.0, ("flops+ends", 16): 0.083}
    text = pcr.admission_verdict(_reading_rows(starved, shared))
    assert "shared-prefix: `+ends` ahead at 16 snapshots, behind at 8 snapshots;" in text
    assert "multi-turn: `+ends` ahead at 16 snapshots;" in text and "no policy brought it near" in text
    assert pcr.admission_verdict([]) == "no workload rows with both kinds of admission."


def test_figures_have_one_panel_per_workload_and_readable_labels():
    rows = [_row(w, p, b, 0.3, 1, 1.0, 1.0) for w in ("shared-prefix", "multi-turn") for p in ("lru", "flops") for b in (3, 6)]
    fig = pcr.hit_rate_panels(rows, "t")
    assert len(fig.axes) == 2 and fig.get_size_inches()[0] <= 10
    for ax in fig.axes:
        assert all(t.get_fontsize() >= 8 and t.get_rotation() == 0 for t in ax.get_xticklabels())
    ttft = dict(model="m", prefix=40, suffix=5, ttft_nocache_ms=10.0, ttft_hit_ms=2.0)
    fig = pcr.ttft_bars([("this run", ttft), ("H200", ttft | {"ttft_nocache_ms": 0.5, "ttft_hit_ms": 0.1})])
    assert len(fig.axes) == 2 and all(ax.get_yscale() == "linear" for ax in fig.axes)
    assert fig.axes[1].get_ylim()[1] < 1  # each row on its own axis: a small one is not a sliver
    with pytest.raises(ValueError):
        pcr.hit_rate_panels([], "t")


def test_replay_figure_and_anatomy_figure_draw():
    from labkit import PRESETS
    from labkit.lab.cache_anatomy import cache_bytes_figure

    replay = {"rows": [dict(workload=w, policy=p, hit_rate=0.2, ceiling=0.5) for w in ("a", "b") for p in ("lru", "flops")],
              "snapshot_bytes": 10}
    fig = pcr.replay_figure(replay, "t")
    assert fig.get_size_inches()[0] <= 10 and len(fig.axes[0].patches) == 4
    fig = cache_bytes_figure({"lfm2-350m": PRESETS["lfm2-350m"]}, contexts=(256, 1024), batches=(1, 4))
    assert len(fig.axes) == 2
    with pytest.raises(ValueError):
        pcr.replay_figure({"rows": []}, "t")


def test_precision_figure_is_log_log_with_the_rounding_line():
    fig = pcr.precision_figure([("a", [1e-3, 1e-4, 1e-5])])
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log" and len(ax.lines) == 2
    with pytest.raises(ValueError):
        pcr.precision_figure([])
