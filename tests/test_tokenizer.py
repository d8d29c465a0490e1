"""The byte tokenizer: exact round trips, specials, batches, and its file beside a checkpoint."""

import json

import pytest
import torch

import labkit
from labkit.tokenizer import FILE_NAME, ByteTokenizer

TEXTS = [
    "",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "naïve café — Größe, 日本語のテキスト, русский текст, emoji 🐍🚀, tab\tand NUL\x00",
    "\ufeffBOM, surrogates are not text but U+FFFD is: \ufffd",
]


@pytest.fixture
def tok():
    return ByteTokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.BOS and all(0 <= i < 256 for i in ids[1:])
    assert bytes(ids[1:]) == text.encode("utf-8")
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(tok.encode(text, bos=False, eos=True))) == text


def test_specials_and_flags(tok):
    assert (tok.PAD, tok.BOS, tok.EOS, tok.vocab_size) == (256, 257, 258, 264)
    assert tok.encode("ab", bos=False) == [97, 98]
    assert tok.encode("ab", eos=True) == [257, 97, 98, 258]
    assert tok.encode(b"\xff\x00", bos=False) == [255, 0]
    ids = [257, 104, 105, 258, 256, 260]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, show_special=True) == "<bos>hi<eos><pad><reserved_260>"
    assert tok.token_name(10) == "b'\\n'" and tok.token_name(258) == "<eos>"


def test_invalid_utf8_is_replaced_and_bad_ids_raise(tok):
    # a split multi-byte character, as a sampled model may produce
    snake = "🐍".encode("utf-8")
    assert tok.decode(list(snake[:2]) + [ord("x")]) == "\ufffdx"
    assert tok.decode([0xC3, 257, 0xA9], show_special=True) == "\ufffd<bos>\ufffd"
    with pytest.raises(ValueError, match="outside"):
        tok.decode([264])
    with pytest.raises(ValueError, match="outside"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(torch.zeros(2, 3, dtype=torch.long))


def test_batches_pad_and_round_trip(tok):
    texts = ["a", "dé", "xyz!"]
    ids, lengths = tok.encode_batch(texts)
    assert ids.dtype == torch.long and ids.shape == (3, 5)
    assert lengths.tolist() == [2, 4, 5]
    assert ids[0].tolist() == [257, 97, 256, 256, 256]
    assert tok.decode_batch(ids) == texts
    left, _ = tok.encode_batch(texts, bos=False, padding_side="left")
    assert left[0].tolist() == [256, 256, 256, 97]
    assert tok.decode_batch(left) == texts
    with pytest.raises(ValueError):
        tok.encode_batch(texts, padding_side="middle")


def test_file_beside_a_checkpoint(tok, tmp_path):
    tok.save(tmp_path)
    assert json.loads((tmp_path / FILE_NAME).read_text())["special_tokens"]["<eos>"] == 258
    assert ByteTokenizer.from_checkpoint(tmp_path) == tok
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 65536}))
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer.from_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError):
        ByteTokenizer.from_checkpoint(tmp_path / "nowhere")
    bad = tok.to_dict() | {"vocab_size": 300}
    with pytest.raises(ValueError):
        ByteTokenizer.from_dict(bad)


def test_exported_from_the_package():
    assert labkit.ByteTokenizer is ByteTokenizer
