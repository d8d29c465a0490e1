"""The committed results files a notebook teaches with, read together and listed with their
provenance (file, date, command), so that a page says where each of its numbers comes from."""

from __future__ import annotations

from dataclasses import dataclass

from .notebooks import REFERENCE_GPU, committed_results


def load(names, gpu: str = REFERENCE_GPU) -> dict[str, dict]:
    """Every file of ``names`` (``data/bench/<gpu>/<name>.json``); a missing one is an error that
    lists what the GPU has, never a figure quietly left out."""
    return {name: committed_results(name, gpu) for name in names}


def files_table(results: dict[str, dict]) -> str:
    """A Markdown table of the files: name, date (UTC, to the minute) and the command that wrote it."""
    rows = [f"| `{name}.json` | {doc['date'][:16]} | `{doc['command']}` |" for name, doc in results.items()]
    return "| file | date (UTC) | command |\n| --- | --- | --- |\n" + "\n".join(rows)


@dataclass
class Measured:
    """One figure a notebook measured in this run (SAVE_RESULTS writes them); ``x`` is the size or
    count it was measured at, where there is one."""

    section: str
    label: str
    value: float
    unit: str
    x: float | None = None
