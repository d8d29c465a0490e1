"""A byte-level tokenizer: token ids 0-255 are the bytes of the UTF-8 text, a few more are specials.

    id       token
    0..255   the byte of that value
    256      <pad>   (padding in batches; never a training target)
    257      <bos>   (start of a document; ``encode`` puts it first by default)
    258      <eos>   (end of a document)
    259..263 reserved (never produced by ``encode``; a trained model gives them ~zero probability)

so the vocabulary has 264 entries (256 + 8, a multiple of 8). Any text round-trips exactly:
``decode(encode(s)) == s`` for every ``str`` (specials are dropped on decode by default). Byte
sequences that are not valid UTF-8, which a sampled model may produce, decode with U+FFFD in place
of the bad bytes.

The tokenizer is stored beside a checkpoint as ``byte_tokenizer.json`` (deliberately not
``tokenizer.json``, the name Hugging Face's tokenizers library claims for its own format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import torch

FILE_NAME = "byte_tokenizer.json"
FORMAT = "labkit-byte-tokenizer"


class ByteTokenizer:
    PAD = 256
    BOS = 257
    EOS = 258
    NUM_BYTES = 256
    VOCAB_SIZE = 264

    def __init__(self) -> None:
        self.vocab_size = self.VOCAB_SIZE
        self.pad_id, self.bos_id, self.eos_id = self.PAD, self.BOS, self.EOS
        self.special_tokens = {"<pad>": self.PAD, "<bos>": self.BOS, "<eos>": self.EOS}
        self._names = {i: n for n, i in self.special_tokens.items()}
        self._names.update({i: f"<reserved_{i}>" for i in range(self.EOS + 1, self.VOCAB_SIZE)})

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, pad={self.PAD}, bos={self.BOS}, eos={self.EOS})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer) and self.to_dict() == other.to_dict()

    # -- single sequences ----------------------------------------------------------------------
    def encode(self, text: str | bytes, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (a str is UTF-8 encoded; bytes are taken as they are)."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return ([self.BOS] if bos else []) + list(data) + ([self.EOS] if eos else [])

    def decode(self, ids: Iterable[int] | torch.Tensor, show_special: bool = False) -> str:
        """Text of ``ids``. Specials are dropped, or written as ``<bos>``-style names with
        ``show_special``; invalid UTF-8 becomes U+FFFD."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode wants one sequence (a 1-D tensor), got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < self.NUM_BYTES:
                run.append(i)
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the byte vocabulary [0, {self.vocab_size})")
            if show_special:
                parts.append(run.decode("utf-8", errors="replace"))
                run.clear()
                parts.append(self._names[i])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_name(self, i: int) -> str:
        """A readable name for one id: the byte as a Python bytes literal, or the special's name."""
        return repr(bytes([i])) if 0 <= i < self.NUM_BYTES else self._names[i]

    # -- batches ---------------------------------------------------------------------------------
    def encode_batch(
        self,
        texts: Sequence[str | bytes],
        bos: bool = True,
        eos: bool = False,
        padding_side: str = "right",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, T_max] int64 padded with <pad>, lengths [B] int64).

        labkit models take no attention mask: padding is for losses (ignore the <pad> targets)
        and for equal-length prompts. Left padding makes every prompt end at the last column, but
        the model still attends to the pad tokens, so batch unequal prompts only when that is fine.
        """
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        seqs = [self.encode(t, bos=bos, eos=eos) for t in texts]
        if not seqs:
            raise ValueError("encode_batch needs at least one text")
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.PAD, dtype=torch.long)
        for row, s in enumerate(seqs):
            if s:
                if padding_side == "right":
                    ids[row, : len(s)] = torch.tensor(s)
                else:
                    ids[row, width - len(s) :] = torch.tensor(s)
        return ids, torch.tensor([len(s) for s in seqs], dtype=torch.long)

    def decode_batch(self, ids: torch.Tensor | Sequence[Sequence[int]], show_special: bool = False) -> list[str]:
        return [self.decode(row, show_special=show_special) for row in ids]

    # -- files -----------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": FORMAT,
            "version": 1,
            "vocab_size": self.vocab_size,
            "bytes": [0, self.NUM_BYTES],
            "special_tokens": dict(self.special_tokens),
            "reserved": [self.EOS + 1, self.vocab_size],
            "encode": "UTF-8 bytes of the text, one id per byte, <bos> first by default",
            "decode": "bytes as UTF-8 with errors='replace'; specials dropped",
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ByteTokenizer":
        tok = cls()
        if d.get("format") != FORMAT:
            raise ValueError(f"not a labkit byte tokenizer (format {d.get('format')!r}, expected {FORMAT!r})")
        if d.get("version") != 1 or d != tok.to_dict():
            raise ValueError(f"byte tokenizer file differs from this labkit's ByteTokenizer: {d}")
        return tok

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> "ByteTokenizer":
        """The tokenizer saved in a checkpoint directory (its ``byte_tokenizer.json``)."""
        file = Path(path) / FILE_NAME
        if not file.exists():
            raise FileNotFoundError(f"{file} not found: {path} is not a byte-level labkit checkpoint")
        tok = cls.from_dict(json.loads(file.read_text()))
        config = Path(path) / "config.json"
        if config.exists():
            vocab = json.loads(config.read_text()).get("vocab_size")
            if vocab != tok.vocab_size:
                raise ValueError(f"{config} has vocab_size {vocab}; the byte tokenizer has {tok.vocab_size}")
        return tok
