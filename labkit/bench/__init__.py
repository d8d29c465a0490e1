"""Benchmarks: every timing in labkit, one command per kind, results written with their provenance.

    python -m labkit bench decode --impls fused+graph --name ...   # tokens/s, steady state and wall clock
    python -m labkit bench prefill --impls reference --name ...    # ms per prompt
    python -m labkit bench ops --name ...                          # each decode op, checked then timed
    python -m labkit bench hw | table                              # GPU facts; the README's table
    python -m labkit bench hit-timeline | hit-host                 # a prefix-cache hit: clock vs GPU; host side
    python -m labkit bench prefill-profile --check --ablate all    # a prefill's device time, kernel by kernel
    python -m labkit bench --help                                  # every subcommand (chain, tma, latency, ...)
    python -m labkit tune                                          # linear blockings -> data/tuning/

Modules: :mod:`~labkit.bench.decode` (decode and prefill, labkit's backends and peers),
:mod:`~labkit.bench.ops` (single ops at the real shapes), :mod:`~labkit.bench.tune` (the sweep
behind ``data/tuning``), :mod:`~labkit.bench.results` (files and tables), :mod:`~labkit.bench.prefix_hit` (a prefix-cache hit),
:mod:`~labkit.bench.prefill_profile` (a prefill per kernel), :mod:`~labkit.bench.tma_alignment`,
:mod:`~labkit.bench.ncu_metrics`. All of them time with
:func:`labkit.lab.timing.measure`.
"""

from .decode import (
    PEERS,
    DecodeResult,
    PrefillResult,
    Runner,
    labkit_runner,
    make_runner,
    time_decode,
    time_prefill,
    transformers_runner,
    wall_clock_generate,
)
from .results import DATA_DIR, README_BEGIN, README_END, load_results, markdown_table, provenance, update_readme, write_results


def main(argv: list[str]) -> int:
    """``python -m labkit bench ...`` (see :mod:`labkit.bench.cli`)."""
    from .cli import main as cli_main

    return cli_main(argv)


__all__ = [
    "DATA_DIR", "PEERS", "README_BEGIN", "README_END", "DecodeResult", "PrefillResult", "Runner", "labkit_runner",
    "load_results", "main", "make_runner", "markdown_table", "provenance", "time_decode", "time_prefill",
    "transformers_runner", "update_readme", "wall_clock_generate", "write_results",
]
