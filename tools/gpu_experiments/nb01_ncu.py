"""Which of the article's Nsight Compute metric names exist: reads `ncu --query-metrics` output
($RES/ncu-query.txt) and writes $RES/nvidia-h200/ncu-metric-names.json (with provenance)."""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from labkit.bench.results import write_results
from labkit.lab.hw import device_facts

# the article's names, and the real counters for what it meant
NAMES = ["sm__maximum_warps_avg", "sm__warps_active_avg", "tma__bytes_queried", "tma__throughput",
         "sm__warps_active", "sm__maximum_warps_per_active_cycle_pct", "dram__throughput"]


@dataclass
class MetricName:
    name: str
    listed: bool
    matches: list


res = Path(os.environ.get("RES", "/tmp/nb01-res"))
text = (res / "ncu-query.txt").read_text(errors="replace")
bases = {m.group(1) for m in re.finditer(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", text, re.M)}
print(f"{len(bases)} base metric names listed")
rows = []
for name in NAMES:
    rows.append(MetricName(name, name in bases, sorted(b for b in bases if b.startswith(name.split("__")[0] + "__")
                                                          and name.split("__")[1][:6] in b)[:8]))
    print(rows[-1])
if len(bases) > 100:  # a real listing, not an error message
    print(write_results("ncu-metric-names", "ncu-metrics", rows, device_facts("cuda", measure=False),
                        command="ncu --query-metrics --chip gh100 (tools/gpu_experiments/nb01.sh)", data_dir=res))
