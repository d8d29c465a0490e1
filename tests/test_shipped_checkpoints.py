"""The trained byte-level checkpoints shipped in data/checkpoints/ (each test skips where its
checkpoint is absent): they load in labkit and in transformers to the same function, every backend
decodes them to the same greedy text, and they meet the held-out loss their training record claims.
"""

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

import labkit
from conftest import rel_err
from labkit import train as T
from labkit.shipped import checkpoints_dir
from labkit.tokenizer import ByteTokenizer
from labkit.train.cli import parser

NAMES = sorted(labkit.CHECKPOINTS)
PROMPT = "def fibonacci(n):"
NEW_TOKENS = 64  # compared across backends (the card's sample, 96 bytes, is checked on the reference)
# Recomputing the stored windows' loss: float32 here and on the training machine, the same bf16
# weights; what differs is summation order (about 1e-6 relative). The tolerance is far above that
# and far below any real change of weights or data.
LOSS_TOL_NATS = 2e-3
# A readable model: xz -9e compresses the held-out files (CPython 3.11.7's) to 1.435 bits/byte on
# its own; the shipped runs reach 1.00 (LFM2) and 1.02 (Qwen3.5). Models trained on 8.8 MB (a
# standard library without its test suite) ended near 1.57, and their greedy text ran into spaces.
MAX_BITS_PER_BYTE = 1.2


def _path(name: str):
    path = checkpoints_dir() / name
    if not (path / "config.json").exists():
        family = "lfm2" if "lfm2" in name else "qwen3.5"
        pytest.skip(f"{name} is not in {path.parent} (make it: python -m labkit.train --family {family})")
    return path


@pytest.fixture(scope="module", params=NAMES)
def shipped(request):
    path = _path(request.param)
    record = json.loads((path / "training.json").read_text())
    return request.param, path, record, labkit.load(path, dtype=torch.float32)


_reference_tokens: dict[tuple[str, str], list[int]] = {}


def _greedy(model, backend: str, n: int) -> list[int]:
    ids = torch.tensor([ByteTokenizer().encode(PROMPT)], device=model.device)
    return labkit.generate(model, ids, n, backend=backend, progress=False).tokens[0].tolist()


def test_loads_in_labkit_and_transformers(shipped):
    transformers = pytest.importorskip("transformers")
    name, path, record, model = shipped
    assert model.cfg.name == name and model.cfg.vocab_size == ByteTokenizer.VOCAB_SIZE
    assert model.num_parameters() == record["model"]["parameters"]
    assert (path / "model.safetensors").stat().st_size < 20e6
    assert ByteTokenizer.from_checkpoint(path) == ByteTokenizer()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = T.unpack_windows(record["check"]["windows"])[:2, :160]
    with torch.no_grad():
        assert rel_err(model(ids), hf(input_ids=ids).logits) < 1e-4


def test_card_sample_is_the_reference_greedy_output(shipped):
    """The README's sample: greedy, reference backend, float32 on the CPU, as the card says."""
    transformers = pytest.importorskip("transformers")
    name, path, record, model = shipped
    sample = record["sample"]
    assert sample["prompt"] == PROMPT and sample["max_new_tokens"] >= NEW_TOKENS
    tok = ByteTokenizer()
    ids = torch.tensor([tok.encode(PROMPT)])
    out = labkit.generate(model, ids, sample["max_new_tokens"], stop_tokens=sample["stop_tokens"], progress=False)
    assert out.tokens[0].tolist() == sample["tokens"]
    text = tok.decode(sample["tokens"])
    assert PROMPT + text in (path / "README.md").read_text()
    # recognisable: printable ASCII, mostly not whitespace, several distinct words (a greedy run of
    # spaces or one repeated byte fails)
    assert text.isascii() and all(ch.isprintable() or ch in "\n\t" for ch in text), repr(text)
    assert sum(not ch.isspace() for ch in text) >= 0.5 * len(text), repr(text)
    assert len(set(re.findall(r"[A-Za-z_]{3,}", text))) >= 3, repr(text)
    # transformers' model picks the same token at every step (teacher-forced argmax)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    full = torch.cat([ids, out.tokens], 1)
    with torch.no_grad():
        argmax = hf(input_ids=full).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
    assert argmax.tolist() == sample["tokens"]


@pytest.mark.parametrize("backend", sorted(labkit.BACKENDS))
@pytest.mark.parametrize("name", NAMES)
def test_every_backend_decodes_the_same_greedy_text(name, backend, device):
    path = _path(name)
    if device == "cpu" and "graph" in backend:
        pytest.skip(f"backend {backend!r} captures CUDA graphs: needs a CUDA device")
    if device == "cpu" and backend != "reference":
        pytest.importorskip("triton", reason=f"backend {backend!r} runs in Triton's interpreter on a CPU")
    model = labkit.load(path, dtype=torch.float32, device=device)
    key = (name, device)
    if key not in _reference_tokens:
        _reference_tokens[key] = _greedy(model, "reference", NEW_TOKENS)
    got = _greedy(model, backend, NEW_TOKENS)
    tok = ByteTokenizer()
    assert got == _reference_tokens[key], (
        f"{backend} decodes {tok.decode(got)!r}; reference decodes {tok.decode(_reference_tokens[key])!r}"
    )


def test_heldout_loss_as_claimed(shipped):
    name, path, record, model = shipped
    check = record["check"]
    windows = T.unpack_windows(check["windows"])
    assert windows.shape[0] >= 8 and windows.shape[1] == record["args"]["seq"] + 1
    got = T.heldout_loss(model, windows, batch=8)
    print(f"{name}: stored windows {got:.5f} nats/byte here, {check['loss']:.5f} claimed "
          f"({got / math.log(2):.3f} bits/byte)")
    assert abs(got - check["loss"]) < LOSS_TOL_NATS
    assert got / math.log(2) < MAX_BITS_PER_BYTE
    final = record["final"]
    assert final["heldout_bits_per_byte"] < MAX_BITS_PER_BYTE
    assert final["heldout_bits_per_byte"] == pytest.approx(final["heldout_loss"] / math.log(2))
    card = (path / "README.md").read_text()
    assert f"{final['heldout_loss']:.4f}" in card and f"{final['heldout_bits_per_byte']:.3f}" in card


def test_record_remakes_its_card_and_command(shipped):
    """The card is made from the record alone: the shipped record gives the shipped README byte for
    byte, and its command parses back to its recorded arguments."""
    name, path, record, _ = shipped
    assert T.model_card(record) == (path / "README.md").read_text()
    args = shlex.split(record["command"])[3:]
    assert T.TrainOptions.from_namespace(parser().parse_args(args)).recorded() == record["args"]


def test_readme_states_the_shipped_figures():
    """The README's checkpoint table quotes each card's held-out figure."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name in NAMES:
        record = json.loads((_path(name) / "training.json").read_text())
        row = next((line for line in readme.splitlines() if line.startswith(f"| [`{name}`]")), None)
        assert row is not None, f"README has no row for {name}"
        assert row.rstrip(" |").endswith(f"{record['final']['heldout_bits_per_byte']:.3f}"), row
        assert f"{record['model']['parameters'] / 1e6:.1f} M" in row, row
