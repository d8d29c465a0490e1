"""The training corpus: the ``.py`` files of a Python standard library, split into a train and a
held-out token stream, and the held-out windows the evaluation and the tests use.

The files are those of the interpreter that runs the script (``sysconfig.get_paths()["stdlib"]``),
distributed with Python under the PSF License Agreement. Files under the top-level
``site-packages/``, ``dist-packages/`` (third-party code) and ``encodings/`` (mostly generated codec
tables) are left out; the test suite is kept (about half of the bytes, and ordinary Python). Some
installs drop the test suite (Debian's, many containers'): ``export_corpus`` (``--export-corpus
DIR``) copies one interpreter's corpus files to a directory and ``load_corpus(root)``
(``--corpus-root DIR``) reads such a copy anywhere; the shipped checkpoints were trained that way,
on CPython 3.11.7's 30 MB, on an H200 whose own Python had 8.8 MB. Files are taken in sorted order
of their relative POSIX path; a file is held out when the first 8 bytes of sha256(relative path),
read as a big-endian integer, are < ``HELDOUT_PERCENT`` mod 100, so the split of a file does not
depend on the Python version. Each split is one stream of tokens, file after file, each file as
``<bos> bytes <eos>``, capped at whole files. Different Python versions have different standard
libraries: ``Corpus.stats`` (kept in the record) has the version, file counts, byte counts and
sha256 of both streams.
"""

from __future__ import annotations

import base64
import hashlib
import json
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..tokenizer import ByteTokenizer

HELDOUT_PERCENT = 5
EXCLUDED_TOP_DIRS = ("site-packages", "dist-packages", "encodings")
CORPUS_MANIFEST = "CORPUS.json"


@dataclass
class Corpus:
    """The two token streams and what they are made of (kept in the record as ``"corpus"``)."""

    train: torch.Tensor  # int16 token stream
    heldout: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def export_corpus(dest: str | Path, root: Path | None = None) -> dict[str, Any]:
    """Copy this interpreter's corpus files (the same selection ``load_corpus`` makes) to ``dest``,
    with a ``CORPUS.json`` naming the Python they came from; ``--corpus-root dest`` then trains on
    them anywhere. Why: installs differ (some, e.g. Debian's and many containers', drop the test
    suite, half the bytes), and the shipped checkpoints are trained on a whole standard library."""
    root = Path(root) if root is not None else stdlib_root()
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty; export into a new directory")
    files = corpus_files(root)
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((root / rel).read_bytes())
    manifest = {
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib_root": str(root),
        "files": len(files),
        "bytes": sum((root / rel).stat().st_size for rel in files),
    }
    (dest / CORPUS_MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def is_heldout(relpath: str, percent: int = HELDOUT_PERCENT) -> bool:
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def corpus_files(root: Path) -> list[str]:
    """Sorted relative POSIX paths of the corpus' files under ``root``."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] in EXCLUDED_TOP_DIRS or "__pycache__" in rel.parts or not path.is_file():
            continue
        files.append(rel.as_posix())
    return sorted(files)


def _stream(root: Path, files: list[str], cap: int | None, tok: ByteTokenizer) -> tuple[torch.Tensor, list[str], int]:
    """The token stream of ``files`` (whole files up to ``cap`` tokens), the files used, and their
    characters: UTF-8, an undecodable byte counting as one (the card's bytes per character)."""
    pieces, used, total, chars = [], [], 0, 0
    for rel in files:
        data = (root / rel).read_bytes()
        if cap is not None and total + len(data) + 2 > cap:
            break
        pieces.append(bytes([0]) + data + bytes([0]))  # placeholders for <bos>, <eos>
        used.append(rel)
        total += len(data) + 2
        chars += len(data.decode("utf-8", errors="surrogateescape"))
    if not pieces:
        raise RuntimeError(f"no corpus files fit in {cap} bytes (first file: {files[:1]})")
    stream = torch.frombuffer(bytearray(b"".join(pieces)), dtype=torch.uint8).to(torch.int16)
    lengths = torch.tensor([len(p) for p in pieces])
    ends = lengths.cumsum(0)
    stream[ends - lengths] = tok.BOS
    stream[ends - 1] = tok.EOS
    return stream, used, chars


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().astype("<i2").tobytes()).hexdigest()


def load_corpus(
    root: str | Path | None = None, max_train_bytes: int | None = None, max_heldout_bytes: int | None = None
) -> Corpus:
    """The train and held-out token streams of the standard library under ``root`` (this
    interpreter's if None), each capped at whole files within its ``max_*_bytes`` (None: no cap)."""
    tok = ByteTokenizer()
    origin = {"python_version": platform.python_version(), "python_implementation": platform.python_implementation()}
    if root is None:
        root = stdlib_root()
    else:  # an exported corpus says which Python it came from; a bare directory cannot
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"corpus root {root} is not a directory")
        manifest = root / CORPUS_MANIFEST
        origin = json.loads(manifest.read_text()) if manifest.exists() else {
            "python_version": "unknown", "python_implementation": "unknown"}
    files = corpus_files(root)
    if not files:
        raise RuntimeError(f"no .py files under {root}")
    held = [f for f in files if is_heldout(f)]
    train = [f for f in files if not is_heldout(f)]
    if not held or not train:
        raise RuntimeError(f"{root}: {len(train)} train and {len(held)} held-out files; need both")
    train_stream, train_used, train_chars = _stream(root, train, max_train_bytes, tok)
    held_stream, held_used, held_chars = _stream(root, held, max_heldout_bytes, tok)
    listing = hashlib.sha256("\n".join(train_used + ["--"] + held_used).encode()).hexdigest()
    stats = {
        "source": "Python standard library .py files (sysconfig.get_paths()['stdlib'])",
        "license": "PSF License Agreement (Python Software Foundation License Version 2)",
        "python_version": origin["python_version"],
        "python_implementation": origin["python_implementation"],
        "stdlib_root": origin.get("stdlib_root", str(root)),
        "corpus_root": str(root),
        "excluded_top_dirs": list(EXCLUDED_TOP_DIRS),
        "order": "sorted relative POSIX paths; each file as <bos> bytes <eos>",
        "heldout_rule": f"int.from_bytes(sha256(relpath)[:8], 'big') % 100 < {HELDOUT_PERCENT}",
        "files_found": len(files),
        "train_files": len(train_used),
        "heldout_files": len(held_used),
        "train_files_skipped_by_cap": len(train) - len(train_used),
        "heldout_files_skipped_by_cap": len(held) - len(held_used),
        "max_train_bytes": max_train_bytes,
        "max_heldout_bytes": max_heldout_bytes,
        "train_tokens": int(train_stream.numel()),
        "heldout_tokens": int(held_stream.numel()),
        # file bytes (tokens less the two specials per file) per character
        "train_bytes_per_char": (train_stream.numel() - 2 * len(train_used)) / train_chars,
        "heldout_bytes_per_char": (held_stream.numel() - 2 * len(held_used)) / held_chars,
        "train_sha256": _sha256(train_stream),
        "heldout_sha256": _sha256(held_stream),
        "file_list_sha256": listing,
        "heldout_files_list": held_used,
    }
    return Corpus(train_stream, held_stream, stats)


def eval_windows(stream: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """``n`` windows of ``length`` tokens at evenly spaced offsets of ``stream`` (int64 [n, length])."""
    if stream.numel() < length:
        raise ValueError(f"held-out stream has {stream.numel()} tokens, fewer than one window of {length}")
    span = stream.numel() - length
    starts = [round(i * span / max(n - 1, 1)) for i in range(n)]
    return torch.stack([stream[s : s + length] for s in starts]).long()


def pack_windows(w: torch.Tensor) -> dict[str, Any]:
    data = w.to(torch.int16).numpy().astype("<u2").tobytes()
    return {"shape": list(w.shape), "dtype": "uint16-le", "base64": base64.b64encode(data).decode("ascii")}


def unpack_windows(d: dict[str, Any]) -> torch.Tensor:
    import numpy as np

    if d.get("dtype") != "uint16-le":
        raise ValueError(f"unknown window encoding {d.get('dtype')!r}")
    arr = np.frombuffer(base64.b64decode(d["base64"]), dtype="<u2").astype("int64")
    return torch.from_numpy(arr.reshape(d["shape"]).copy())

