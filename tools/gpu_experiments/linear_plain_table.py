"""Entries of data/tuning/nvidia-h200.json from a linear-plain round-B run (not code: measurements).

For every batch-1 key of both presets, the faster of the table's blocking ("new+pre") and the plain
GEMV's blocking ("newplain+pre"), each timed as the sub-chain of the ops that share the key, in the
same run (labkit.bench.chain, PDL preload+early, weight copies past L2). The LM head (logits and greedy
keys alike, so that both paths sum in the same order) gets the blocking of the "new+pre-head<N>x<K>"
variant when that whole chain beat "new+pre" on both presets. Batch 16: the keys where the unfused
path (labkit.ops.linear.linear_unfused) beat this kernel per key in the same run get "impl": "torch".
Each part runs where the run holds its variants (first run of 05:38: batch 1; second of 06:07: batch 16).

    python3 tools/gpu_experiments/linear_plain_table.py /work/gpu-results/linear-plain
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from labkit import tuning  # noqa: E402
from labkit.ops.linear import LinearConfig, TuningKey  # noqa: E402

TABLE = REPO / "data" / "tuning" / "nvidia-h200.json"
HEADS = {"new+pre-head8x1024": LinearConfig(1, 8, 1024, 1, 4, 1), "new+pre-head16x1024": LinearConfig(1, 16, 1024, 1, 8, 1)}


def config_of(text: str) -> LinearConfig:
    return LinearConfig(**{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)})


def batch16(res: Path, entries: dict, source: str) -> None:
    """Batch-16 keys (not the LM head) where linear_unfused's sub-chain ("torch") beat this kernel's ("new")
    by more than labkit.bench.tune.DISPATCH_MARGIN in the same run: "impl": "torch" (config: the blocking
    the kernel was timed with, kept for a later run without the dispatch)."""
    from labkit.bench.tune import DISPATCH_MARGIN

    for sub in ("lfm2", "qwen"):
        rows = [r for r in json.loads((res / sub / "chain.json").read_text()) if r["batch"] == 16]
        per: dict = {}
        for r in rows:
            if r["tag"] in ("new", "torch"):
                for g in r["groups"]:
                    if "us_per_kernel" in g:
                        per.setdefault(TuningKey(**g["key"]), {})[r["tag"]] = g
        for key, by in per.items():
            if len(by) < 2 or key.n >= 32768 or "new" not in by or by["new"].get("config") in (None, "None"):
                continue
            us_k, us_t = by["new"]["us_per_kernel"], by["torch"]["us_per_kernel"]
            if not us_t < us_k * (1 - DISPATCH_MARGIN):
                print(f"{key}: kernel {us_k:.2f} us, unfused {us_t:.2f} us -> kernel")
                continue
            entries[key] = {"key": tuning.key_to_dict(key), "config": tuning.config_to_dict(config_of(by["new"]["config"])),
                            "impl": "torch", "us": {"triton": round(us_k, 3), "torch": round(us_t, 3)},
                            "ops": [f"{rows[0]['model']} {o}" for o in by["new"]["ops"]], "date": "2026-12-01",
                            "source": source}
            print(f"{key}: kernel {us_k:.2f} us, unfused {us_t:.2f} us -> impl torch")


def main(res: Path) -> int:
    doc = tuning.read_tuning_file(TABLE)
    entries = {tuning.key_from_dict(e["key"], str(TABLE)): e for e in doc["linear"]}
    source = f"round B of branch linear-plain ({res}), tools/gpu_experiments/linear-plain.sh"
    chains = {}
    for sub in ("lfm2", "qwen"):
        rows = {r["tag"]: r for r in json.loads((res / sub / "chain.json").read_text()) if r["batch"] == 1}
        chains[sub] = rows
        groups = {}
        if "newplain+pre" not in rows:
            continue
        for tag in ("new+pre", "newplain+pre"):
            for g in rows[tag]["groups"]:
                if "us_per_kernel" in g:
                    groups.setdefault(TuningKey(**g["key"]), {})[tag] = (g["us_per_kernel"], config_of(g["config"]), g)
        for key, by in groups.items():
            if len(by) < 2 or key.n >= 32768:
                continue  # the LM head: below, from whole chains
            (us_t, cfg_t, g), (us_p, cfg_p, _) = by["new+pre"], by["newplain+pre"]
            best = cfg_p if us_p < us_t else cfg_t
            old = entries.get(key, {})
            entries[key] = {"key": tuning.key_to_dict(key), "config": tuning.config_to_dict(best),
                            "heuristic": old.get("heuristic"),
                            "us": {"table": round(us_t, 3), "plain_blocking": round(us_p, 3)},
                            "ops": [f"{rows['new+pre']['model']} {o}" for o in g["ops"]],
                            "candidates": 2, "date": "2026-12-01", "source": source,
                            "previous": old.get("config")}
            print(f"{key}: table {us_t:.2f} us ({cfg_t}), plain {us_p:.2f} us -> {best}")
    for tag, cfg in HEADS.items():
        if not all(tag in r for r in chains.values()):
            continue
        wins = all(tag in r and not r[tag]["error"] and r[tag]["ms"] < r["new+pre"]["ms"] for r in chains.values())
        print(f"{tag}: " + ", ".join(f"{s} {r[tag]['ms']:.3f} vs {r['new+pre']['ms']:.3f} ms" for s, r in chains.items()))
        if not wins or any(e.get("source") == source and e["key"]["n"] >= 32768 for e in entries.values()):
            continue
        for sub, r in chains.items():
            n = {"lfm2": 65536, "qwen": 248320}[sub]
            for argmax in (False, True):
                key = TuningKey(1, n, 1024, 1, argmax)
                entries[key] = {"key": tuning.key_to_dict(key), "config": tuning.config_to_dict(cfg),
                                "chain_ms": {"new+pre": r["new+pre"]["ms"], tag: r[tag]["ms"]},
                                "ops": [f"{r[tag]['model']} lm_head{'+greedy' if argmax else ''}"],
                                "candidates": len(HEADS) + 1, "date": "2026-12-01", "source": source}
        print(f"  -> LM heads: {cfg}")
    batch16(res, entries, source)
    doc["linear"] = [{k: v for k, v in e.items() if v is not None} for e in entries.values()]
    doc["notes"] = [n for n in doc.get("notes", []) if "linear-plain" not in n] + [
        "Batch 1 (2026-12-01, branch linear-plain): the weights-first kernel, each key the faster of the table's "
        "blocking and the plain GEMV's (4 rows x min(1024, K), 4 warps), timed as sub-chains in one run; the LM "
        "heads from whole chains ('chain_ms'). Written by tools/gpu_experiments/linear_plain_table.py."]
    tuning.write_tuning_file(TABLE, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
