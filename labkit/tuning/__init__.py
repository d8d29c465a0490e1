"""Every measured kernel setting is data: one file per GPU model, ``data/tuning/<gpu-slug>.json``.

``python -m labkit tune`` writes the file on the GPU at hand (:mod:`labkit.bench.tune`; the TMA
GEMV's section comes from ``python -m labkit bench tma --tuning-from ...``); at run time the
functions below look the device up by its name and hand the file's values to the ops:

    tuning.settings("attention_decode", device)   # -> frozen mapping: the file's values over the heuristic
    tuning.linear_config(m, n, k, row_blocks=..., argmax=..., device=device)   # LinearConfig
    tuning.linear_impl(m, n, k, row_blocks=..., device=device)                 # "triton" or "torch"
    tuning.tma_config(batch, n, k, device)                                     # TmaConfig
    tuning.pdl_placement(device)                                               # PdlPlacement

The file format is :mod:`labkit.tuning.files` (sections :mod:`~labkit.tuning.linear`,
:mod:`~labkit.tuning.tma`, :mod:`~labkit.tuning.kernel_settings`). A GPU without a file gets the
heuristics (:data:`HEURISTICS`, the linear heuristic, the TMA default) and one
:class:`UntunedGPUWarning` per process and GPU model, naming the command that makes one; a file
that cannot be read is a :class:`TuningFileError`, never skipped; a CPU (Triton's interpreter)
gets the heuristics silently. A lookup reads the device it is given (``cuda:1`` is GPU 1's
model), or the current CUDA device for None.

Imports flow one way: this package reads files and passes values into the ops, which know
nothing about files or devices.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import torch

from . import kernel_settings, linear as _linear, tma as _tma
from .files import (
    FORMAT,
    TUNE_COMMAND,
    TUNING_DIR,
    TuningFileError,
    gpu_slug,
    read_tuning_file,
    tuning_path,
    update_tuning_file,
    write_tuning_file,
)
from .kernel_settings import HEURISTICS, KERNELS
from .linear import IMPLS, KEY_FIELDS, config_from_dict, config_to_dict, impl_table, key_from_dict, key_to_dict, linear_table

if TYPE_CHECKING:
    from ..cuda import TmaConfig
    from ..ops.linear import LinearConfig, PdlPlacement, TuningKey

__all__ = [
    "FORMAT", "HEURISTICS", "IMPLS", "KERNELS", "KEY_FIELDS", "TUNE_COMMAND", "TUNING_DIR", "TuningFileError",
    "UntunedGPUWarning", "config_from_dict", "config_to_dict", "device_document", "device_table", "forget", "gpu_name",
    "gpu_slug", "heuristics_only", "impl_table", "key_from_dict", "key_to_dict", "linear_config", "linear_impl", "linear_table",
    "pdl_placement", "read_tuning_file", "settings", "tma_config", "tuning_path", "untuned_message", "update_tuning_file",
    "write_tuning_file",
]


class UntunedGPUWarning(UserWarning):
    """This GPU has no tuning file: heuristic settings are used."""


# -- by device --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Loaded:
    """One GPU model's file, read and parsed once per process (None: no file)."""

    doc: dict | None
    linear: Mapping
    impls: Mapping
    tma: Mapping


_loaded: dict[tuple[str, Path], _Loaded] = {}
_warned: set[str] = set()
_NO_FILE = _Loaded(None, {}, {}, {})
_heuristics_only: ContextVar[bool] = ContextVar("labkit_tuning_heuristics_only", default=False)


@contextmanager
def heuristics_only() -> Iterator[None]:
    """Inside the block every lookup answers as for a GPU without a tuning file, without the
    warning: the heuristic settings, whatever ``data/tuning/`` holds. For measuring what the file
    buys: a decoder made (and run, since some settings are read at capture) inside the block
    uses none of it."""
    token = _heuristics_only.set(True)
    try:
        yield
    finally:
        _heuristics_only.reset(token)


def forget() -> None:
    """Forget the files read so far and the GPUs warned about (after a file changed on disk)."""
    _loaded.clear()
    _warned.clear()


def gpu_name(device: torch.device | str | int | None = None) -> str | None:
    """The GPU model of ``device`` (None: the current CUDA device, if there is one); None for a CPU."""
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    else:
        device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


def _load(device: torch.device | str | int | None, directory: Path) -> _Loaded | None:
    """``device``'s parsed file (None on a CPU); the first lookup of a GPU without a file warns."""
    name = gpu_name(device)
    if name is None:
        return None
    if _heuristics_only.get():
        return _NO_FILE
    key = (name, Path(directory))
    if key not in _loaded:
        path = tuning_path(name, directory)
        doc = read_tuning_file(path) if path.exists() else None
        where = str(path)
        _loaded[key] = _Loaded(doc, {}, {}, {}) if doc is None else _Loaded(
            doc, _linear.table_of(doc, where), _linear.impls_of(doc, where), _tma.table_of(doc, where))
    loaded = _loaded[key]
    if loaded.doc is None and name not in _warned:
        _warned.add(name)
        warnings.warn(untuned_message(name, directory), UntunedGPUWarning, stacklevel=3)
    return loaded


def untuned_message(name: str, directory: Path = TUNING_DIR) -> str:
    """What the one :class:`UntunedGPUWarning` for the GPU model ``name`` says."""
    return (f"no tuned kernel settings for {name} ({tuning_path(name, directory)} does not exist): every kernel "
            f"uses its heuristic settings (blockings from a rule, launch settings measured on the H200), which may "
            f"be slower. Run `{TUNE_COMMAND}` on this GPU to make the file.")


def device_document(device: torch.device | str | int | None = None, directory: Path = TUNING_DIR) -> dict | None:
    """``device``'s tuning file as a checked document (None on a CPU, or for a GPU without a file)."""
    loaded = _load(device, directory)
    return None if loaded is None else loaded.doc


def settings(kernel: str, device: torch.device | str | int | None = None,
             directory: Path = TUNING_DIR) -> Mapping[str, Any]:
    """``kernel``'s launch settings on ``device`` as a frozen mapping: the file's values over
    :data:`HEURISTICS` (see :mod:`labkit.tuning.kernel_settings` for the kernels and their settings)."""
    return kernel_settings.merged(kernel_settings.check_kernel(kernel), device_document(device, directory))


def pdl_placement(device: torch.device | str | int | None = None, directory: Path = TUNING_DIR) -> "PdlPlacement":
    """Where the skinny GEMM's PDL launches preload and release on ``device`` (``settings("linear")``)."""
    from ..ops.linear import PdlPlacement

    values = settings("linear", device, directory)
    return PdlPlacement(preload=values["pdl_preload"], release=values["pdl_release"])


def device_table(device: torch.device | str | int | None = None,
                 directory: Path = TUNING_DIR) -> Mapping["TuningKey", "LinearConfig"] | None:
    """The tuned linear table of ``device``'s GPU model (None on a CPU, or for a GPU without a file)."""
    loaded = _load(device, directory)
    return None if loaded is None or loaded.doc is None else loaded.linear


def linear_impl(m: int, n: int, k: int, *, row_blocks: int = 1, device: torch.device | str | None = None,
                directory: Path = TUNING_DIR) -> str:
    """``"triton"`` (labkit's fused kernel), or ``"torch"`` where ``device``'s tuning file measured
    the unfused cuBLAS path faster at this key (batch >= 16 projections only; never on a CPU, nor
    for ``device=None``)."""
    from ..ops.linear import tuning_key

    if device is None:
        return "triton"
    loaded = _load(device, directory)
    return "triton" if loaded is None else loaded.impls.get(tuning_key(m, n, k, row_blocks=row_blocks), "triton")


def linear_config(m: int, n: int, k: int, *, row_blocks: int = 1, argmax: bool = False,
                  device: torch.device | str | None = None) -> "LinearConfig":
    """:func:`labkit.ops.linear.linear_config` with ``device``'s tuned table."""
    from ..ops.linear import linear_config as config_for

    return config_for(m, n, k, row_blocks=row_blocks, argmax=argmax, table=device_table(device))


def tma_config(batch: int, n: int, k: int, device: torch.device | str | int | None = None,
               directory: Path = TUNING_DIR) -> "TmaConfig":
    """The TMA GEMV's measured fastest config for this shape (``n``: the streamed rows) on
    ``device``'s GPU model, else :data:`labkit.cuda.DEFAULT_TMA_CONFIG`."""
    from ..cuda import DEFAULT_TMA_CONFIG

    loaded = _load(device, directory)
    table = {} if loaded is None else loaded.tma
    return table.get((_tma.bucket(batch), n, k), DEFAULT_TMA_CONFIG)
