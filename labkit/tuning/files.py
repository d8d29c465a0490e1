"""The one tuning file per GPU model: ``data/tuning/<gpu-slug>.json``, format ``labkit-tuning/2``.

A document holds three sections beside its identity (``format``, ``gpu``)::

    {"format": "labkit-tuning/2", "gpu": "NVIDIA H200",
     "versions": {...}, "date": "...", "command": "...", "notes": [...],   # the linear table's run
     "settings": {"<kernel>": {"values": {"<name>": value, ...}, "source": "...", ...}, ...},
     "tma": {"versions": ..., "date": ..., "command": ..., "source": ..., "entries": [...]},
     "linear": [{"key": {...}, "config": {...}, ...}, ...]}

- ``linear``: the Triton skinny GEMM's measured blockings (:mod:`labkit.tuning.linear`); the
  top-level provenance is that of the run that wrote it (``python -m labkit tune``);
- ``tma``: the CUDA TMA GEMV's blockings (:mod:`labkit.tuning.tma`) with their own provenance
  (``python -m labkit bench tma --tuning-from ...``);
- ``settings``: per kernel, the values that override its heuristic, each kernel with the
  provenance of its measurement (:mod:`labkit.tuning.kernel_settings`).

Every section is optional. Reading checks the whole document, so a bad entry is a
:class:`TuningFileError` naming the file and the entry, never a silent fallback; writing checks
what it is about to write and replaces the file whole (an interrupted write leaves the old one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import resources

FORMAT = "labkit-tuning/2"
TUNING_DIR = resources.tuning_dir()
TUNE_COMMAND = "python -m labkit tune"
SECTIONS = ("settings", "tma", "linear")  # written in this order, after the provenance


class TuningFileError(ValueError):
    """A tuning file that cannot be used as it stands (names the file and the entry)."""


def gpu_slug(name: str) -> str:
    """A GPU's name as a file or directory name: 'NVIDIA H200' -> 'nvidia-h200'."""
    return "-".join(name.lower().replace("_", " ").split())


def tuning_path(gpu_name: str, directory: Path = TUNING_DIR) -> Path:
    return Path(directory) / f"{gpu_slug(gpu_name)}.json"


def check_document(doc: Any, where: str) -> dict:
    """``doc`` checked section by section (``where`` names the file in every error); returns it."""
    from . import kernel_settings, linear, tma

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TuningFileError(f"{where}: expected format {FORMAT!r}, got {got!r}"
                              + (" (labkit-tuning/1 and labkit-tma-tuning/1 files predate the merged format: "
                                 "re-run the tune command or convert them)" if got in ("labkit-tuning/1",
                                                                                        "labkit-tma-tuning/1") else ""))
    if "linear" in doc:
        linear.check_entries(doc["linear"], where)
    if "tma" in doc:
        tma.check_section(doc["tma"], where)
    if "settings" in doc:
        kernel_settings.check_section(doc["settings"], where)
    return doc


def read_tuning_file(path: Path) -> dict:
    """The file as a document, checked whole."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TuningFileError(f"{path} is not valid JSON: {e}") from None
    return check_document(doc, str(path))


def _entries(name: str, entries: list, indent: str) -> str:
    """A list of entries, one per line, so that diffs stay readable."""
    lines = ",\n".join(f"{indent} " + json.dumps(e) for e in entries)
    return f'{indent}"{name}": [\n{lines}\n{indent}]' if entries else f'{indent}"{name}": []'


def render(doc: dict) -> str:
    """The document as the committed files lay it out: provenance first, then settings, the TMA
    section (its entries one per line) and the linear table (one entry per line)."""
    parts = [f" {json.dumps(k)}: {json.dumps(v, indent=1).replace(chr(10), chr(10) + ' ')}"
             for k, v in doc.items() if k not in SECTIONS]
    if "settings" in doc:
        parts.append(' "settings": ' + json.dumps(doc["settings"], indent=1).replace("\n", "\n "))
    if "tma" in doc:
        head = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc["tma"].items() if k != "entries"]
        parts.append(' "tma": {\n' + ",\n".join([*head, _entries("entries", doc["tma"].get("entries", []), "  ")])
                     + "\n }")
    if "linear" in doc:
        parts.append(_entries("linear", doc["linear"], " "))
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_tuning_file(path: Path, doc: dict) -> Path:
    """Write ``doc`` (checked first); the file is replaced whole, so an interrupted run leaves the
    previous one."""
    path = Path(path)
    check_document(doc, f"{path} (about to be written)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(doc))
    try:
        read_tuning_file(tmp)
    except TuningFileError:
        tmp.unlink()
        raise
    tmp.replace(path)
    return path


def update_tuning_file(path: Path, gpu: str, **changes: Any) -> Path:
    """Merge ``changes`` into the file at ``path`` (made if missing) and write it: a key given
    replaces the file's (``linear=[...]``, ``tma={...}``, ``versions=...``); ``settings={kernel:
    {...}}`` replaces those kernels' entries and keeps the others'. Everything not named is kept
    as it was, provenance included."""
    path = Path(path)
    doc = read_tuning_file(path) if path.exists() else {"format": FORMAT, "gpu": gpu}
    if doc.get("gpu") != gpu:
        raise TuningFileError(f"{path} is the file of {doc.get('gpu')!r}, not of {gpu!r}")
    for key, value in changes.items():
        if key == "settings":
            doc["settings"] = {**doc.get("settings", {}), **value}
        else:
            doc[key] = value
    return write_tuning_file(path, doc)
