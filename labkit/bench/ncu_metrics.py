"""``python -m labkit bench ncu-metrics``: which of the article's Nsight Compute metric names exist.

Reads the base metric names that ``ncu --query-metrics --chip <chip>`` lists (run here, or read from a
file saved from it with ``--listing``) and, for each name the article uses, says whether it is listed
and which listed names share its unit and start (the real counters for what it meant). Writes
``data/bench/<gpu>/ncu-metric-names.json`` (kind ``ncu-metrics``).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

# the article's names, and the real counters for what it meant
ARTICLE_NAMES = ("sm__maximum_warps_avg", "sm__warps_active_avg", "tma__bytes_queried", "tma__throughput",
                 "sm__warps_active", "sm__maximum_warps_per_active_cycle_pct", "dram__throughput")
MIN_LISTED = 100  # fewer base names than this is an error message, not a listing


@dataclass
class MetricName:
    name: str
    listed: bool
    matches: list = field(default_factory=list)


def base_names(listing: str) -> set[str]:
    """The ``unit__counter`` names at the start of the lines of ``ncu --query-metrics``'s output."""
    return {m.group(1) for m in re.finditer(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", listing, re.M)}


def check_names(bases: set[str], names=ARTICLE_NAMES) -> list[MetricName]:
    """Each name: listed or not, and up to 8 listed names of its unit that share the first 6
    letters of its counter."""
    rows = []
    for name in names:
        unit, counter = name.split("__", 1)
        near = sorted(b for b in bases if b.startswith(unit + "__") and counter[:6] in b)[:8]
        rows.append(MetricName(name, name in bases, near))
    return rows


def main(argv: list[str]) -> int:
    from ..lab.hw import device_facts
    from .cli import results_name
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench ncu-metrics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chip", default="gh100", help="ncu's --chip (gh100: the H100/H200)")
    p.add_argument("--listing", type=Path, help="read this saved output of ncu --query-metrics instead of running ncu")
    p.add_argument("--device", default="auto", help="whose facts the file records (auto: the GPU if there is one)")
    p.add_argument("--name", type=results_name, default="ncu-metric-names", help="data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    query = ["ncu", "--query-metrics", "--chip", args.chip]
    if args.listing is not None:
        if not args.listing.is_file():
            p.error(f"argument --listing: {args.listing} is not a file")
        listing = args.listing.read_text(errors="replace")
    else:
        try:
            listing = subprocess.run(query, capture_output=True, text=True, timeout=60, check=False).stdout
        except FileNotFoundError:
            print("ncu (Nsight Compute) is not on the PATH: install it, or give --listing FILE")
            return 2
    bases = base_names(listing)
    print(f"{len(bases)} base metric names listed")
    if len(bases) < MIN_LISTED:
        print(f"that is not a listing (fewer than {MIN_LISTED} names): nothing written. Its start:\n{listing[:500]}")
        return 1
    rows = check_names(bases)
    for r in rows:
        print(f"{r.name:40s} {'listed' if r.listed else 'not listed':10s} {', '.join(r.matches)}")
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    command = shlex.join(["python", "-m", "labkit", "bench", "ncu-metrics", *argv])
    path = write_results(args.name, "ncu-metrics", rows, device_facts(device, measure=False), command=command,
                         data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0
