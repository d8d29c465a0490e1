"""labkit.lab.summary (notebook 08, the README's ladder block) on an invented ladder file in a
temporary data folder: the tables read every figure from it, the arithmetic of "what is left" and
of the exercise, the README block, and figures whose printed values stay inside their axes."""

import json
import shutil

import pytest

from labkit import resources
from labkit.lab import ladder, summary

ROOF = {"lfm2-350m": 6000.0, "qwen3.5-0.8b": 2800.0}


def _row(model, rung, batch, tps):
    roof = ROOF[model] * batch
    return {"model": model, "rung": rung, "impl": "fused+graph+pdl" if rung == "tuned" else rung,
            "tuning": rung == "tuned", "batch": batch, "prompt": 128, "new_tokens": 64, "tokens_per_s": tps,
            "step_ms": batch / tps * 1e3, "pct_of_roofline": 100 * tps / roof, "roofline_tokens_per_s": roof,
            "achieved_bytes_per_s": 7e8 * tps / batch, "error": None}


@pytest.fixture
def data(tmp_path, monkeypatch):
    """data/bench/nvidia-h200 with an invented ladder.json and the committed chain.json."""
    gpu = tmp_path / "nvidia-h200"
    gpu.mkdir()
    shutil.copyfile(resources.bench_dir() / "nvidia-h200" / "chain.json", gpu / "chain.json")
    rows = [_row(m, r, b, (i + 1) * 100.0 * b * (0.5 if b == 16 else 1) * (0.5 if m.startswith("qwen") else 1))
            for m in ROOF for b in (1, 16) for i, r in enumerate(ladder.RUNGS)]
    rows[-1] = {**rows[-1], "tokens_per_s": None, "error": "it failed (invented)"}
    (gpu / "ladder.json").write_text(json.dumps({"gpu": "NVIDIA H200", "date": "2026-12-03T00:00:00+00:00",
                                                 "command": "python -m labkit bench ladder", "kind": "decode",
                                                 "results": rows}))
    monkeypatch.setattr(ladder, "results_dir", lambda data_dir=None: tmp_path)
    return rows


def test_the_table_has_every_rung_and_marks_one_without_a_figure(data):
    rows = summary.ladder_rows()
    table = summary.markdown_table(rows)
    assert table.count("\n") == 1 + len(ladder.RUNGS) * 4
    assert table.count("| — | — | — |") == 1 and "it failed (invented)" in table
    assert "| LFM2-350M | tuned | 1 | 800.0 | 13.3% | 6,000 |" in table


def test_what_is_left_is_the_step_above_the_roofline_in_fixed_costs(data):
    rows = summary.ladder_rows()
    left = {(r["model"], r["batch"]): r for r in summary.what_is_left(rows)}
    lfm = left["lfm2-350m", 1]
    assert lfm["rung"] == "tuned" and lfm["step_us"] == pytest.approx(1e6 / 800)
    assert lfm["roofline_step_us"] == pytest.approx(1e6 / 6000)
    fixed = ladder.fixed_cost_per_kernel()["us"]
    assert lfm["fixed_costs"] == pytest.approx((1e6 / 800 - 1e6 / 6000) / fixed)
    assert lfm["to_target_tokens_per_s"] == pytest.approx(0.8 * 6000 - 800)
    assert left["qwen3.5-0.8b", 16]["rung"] == "persistent"  # tuned failed there: the best that has a figure


def test_the_stage_table_sets_each_gain_beside_the_articles(data):
    table = summary.stage_table(summary.ladder_rows())
    assert "| fusion | 145 | 2.79x | `fused` | 400 | 2.00x |" in table
    # tuned is compared with fused+graph+pdl (the same kernels), not with the persistent rung listed before it
    assert "| B200-specific tuning | 480 | 1.26x | `tuned` | 800 | 1.33x | — (the same kernels, tuned) |" in table
    assert "| adaptive KV cache | 240 | 1.66x | none" in table


def test_the_exercise_answer_and_its_check(data):
    rows = summary.ladder_rows()
    a = summary.batch16_prediction(rows)
    # the batch-16 step as long as batch 1's: 16 tokens per batch-1 step, over the batch-16 roofline
    assert a["predicted_pct"] == pytest.approx(100 * 16 * 600 / (16 * 6000))
    assert a["measured_pct"] == pytest.approx(100 * 300 * 16 / (16 * 6000))
    assert "Put your prediction" in summary.check_batch16_prediction(rows, None)
    assert "**Right**" in summary.check_batch16_prediction(rows, a["predicted_pct"] + 0.5)
    wrong = summary.check_batch16_prediction(rows, a["predicted_pct"] + 5)
    assert "**Not yet**" in wrong and wrong.index("<details>") < wrong.index(f"{a['predicted_pct']:.1f}%")


def test_the_readme_block_is_rewritten_and_only_it(data, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{summary.README_BEGIN}\nold\n{summary.README_END}\ntail\n")
    summary.update_readme(readme)
    text = readme.read_text()
    assert text.startswith(f"head\n{summary.README_BEGIN}\n| model | rung |") and text.endswith(f"{summary.README_END}\ntail\n")
    assert "old" not in text
    summary.update_readme(readme)
    assert readme.read_text() == text
    (tmp_path / "bare.md").write_text("no markers")
    with pytest.raises(ValueError, match="no ladder markers"):
        summary.update_readme(tmp_path / "bare.md")


def test_the_readme_has_the_ladder_block():
    text = (resources.checkout() / "README.md").read_text(encoding="utf-8")
    assert text.count(summary.README_BEGIN) == 1 and text.index(summary.README_BEGIN) < text.index(summary.README_END)


def test_no_ladder_file_is_an_error_naming_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "results_dir", lambda data_dir=None: tmp_path)
    with pytest.raises(ladder.LadderMissing, match="python -m labkit bench ladder"):
        summary.ladder_rows()


def test_every_printed_value_lies_inside_its_axes(data):
    import matplotlib

    matplotlib.use("Agg")
    fig = summary.plot_batch(summary.ladder_rows(), 16, "title")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for text in ax.texts:
            t = text.get_window_extent(renderer)
            assert box.x0 <= t.x0 and t.x1 <= box.x1, f"{text.get_text()!r} runs out of {ax.get_title()!r}"
        assert ax.get_xlabel() and ax.get_title()
