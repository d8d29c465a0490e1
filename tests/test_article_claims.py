"""labkit.lab.article_claims: every claim names a notebook and a results file that exist, its figure
reads from the committed H200 files, and a verdict whose figure stopped supporting it is flagged."""

import math

import pytest

from labkit import resources
from labkit.lab import article_claims as ac

NOTEBOOKS = resources.notebooks_dir()
GPU = "nvidia-h200"
# the headline figures the ladder claims read, invented for the test only (ladder.json is one H200 run)
FAKE = {"reference": 50.0, "reference+graph": 500.0, "fused": 200.0, "fused+graph": 2000.0,
        "fused+graph+pdl": 2400.0, "persistent": 1800.0, "tuned": 2600.0, "transformers": 40.0}


@pytest.fixture
def fake_ladder(monkeypatch):
    def figure(model, rung, batch, key, gpu):
        assert (model, batch, gpu) == (ac.LFM2, 1, GPU)
        return {"tokens_per_s": FAKE[rung], "pct_of_roofline": 100 * FAKE[rung] / 6000.0,
                "roofline_tokens_per_s": 6000.0}[key]

    monkeypatch.setattr(ac, "_ladder", figure)
    monkeypatch.setattr(ac, "_rungs", lambda: tuple(FAKE))


def test_every_claim_names_a_notebook_that_exists_and_a_stage_of_the_article():
    stages = {name for name, _ in ac.ARTICLE_LADDER} | {"setup"}
    for claim in ac.CLAIMS:
        assert (NOTEBOOKS / claim.notebook).is_file(), claim.says
        assert claim.stage in stages, claim.says
        assert (claim.figure is None) == (claim.holds is None), claim.says
    assert {c.stage for c in ac.CLAIMS} >= {name for name, _ in ac.ARTICLE_LADDER}


def test_claims_on_committed_files_read_a_finite_figure_that_supports_the_verdict():
    checked = 0
    for claim in ac.CLAIMS:
        if claim.figure is None or claim.results == "ladder":
            continue
        if claim.results is not None:
            assert (resources.checkout() / "data" / "bench" / GPU / f"{claim.results}.json").is_file(), claim.results
        value = claim.measure(GPU)
        assert math.isfinite(value)
        assert claim.holds(value), f"{claim.says}: {claim.shows.format(value)} no longer supports its verdict"
        checked += 1
    assert checked >= 8


def test_ladder_claims_compute_their_ratios_from_the_ladder(fake_ladder):
    by_says = {c.says: c for c in ac.CLAIMS}
    fusion = next(c for c in ac.CLAIMS if c.stage == "fusion" and c.results == "ladder")
    assert fusion.measure(GPU) == pytest.approx(FAKE["fused"] / FAKE["reference"])
    end = next(c for c in ac.CLAIMS if "eight B200s" in c.says)
    assert end.measure(GPU) == pytest.approx(max(FAKE.values()) / 480)
    rows = ac.verdicts(GPU)
    assert len(rows) == len(by_says) == len(ac.CLAIMS)
    assert all(r["holds"] for r in rows), [r["says"] for r in rows if not r["holds"]]


def test_a_figure_that_no_longer_supports_its_verdict_is_flagged(fake_ladder, monkeypatch):
    monkeypatch.setitem(FAKE, "persistent", 3000.0)  # faster than fused+graph+pdl: "not yet" would be false
    rows = ac.verdicts(GPU)
    bad = [r for r in rows if not r["holds"]]
    assert [r["notebook"] for r in bad] == ["05_persistent_decode.ipynb"]
    table = ac.markdown_table(rows)
    assert table.count("no longer supports") == 1
    assert table.count("\n") == len(rows) + 1


def test_a_figure_that_is_not_a_number_is_an_error(monkeypatch):
    claim = next(c for c in ac.CLAIMS if c.results == "fusion-evidence")
    broken = ac.Claim(**{**claim.__dict__, "figure": lambda gpu: float("nan")})
    with pytest.raises(ValueError, match="fusion-evidence.json"):
        broken.measure(GPU)
