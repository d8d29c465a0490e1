"""Tuned kernel settings are data: one file per GPU model, ``data/tuning/<gpu-slug>.json``.

``python -m labkit tune`` writes the file on the GPU at hand (:mod:`labkit.bench.tune`); at run
time :func:`linear_config` looks the device up by name and hands the file's table to
:func:`labkit.ops.linear.linear_config`. A GPU without a file gets the heuristic and one warning
per process that names the command; the CPU interpreter gets its own configuration silently.

File format (``format: labkit-tuning/1``), beside the provenance (gpu, versions, date, command)::

    "linear": [
      {"key": {"m_bucket": 1, "n": 1024, "k": 1024, "row_blocks": 3, "argmax": false},
       "config": {"block_m": 1, "block_n": 4, "block_k": 1024, "split_k": 1, "num_warps": 8, "num_stages": 1},
       "heuristic": {... the configuration the heuristic picks ...},
       "us": {"heuristic": 6.05, "tuned": 5.27},     # timed on the first of "ops"
       "ops": ["lfm2-350m conv.in_proj+norm+short_conv"], "date": "...", "source": "..."},
      ...]

Imports flow one way: this module reads files and passes tables into ``labkit.ops.linear``, which
knows nothing about files or devices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from .. import resources


def gpu_slug(name: str) -> str:
    """A GPU's name as a file or directory name: 'NVIDIA H200' -> 'nvidia-h200'."""
    return "-".join(name.lower().replace("_", " ").split())

if TYPE_CHECKING:  # ops.linear imports triton: only when a configuration is actually wanted
    from ..ops.linear import LinearConfig, TuningKey

FORMAT = "labkit-tuning/1"
# An entry may say ``"impl": "torch"``: at that key the projection runs unfused
# (:func:`labkit.ops.linear.linear_unfused`: one-kernel norm, cuBLAS matmul, one-kernel epilogue)
# because that measured faster inside the chained step than any blocking of the Triton kernel
# (``python -m labkit tune --chain``); absent means "triton". Never for the LM head's keys.
IMPLS = ("triton", "torch")
TUNING_DIR = resources.tuning_dir()
TUNE_COMMAND = "python -m labkit tune"
KEY_FIELDS = {"m_bucket": int, "n": int, "k": int, "row_blocks": int, "argmax": bool}


class TuningFileError(ValueError):
    """A tuning file that cannot be used as it stands (names the file and the entry)."""


class UntunedGPUWarning(UserWarning):
    """This GPU has no tuning file: heuristic configurations are used."""


def tuning_path(gpu_name: str, directory: Path = TUNING_DIR) -> Path:
    return Path(directory) / f"{gpu_slug(gpu_name)}.json"


# -- reading ----------------------------------------------------------------------------------------
def key_from_dict(d: Any, where: str) -> "TuningKey":
    from ..ops.linear import TuningKey, m_bucket

    if not isinstance(d, dict) or set(d) != set(KEY_FIELDS):
        raise TuningFileError(f"{where}: key must be an object with exactly {sorted(KEY_FIELDS)}, got {d!r}")
    for name, kind in KEY_FIELDS.items():
        value = d[name]
        ok = isinstance(value, bool) if kind is bool else isinstance(value, int) and not isinstance(value, bool)
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
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in d.values()):
        raise TuningFileError(f"{where}: config fields must be integers, got {d!r}")
    try:
        return LinearConfig(**d)
    except ValueError as e:
        raise TuningFileError(f"{where}: {e}") from None


def key_to_dict(key: "TuningKey") -> dict:
    return {name: getattr(key, name) for name in KEY_FIELDS}


def config_to_dict(config: "LinearConfig") -> dict:
    return dataclasses.asdict(config)


def read_tuning_file(path: Path) -> dict:
    """The file as a document, checked: its format, and every entry's key and config."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TuningFileError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TuningFileError(f"{path}: expected format {FORMAT!r}, got {got!r}")
    entries = doc.get("linear")
    if not isinstance(entries, list):
        raise TuningFileError(f"{path}: 'linear' must be a list of entries")
    seen = set()
    for i, entry in enumerate(entries):
        where = f"{path}: linear[{i}]"
        if not isinstance(entry, dict) or "key" not in entry or "config" not in entry:
            raise TuningFileError(f"{where}: each entry needs a 'key' and a 'config'")
        key = key_from_dict(entry["key"], where)
        config = config_from_dict(entry["config"], where)
        if config.block_m != key.m_bucket:
            raise TuningFileError(f"{where}: config.block_m {config.block_m} does not match key.m_bucket {key.m_bucket}")
        impl = entry.get("impl", "triton")
        if impl not in IMPLS:
            raise TuningFileError(f"{where}: impl must be one of {IMPLS}, got {impl!r}")
        if impl != "triton" and (key.argmax or key.m_bucket == 1):
            raise TuningFileError(f"{where}: impl {impl!r} is for batch >= 16 projections, not batch 1 or the greedy head")
        if key in seen:
            raise TuningFileError(f"{where}: a second entry for key {key_to_dict(key)}")
        seen.add(key)
    return doc


def linear_table(path: Path) -> dict["TuningKey", "LinearConfig"]:
    """The measured linear configurations of one tuning file, by key."""
    doc = read_tuning_file(path)
    return {key_from_dict(e["key"], str(path)): config_from_dict(e["config"], str(path)) for e in doc["linear"]}


def impl_table(path: Path) -> dict["TuningKey", str]:
    """The keys a tuning file dispatches away from the Triton kernel, with their implementation."""
    doc = read_tuning_file(path)
    return {key_from_dict(e["key"], str(path)): e["impl"] for e in doc["linear"] if e.get("impl", "triton") != "triton"}


def write_tuning_file(path: Path, doc: dict) -> Path:
    """Write ``doc`` (checked first), one entry per line so that diffs stay readable; the file is
    replaced whole, so an interrupted run leaves the previous one."""
    path = Path(path)
    head = json.dumps({k: v for k, v in doc.items() if k != "linear"}, indent=1)
    entries = ",\n".join("  " + json.dumps(e) for e in doc["linear"])
    text = f'{head[:-2]},\n "linear": [\n{entries}\n ]\n}}\n'
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    try:
        read_tuning_file(tmp)
    except TuningFileError:
        tmp.unlink()
        raise
    tmp.replace(path)
    return path


# -- by device --------------------------------------------------------------------------------------
_warned: set[str] = set()


@functools.lru_cache(maxsize=None)
def _table_for(gpu_name: str, directory: Path) -> Mapping["TuningKey", "LinearConfig"] | None:
    path = tuning_path(gpu_name, directory)
    if not path.exists():
        return None
    return linear_table(path)


def device_table(device: torch.device | str | None = None,
                 directory: Path = TUNING_DIR) -> Mapping["TuningKey", "LinearConfig"] | None:
    """The tuned linear table of ``device``'s GPU model (None on a CPU, or for a GPU without a file:
    then one warning per process and GPU model names the command that makes one)."""
    device = torch.device(device) if device is not None else None
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    table = _table_for(name, Path(directory))
    if table is None and name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"no tuned kernel settings for {name} ({tuning_path(name, directory)} does not exist): the linear "
            f"kernels use heuristic blockings, which may be slower. Run `{TUNE_COMMAND}` on this GPU to make the file.",
            UntunedGPUWarning,
            stacklevel=2,
        )
    return table


@functools.lru_cache(maxsize=None)
def _impls_for(gpu_name: str, directory: Path) -> Mapping["TuningKey", str]:
    path = tuning_path(gpu_name, directory)
    return impl_table(path) if path.exists() else {}


def linear_impl(m: int, n: int, k: int, *, row_blocks: int = 1, device: torch.device | str | None = None,
                directory: Path = TUNING_DIR) -> str:
    """``"triton"`` (labkit's fused kernel), or ``"torch"`` where ``device``'s tuning file measured
    the unfused cuBLAS path faster at this key (batch >= 16 projections only; never on a CPU)."""
    from ..ops.linear import tuning_key

    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return "triton"
    table = _impls_for(torch.cuda.get_device_name(device), Path(directory))
    return table.get(tuning_key(m, n, k, row_blocks=row_blocks), "triton")


def linear_config(m: int, n: int, k: int, *, row_blocks: int = 1, argmax: bool = False,
                  device: torch.device | str | None = None) -> "LinearConfig":
    """:func:`labkit.ops.linear.linear_config` with ``device``'s tuned table."""
    from ..ops.linear import linear_config as config_for

    return config_for(m, n, k, row_blocks=row_blocks, argmax=argmax, table=device_table(device))
