"""One source of truth for every committed figure: no two live results files under data/bench/<gpu>/
give different tokens/s for the same thing measured (GPU, model, rung or implementation with its kernel
settings, batch, prompt and steps; prefill: prompt tokens), the README's table is what
`python -m labkit bench table --readme README.md` writes now, the ladder file holds every rung, and the
superseded files in archive/ are read by nothing."""

import json
from pathlib import Path

import pytest

from labkit.bench.results import README_BEGIN, README_END, clashes, figure_key, load_results, markdown_table
from labkit.lab import ladder
from labkit.lab.notebooks import committed_results

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "bench"
H200 = "nvidia-h200"
H100 = "nvidia-h100-80gb-hbm3"

# Clashes left for the notebooks that write them to resolve, on each GPU both ran on: notebooks 01
# (baseline-decode.json) and 02 (fused-ladder.json) each time the reference rung at 128 + 32 tokens in their
# own run, and the host-bound reference moves between runs (up to 2x). Both notebooks are to read the
# reference rungs from ladder.json (labkit.lab.ladder.figure) and stop writing their own; then this list
# empties. Listed exactly: a new clash fails, and so does an entry that no longer clashes.
KNOWN_CLASHES = {
    (gpu, "decode", model, "reference", "n/a", batch, 128, 32): [f"data/bench/{gpu}/baseline-decode.json",
                                                              f"data/bench/{gpu}/fused-ladder.json"]
    for gpu in (H200, H100) for model in ("lfm2-350m", "qwen3.5-0.8b") for batch in (1, 16)
}


def _doc(path, kind, rows, date="2026-12-03"):
    return {"path": path, "kind": kind, "date": date, "results": rows}


def _decode(impl, tps, **extra):
    return {"model": "m", "impl": impl, "batch": 1, "prompt": 128, "new_tokens": 64, "tokens_per_s": tps, **extra}


def test_two_files_with_one_key_and_two_figures_clash():
    a = _doc("data/bench/g/a.json", "decode", [_decode("fused+graph", 100.0)])
    b = _doc("data/bench/g/b.json", "decode", [_decode("fused+graph", 101.0)])
    got = clashes([a, b])
    assert list(got.values()) == [[("data/bench/g/a.json", 100.0), ("data/bench/g/b.json", 101.0)]]


def test_other_steps_settings_or_gpus_are_other_figures():
    a = _doc("data/bench/g/a.json", "decode", [_decode("fused+graph", 100.0)])
    steps = _doc("data/bench/g/b.json", "decode", [_decode("fused+graph", 50.0, new_tokens=256)])
    heuristic = _doc("data/bench/g/c.json", "decode", [_decode("fused+graph", 60.0, tuning="heuristic")])
    other_gpu = _doc("data/bench/h/a.json", "decode", [_decode("fused+graph", 70.0)])
    failed = _doc("data/bench/g/d.json", "decode", [_decode("fused+graph", None, error="boom")])
    assert clashes([a, steps, heuristic, other_gpu, failed]) == {}


def test_a_row_without_tuning_ran_with_the_gpus_file_and_the_reference_reads_none():
    legacy = _doc("data/bench/g/a.json", "decode", [_decode("fused+graph+pdl", 100.0), _decode("reference", 5.0)])
    tuned = _doc("data/bench/g/ladder.json", "decode", [_decode("fused+graph+pdl", 90.0, rung="tuned",
                                                                  tuning="data/tuning/g.json"),
                                                          _decode("reference", 6.0, rung="reference",
                                                                  tuning="heuristic")])
    assert figure_key(legacy, legacy["results"][0]) == figure_key(tuned, tuned["results"][0])
    assert len(clashes([legacy, tuned])) == 2


def test_prefill_rows_clash_by_prompt_tokens():
    row = {"model": "m", "impl": "fused+graph", "batch": 1, "tokens": 512, "ms": 2.0, "tokens_per_s": 256000.0}
    a = _doc("data/bench/g/a.json", "prefill", [row])
    b = _doc("data/bench/g/b.json", "prefill", [{**row, "ms": 2.1, "tokens_per_s": 243809.5}])
    c = _doc("data/bench/g/c.json", "prefill", [{**row, "tokens": 4096, "tokens_per_s": 1.0}])
    assert len(clashes([a, b, c])) == 1


def test_no_two_committed_files_give_one_figure_two_values():
    found = clashes(load_results(DATA))
    got = {k: [path for path, _ in v] for k, v in found.items()}
    new = {k: v for k, v in found.items() if k not in KNOWN_CLASHES}
    assert not new, "two committed results files disagree (move the superseded one to archive/):\n" + "\n".join(
        f"{k}: {v}" for k, v in new.items())
    assert got == KNOWN_CLASHES, "KNOWN_CLASHES lists clashes that are gone: remove them"


def test_the_readme_table_is_what_bench_table_writes_now():
    text = (ROOT / "README.md").read_text()
    committed = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip("\n")
    assert committed == markdown_table(load_results(DATA)), \
        "README's results table is stale: run `python -m labkit bench table --readme README.md`"


def test_the_ladder_holds_every_rung_of_both_models_at_batch_1_and_16():
    if not ladder.ladder_path(H200).exists():
        pytest.skip(f"data/bench/{H200}/ladder.json not measured yet: run `{ladder.LADDER_COMMAND}` on the H200")
    rows = ladder.rows(H200)
    keys = [(r["model"], r["rung"], r["batch"]) for r in rows]
    want = {(m, rung, b) for m in ("lfm2-350m", "qwen3.5-0.8b") for rung in ladder.RUNGS for b in (1, 16)}
    assert len(keys) == len(set(keys)) and want <= set(keys)
    # beyond batch 1 and 16, only the tuned rung's batch curve (bench ladder --tuned-batch)
    assert {rung for _, rung, b in set(keys) - want} <= {"tuned"}
    assert {(r["prompt"], r["new_tokens"]) for r in rows} == {(128, 64)}
    for r in rows:
        assert (r["tokens_per_s"] or 0) > 0 or r.get("absent"), f"{r['model']} {r['rung']} B={r['batch']}: {r.get('error')}"
        assert r["tuning"] == ("data/tuning/nvidia-h200.json" if r["rung"] == "tuned" else "heuristic")


# -- archive/ is read by nothing ------------------------------------------------------------------------
def test_load_results_never_reads_archive(tmp_path):
    assert not [d for d in load_results(DATA) if "/archive/" in d["path"]]
    assert list((DATA / H200 / "archive").glob("*.json")), "the committed archive holds the superseded files"
    (tmp_path / "g" / "archive").mkdir(parents=True)
    row = {"model": "m", "impl": "reference", "batch": 1, "tokens_per_s": 1.0, "achieved_bytes_per_s": 1.0}
    for where in ("g/live.json", "g/archive/old.json"):
        (tmp_path / where).write_text(json.dumps({"kind": "decode", "results": [row]}))
    assert [Path(d["path"]).name for d in load_results(tmp_path)] == ["live.json"]


@pytest.mark.parametrize("name", ["before-decode", "after-decode", "bench-decode", "before-prefill", "after-prefill",
                                  "prefill-fused"])
def test_committed_results_never_reads_archive(name):
    assert (DATA / H200 / "archive" / f"{name}.json").exists()
    with pytest.raises(FileNotFoundError, match="no committed results"):
        committed_results(name)
    with pytest.raises(ValueError, match="plain file name"):
        committed_results(f"archive/{name}")
    with pytest.raises(ValueError, match="plain file name"):
        committed_results(name, gpu=f"{H200}/archive")
    with pytest.raises(ValueError, match="plain file name"):
        ladder.rows(f"{H200}/archive")
