"""labkit.train on the CPU with tiny models: the loss falls, the checkpoint loads in labkit and in
transformers to the same function, the record and card hold what they claim, runs are reproducible."""

import json
import math
import shlex
from pathlib import Path

import pytest
import torch

import labkit
from conftest import rel_err
from labkit import train as T
from labkit.tokenizer import ByteTokenizer
from labkit.train.cli import parser

SMALL = dict(
    size="tiny", steps=40, batch=8, seq=64, lr=3e-3, warmup=5, eval_every=20, eval_windows=8,
    check_windows=4, log_every=1, max_train_bytes=300_000, max_heldout_bytes=40_000, device="cpu",
    progress=False, sample_tokens=24,
)


@pytest.fixture(scope="module", params=["lfm2", "qwen3.5"])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"train-{request.param}")
    record = T.train(request.param, out, seed=3, **SMALL)
    return request.param, out, record


def test_loss_falls(run):
    _, _, record = run
    losses = [h["loss"] for h in record["history"]["train"]]
    assert len(losses) == SMALL["steps"]
    assert abs(losses[0] - math.log(264)) < 0.3  # the untrained model is close to uniform
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    evals = record["history"]["eval"]
    assert [e["step"] for e in evals] == [20, 40]
    assert record["final"]["heldout_loss"] < math.log(264) - 1.0


def test_checkpoint_loads_in_labkit_and_transformers(run):
    transformers = pytest.importorskip("transformers")
    family, out, record = run
    model = labkit.load(out, dtype=torch.float32)
    assert model.cfg.family == family and model.cfg.vocab_size == 264
    assert model.cfg.name == out.name
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = T.unpack_windows(record["check"]["windows"])[:2, :50]
    with torch.no_grad():
        ours, theirs = model(ids), hf(input_ids=ids).logits
    assert rel_err(ours, theirs) < 1e-4


def test_record_and_card(run):
    family, out, record = run
    on_disk = json.loads((out / "training.json").read_text())
    assert on_disk["final"] == record["final"] and on_disk["steps"] == SMALL["steps"]
    assert record["stopped_by"] == "steps" and record["tokens_seen"] == 40 * 8 * 64
    assert record["model"]["parameters"] == labkit.load(out).num_parameters()
    c = record["corpus"]
    assert c["train_files"] > 0 and c["heldout_files"] > 0 and c["train_tokens"] <= 300_000
    assert c["python_version"] and len(c["train_sha256"]) == 64
    assert ByteTokenizer.from_checkpoint(out) == ByteTokenizer()
    assert record["command"].startswith(f"python -m labkit.train --family {family} --out ")
    card = (out / "README.md").read_text()
    for figure in (f"{record['final']['heldout_loss']:.4f}", f"{record['final']['heldout_bits_per_byte']:.3f}",
                   record["command"], "PSF License", c["python_version"],
                   f"{c['heldout_bytes_per_char']:.4f} bytes per character"):
        assert figure in card
    sample = record["sample"]
    assert sample["prompt"] == "def fibonacci(n):" and 1 <= len(sample["tokens"]) <= 24
    # the stored check windows reproduce their stored loss (same machine: float32, tight)
    windows = T.unpack_windows(record["check"]["windows"])
    assert windows.shape == (4, 65)
    got = T.heldout_loss(labkit.load(out, dtype=torch.float32), windows, batch=8)
    assert abs(got - record["check"]["loss"]) < 1e-5


def test_same_seed_same_losses_and_time_budget(run):
    family, _, seeded_3 = run
    kw = dict(SMALL, steps=3, eval_every=0, sample_tokens=4)
    a = T.train(family, None, seed=7, **kw)
    b = T.train(family, None, seed=7, time_budget_s=1e-3, **kw)
    assert b["steps"] == 1 and b["stopped_by"] == "time_budget"
    first = [r["history"]["train"][0]["loss"] for r in (a, b, seeded_3)]
    assert first[0] == first[1] != first[2]  # the first loss depends on the seed only
    c = T.train(family, None, seed=7, **kw)
    assert [h["loss"] for h in a["history"]["train"]] == [h["loss"] for h in c["history"]["train"]]
    assert a["final"]["heldout_loss"] == c["final"]["heldout_loss"]


def test_options_are_declared_once():
    """The command line, train()'s keywords, the record's args and its command all come from
    TrainOptions: a run's command parses back to its options, and the defaults agree."""
    assert T.TrainOptions.from_namespace(parser().parse_args(["--family", "lfm2"])) == T.TrainOptions("lfm2")
    opts = T.TrainOptions("qwen3.5", Path("/tmp/a b"), size="tiny", steps=7, lr=3e-3, compile=True,
                          time_budget_s=1.5, progress=False)
    assert opts.out == "/tmp/a b" and "progress" not in opts.recorded()  # how a run reports is not recorded
    cmd = shlex.split(opts.command())
    assert cmd[:3] == ["python", "-m", "labkit.train"] and "--compile" in cmd and "--no-progress" not in cmd
    again = T.TrainOptions.from_namespace(parser().parse_args(cmd[3:]))
    assert again.recorded() == opts.recorded() and again.progress
    assert not T.TrainOptions.from_namespace(parser().parse_args(["--family", "lfm2", "--no-progress"])).progress
    with pytest.raises(ValueError, match="unknown family 'gpt'"):
        T.TrainOptions("gpt")
    with pytest.raises(ValueError, match="seq >= 2"):
        T.TrainOptions("lfm2", seq=1)
    with pytest.raises(TypeError, match="eval_windows_n"):
        T.train("lfm2", None, eval_windows_n=8)


def test_lr_schedule():
    lr = [T.lr_at(s, s / 100, 1.0, 10, 0.1) for s in range(101)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))
    assert lr[100] == pytest.approx(0.1)
    # progress by elapsed time can run ahead of the steps; the schedule follows it
    assert T.lr_at(50, 1.0, 1.0, 10, 0.1) == pytest.approx(0.1)


def test_corpus_split_and_windows(tmp_path):
    root = tmp_path / "lib"
    for rel in ["a.py", "pkg/b.py", "pkg/c.py", "site-packages/x.py", "encodings/cp1.py", "pkg/__pycache__/d.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n" * 3)
    (root / "pkg/b.py").write_text("π = 3.14159  # ≈\n", encoding="utf-8")
    for i in range(40):
        (root / f"m{i:02d}.py").write_text(f"x = {i}\n")
    files = T.corpus_files(root)
    assert files == sorted(files) and "a.py" in files and "pkg/b.py" in files
    assert not any(f.startswith(("site-packages/", "encodings/")) or "__pycache__" in f for f in files)
    held = [f for f in files if T.is_heldout(f)]
    assert 0 < len(held) < len(files)
    corpus = T.load_corpus(root)
    tok = ByteTokenizer()
    assert corpus.stats["train_files"] + corpus.stats["heldout_files"] == len(files)
    for stream, n in ((corpus.train, corpus.stats["train_files"]), (corpus.heldout, corpus.stats["heldout_files"])):
        assert stream[0] == tok.BOS and stream[-1] == tok.EOS
        assert int((stream == tok.BOS).sum()) == n == int((stream == tok.EOS).sum())
    first = sorted(f for f in files if not T.is_heldout(f))[0]
    assert tok.decode(corpus.train[: 2 + len((root / first).read_bytes())]) == (root / first).read_text()
    for split, used in (("train", [f for f in files if not T.is_heldout(f)]), ("heldout", held)):
        text = "".join((root / f).read_text() for f in used)
        assert corpus.stats[f"{split}_bytes_per_char"] == pytest.approx(len(text.encode()) / len(text))
    assert corpus.stats["train_bytes_per_char"] > 1.0  # pkg/b.py holds non-ASCII text
    w = T.eval_windows(corpus.heldout, 5, 7)
    assert w.shape == (5, 7) and torch.equal(w[0], corpus.heldout[:7].long())
    assert torch.equal(w[-1], corpus.heldout[-7:].long())
    assert torch.equal(T.unpack_windows(T.pack_windows(w)), w)


def test_exported_corpus_trains_the_same_stream(tmp_path):
    """--export-corpus copies exactly the corpus files, with a manifest naming their Python; loading
    the copy gives the same token streams and says where they came from."""
    root = tmp_path / "lib"
    for rel in ["a.py", "pkg/b.py", "site-packages/x.py", "encodings/cp1.py", "notes.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n" * 3)
    for i in range(40):
        (root / f"m{i:02d}.py").write_text(f"x = {i}\n")
    manifest = T.export_corpus(tmp_path / "copy", root)
    copy = tmp_path / "copy"
    assert sorted(T.corpus_files(copy)) == T.corpus_files(root) and not (copy / "site-packages").exists()
    assert not (copy / "notes.txt").exists()
    assert manifest["files"] == len(T.corpus_files(root)) and manifest["stdlib_root"] == str(root)
    original, exported = T.load_corpus(root), T.load_corpus(copy)
    assert torch.equal(original.train, exported.train) and torch.equal(original.heldout, exported.heldout)
    assert exported.stats["python_version"] == manifest["python_version"]
    assert exported.stats["stdlib_root"] == str(root) and exported.stats["corpus_root"] == str(copy)
    # a directory without a manifest trains, but cannot say which Python it came from
    assert T.load_corpus(root).stats["python_version"] == "unknown"
    with pytest.raises(FileExistsError, match="not empty"):
        T.export_corpus(copy, root)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        T.load_corpus(tmp_path / "missing")


def test_configs_have_the_family_structure():
    lfm2, qwen = T.byte_config("lfm2"), T.byte_config("qwen3.5")
    for cfg in (lfm2, qwen):
        assert cfg.vocab_size == ByteTokenizer.VOCAB_SIZE and cfg.hidden_size % 64 == 0
        assert cfg.num_heads > cfg.num_kv_heads and cfg.head_dim == 64
        n = labkit.model.empty_model(cfg, torch.float32, "meta").num_parameters()
        assert 5e6 < n < 8e6  # under 16 MB in bfloat16
    assert lfm2.layer_types.count("attention") == 3 and "gdn" not in lfm2.layer_types
    assert qwen.layer_types == ("gdn", "gdn", "gdn", "attention") * 2
    assert qwen.attn_output_gate and qwen.rotary_dim == qwen.head_dim // 4
    assert qwen.gdn_num_v_heads > qwen.gdn_num_k_heads
    assert labkit.config.to_hf(lfm2)["model_type"] == "lfm2"  # transformers can read both
    assert labkit.config.to_hf(qwen)["model_type"] == "qwen3_5_text"


def test_checkpoint_registry(tmp_path, monkeypatch):
    assert set(labkit.CHECKPOINTS) == {"byte-lfm2-6m", "byte-qwen3.5-6m"}
    monkeypatch.setenv("LABKIT_CHECKPOINTS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="python -m labkit.train --family qwen3.5"):
        labkit.checkpoint_path("byte-qwen3.5-6m")
    with pytest.raises(KeyError):
        labkit.checkpoint_path("gpt-5")
    (tmp_path / "byte-lfm2-6m").mkdir()
    (tmp_path / "byte-lfm2-6m" / "config.json").write_text("{}")
    assert labkit.checkpoint_path("byte-lfm2-6m") == tmp_path / "byte-lfm2-6m"
    assert labkit.available_checkpoints() == ["byte-lfm2-6m"]
