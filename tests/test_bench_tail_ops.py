"""How ``bench tail-ops --write-tuning`` turns a prompt sweep into a GPU's ``prompt_gate_up`` settings
(pure selection over recorded rows: no GPU)."""

import json

import pytest

from labkit import tuning
from labkit.bench.tail_ops import TailOpRow, prompt_gate_up_entry

A = dict(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3, persistent=True,
         flatten=False, split_store=False, programs=0)
B = {**A, "num_stages": 4}


def row(model, tokens, baseline, times):
    r = TailOpRow("prompt_gate_up", model, tokens, 24, 5.0, baseline_us=baseline)
    r.sweep = sorted(([dict(settings=s, us=us, rel_err=0.0) for s, us in times]
                      + [dict(settings={**A, "block_m": 256}, error="out of shared memory")]),
                     key=lambda x: x.get("us", float("inf")))
    return r


def entry(rows):
    return prompt_gate_up_entry(rows, source="python -m labkit bench tail-ops ...", results="data/x.json", date="d")


def test_the_winner_is_the_best_geometric_mean_and_pays_from_the_shortest_length_it_always_wins():
    rows = [row("qwen", 4096, 100.0, [(A, 90.0), (B, 80.0)]), row("lfm2", 4096, 100.0, [(A, 90.0), (B, 99.0)]),
            row("qwen", 1024, 30.0, [(A, 29.0), (B, 31.0)]), row("lfm2", 1024, 30.0, [(A, 29.5), (B, 29.0)]),
            row("qwen", 512, 10.0, [(A, 10.5), (B, 9.0)]), row("lfm2", 512, 10.0, [(A, 9.0), (B, 9.0)])]
    e = entry(rows)
    # B: sqrt(0.80 * 0.99) = 0.890 beats A: 0.900 at 4,096; B loses for qwen at 1,024
    assert e["values"] == {"min_rows": 4096, **{k: v for k, v in B.items() if k != "programs"}}
    assert "4,096 rows 80.0 us against 100.0" in e["measured"] and e["results"] == "data/x.json"
    rows[1] = row("lfm2", 4096, 100.0, [(A, 90.0), (B, 102.0)])  # now A: 0.900 < sqrt(0.80 * 1.02) = 0.903
    e = entry(rows)
    assert e["values"]["num_stages"] == 3 and e["values"]["min_rows"] == 1024  # A loses for qwen at 512


def test_a_blocking_that_loses_at_the_longest_prompt_is_written_off():
    rows = [row("qwen", 4096, 100.0, [(A, 101.0)]), row("lfm2", 4096, 100.0, [(A, 90.0)])]
    assert entry(rows)["values"]["min_rows"] == 0
    assert "never" in entry(rows)["measured"]


def test_nothing_measured_writes_nothing():
    failed = row("qwen", 4096, 100.0, [])
    failed.error = "RuntimeError: no GPU"
    assert entry([failed]) is None
    assert entry([row("qwen", 4096, 100.0, [(A, 90.0)]), row("lfm2", 4096, 100.0, [(B, 90.0)])]) is None


def test_the_entry_is_a_valid_settings_entry_and_keeps_the_file_s_others(tmp_path):
    path = tuning.tuning_path("NVIDIA Test GPU", tmp_path)
    tuning.update_tuning_file(path, "NVIDIA Test GPU", settings={"norm_rope": {"values": {"num_warps": 4}}})
    e = entry([row("qwen", 4096, 100.0, [(A, 90.0)])])
    tuning.update_tuning_file(path, "NVIDIA Test GPU", settings={"prompt_gate_up": e})
    doc = json.loads(path.read_text())
    assert doc["settings"]["norm_rope"]["values"] == {"num_warps": 4}
    assert doc["settings"]["prompt_gate_up"]["values"]["min_rows"] == 4096
    with pytest.raises(tuning.TuningFileError, match="programs"):
        tuning.update_tuning_file(path, "NVIDIA Test GPU", settings={"prompt_gate_up": {"values": {"programs": 0}}})
