"""The ``linear`` section: measured blockings of :mod:`labkit.ops.linear`'s skinny GEMM, by key.

One entry per :class:`~labkit.ops.linear.TuningKey` (batch bucket, outputs per row block, K, row
blocks, greedy head), beside what the tune command measured::

    {"key": {"m_bucket": 1, "n": 1024, "k": 1024, "row_blocks": 3, "argmax": false},
     "config": {"block_m": 1, "block_n": 4, "block_k": 1024, "split_k": 1, "num_warps": 8, "num_stages": 1},
     "heuristic": {... the configuration the heuristic picks ...},
     "us": {"heuristic": 6.05, "tuned": 5.27},     # timed on the first of "ops"
     "ops": ["lfm2-350m conv.in_proj+norm+short_conv"], "date": "...", "source": "..."}

An entry may say ``"impl": "torch"``: at that key the projection runs unfused
(:func:`labkit.ops.linear.linear_unfused`: one-kernel norm, cuBLAS matmul, one-kernel epilogue)
because that measured faster inside the chained step than any blocking of the Triton kernel
(``python -m labkit tune --chain``); absent means "triton". Never for the LM head's keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .files import TuningFileError, read_tuning_file

if TYPE_CHECKING:  # ops.linear imports triton: only when a configuration is actually wanted
    from ..ops.linear import LinearConfig, TuningKey

IMPLS = ("triton", "torch")
KEY_FIELDS = {"m_bucket": int, "n": int, "k": int, "row_blocks": int, "argmax": bool}


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def key_from_dict(d: Any, where: str) -> "TuningKey":
    from ..ops.linear import TuningKey, m_bucket

    if not isinstance(d, dict) or set(d) != set(KEY_FIELDS):
        raise TuningFileError(f"{where}: key must be an object with exactly {sorted(KEY_FIELDS)}, got {d!r}")
    for name, kind in KEY_FIELDS.items():
        value = d[name]
        ok = isinstance(value, bool) if kind is bool else is_int(value)
        if not ok or (kind is int and value < 1):
            raise TuningFileError(f"{where}: key.{name} must be a {'boolean' if kind is bool else 'positive integer'}, "
                                  f"got {value!r}")
    if m_bucket(d["m_bucket"]) != d["m_bucket"]:
        raise TuningFileError(f"{where}: key.m_bucket must be 1, 16, 32, 64, ... (a batch bucket), got {d['m_bucket']}")
    if d["row_blocks"] not in (1, 2, 3):
        raise TuningFileError(f"{where}: key.row_blocks must be 1, 2 or 3, got {d['row_blocks']}")
    return TuningKey(**d)


def config_from_dict(d: Any, where: str) -> "LinearConfig":
    from ..ops.linear import LinearConfig

    names = {f.name for f in dataclasses.fields(LinearConfig)}
    if not isinstance(d, dict) or not set(d) <= names or not {"block_m", "block_n", "block_k"} <= set(d):
        raise TuningFileError(f"{where}: config must be an object with fields from {sorted(names)} "
                              f"(block_m, block_n, block_k required), got {d!r}")
    if not all(is_int(v) for v in d.values()):
        raise TuningFileError(f"{where}: config fields must be integers, got {d!r}")
    try:
        return LinearConfig(**d)
    except ValueError as e:
        raise TuningFileError(f"{where}: {e}") from None


def key_to_dict(key: "TuningKey") -> dict:
    return {name: getattr(key, name) for name in KEY_FIELDS}


def config_to_dict(config: "LinearConfig") -> dict:
    return dataclasses.asdict(config)


def check_entries(entries: Any, where: str) -> None:
    """Every entry's key, config and impl, and no key twice."""
    if not isinstance(entries, list):
        raise TuningFileError(f"{where}: 'linear' must be a list of entries")
    seen = set()
    for i, entry in enumerate(entries):
        at = f"{where}: linear[{i}]"
        if not isinstance(entry, dict) or "key" not in entry or "config" not in entry:
            raise TuningFileError(f"{at}: each entry needs a 'key' and a 'config'")
        key = key_from_dict(entry["key"], at)
        config = config_from_dict(entry["config"], at)
        if config.block_m != key.m_bucket:
            raise TuningFileError(f"{at}: config.block_m {config.block_m} does not match key.m_bucket {key.m_bucket}")
        impl = entry.get("impl", "triton")
        if impl not in IMPLS:
            raise TuningFileError(f"{at}: impl must be one of {IMPLS}, got {impl!r}")
        if impl != "triton" and (key.argmax or key.m_bucket == 1):
            raise TuningFileError(f"{at}: impl {impl!r} is for batch >= 16 projections, not batch 1 or the greedy head")
        if key in seen:
            raise TuningFileError(f"{at}: a second entry for key {key_to_dict(key)}")
        seen.add(key)


def table_of(doc: dict, where: str) -> dict["TuningKey", "LinearConfig"]:
    """The measured configurations of a (checked) document, by key; empty without a linear section."""
    return {key_from_dict(e["key"], where): config_from_dict(e["config"], where) for e in doc.get("linear", [])}


def impls_of(doc: dict, where: str) -> dict["TuningKey", str]:
    """The keys a (checked) document dispatches away from the Triton kernel, with their implementation."""
    return {key_from_dict(e["key"], where): e["impl"] for e in doc.get("linear", []) if e.get("impl", "triton") != "triton"}


def linear_table(path: Path) -> dict["TuningKey", "LinearConfig"]:
    """The measured linear configurations of one tuning file, by key."""
    return table_of(read_tuning_file(path), str(path))


def impl_table(path: Path) -> dict["TuningKey", str]:
    """The keys a tuning file dispatches away from the Triton kernel, with their implementation."""
    return impls_of(read_tuning_file(path), str(path))
