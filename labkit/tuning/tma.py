"""The ``tma`` section: measured blockings of the CUDA TMA GEMV (:func:`labkit.cuda.tma_linear`).

One entry per (batch bucket, streamed rows N, K), written from a sweep's results by
``python -m labkit bench tma --tuning-from data/bench/<gpu>/tma-sweep.json``, with the sweep's
provenance beside the entries::

    "tma": {"versions": {...}, "date": "...", "command": "...", "source": "data/bench/.../tma-sweep.json",
            "entries": [{"m_bucket": 1, "n": 1024, "k": 1024,
                         "config": {"block_n": 32, "block_k": 128, "stages": 4, "split_k": 0, "max_blocks": 0, "fill": 2},
                         "us": 5.05, "gb_per_s": 415.1, "where": "lfm2-350m conv.out_proj+residual"}, ...]}

Batches share a configuration by :func:`labkit.ops.linear.m_bucket`, the linear table's own
bucketing: the TMA kernel takes 1..16 rows, so its buckets are 1 (a GEMV) and 16 (the sweep
times 16). ``n`` is the weight's row count as streamed (SwiGLU's stacked gate|up counts both).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .files import TuningFileError
from .linear import is_int

if TYPE_CHECKING:  # labkit.cuda imports triton (its argument checks): only when a config is wanted
    from ..cuda import TmaConfig

BUCKETS = (1, 16)


def bucket(batch: int) -> int:
    """The batch bucket of the TMA table: the linear table's (:func:`labkit.ops.linear.m_bucket`)."""
    from ..ops.linear import m_bucket

    return m_bucket(batch)


def config_from_dict(d: Any, where: str) -> "TmaConfig":
    from ..cuda import TmaConfig

    names = {f.name for f in dataclasses.fields(TmaConfig)}
    if not isinstance(d, dict) or not set(d) <= names or not all(is_int(v) for v in d.values()):
        raise TuningFileError(f"{where}: config must be an object of integers with fields from {sorted(names)}, got {d!r}")
    try:
        return TmaConfig(**d)
    except ValueError as e:
        raise TuningFileError(f"{where}: {e}") from None


def check_section(section: Any, where: str) -> None:
    if not isinstance(section, dict) or not isinstance(section.get("entries"), list):
        raise TuningFileError(f"{where}: 'tma' must be an object with an 'entries' list")
    seen = set()
    for i, e in enumerate(section["entries"]):
        at = f"{where}: tma.entries[{i}]"
        if not isinstance(e, dict) or not {"m_bucket", "n", "k", "config"} <= set(e):
            raise TuningFileError(f"{at}: each entry needs 'm_bucket', 'n', 'k' and 'config', got {e!r}")
        if e["m_bucket"] not in BUCKETS or not is_int(e["m_bucket"]):
            raise TuningFileError(f"{at}: m_bucket must be one of {BUCKETS} (the TMA kernel takes 1..16 rows), "
                                  f"got {e['m_bucket']!r}")
        for name in ("n", "k"):
            if not is_int(e[name]) or e[name] < 1:
                raise TuningFileError(f"{at}: {name} must be a positive integer, got {e[name]!r}")
        config_from_dict(e["config"], at)
        key = (e["m_bucket"], e["n"], e["k"])
        if key in seen:
            raise TuningFileError(f"{at}: a second entry for (m_bucket, n, k) = {key}")
        seen.add(key)


def table_of(doc: dict, where: str) -> dict[tuple[int, int, int], "TmaConfig"]:
    """(batch bucket, N, K) -> config of a (checked) document; empty without a tma section."""
    entries = doc.get("tma", {}).get("entries", [])
    return {(e["m_bucket"], e["n"], e["k"]): config_from_dict(e["config"], where) for e in entries}
