"""Train small byte-level models of both families on text every Python machine has.

    python -m labkit train-tiny --family lfm2       # -> data/checkpoints/byte-lfm2-6m    (H200: ~3 min)
    python -m labkit train-tiny --family qwen3.5    # -> data/checkpoints/byte-qwen3.5-6m (H200: ~5.5 min)
    python -m labkit train-tiny --export-corpus build/corpus     # this Python's corpus, to train on elsewhere
    python -m labkit train-tiny --family lfm2 --corpus-root build/corpus

The point is a checkpoint that generates recognisable text offline, for the workbook's decode
experiments; these are toy models, not useful language models.

Corpus. The ``.py`` files of the Python standard library of the interpreter that runs the script
(``sysconfig.get_paths()["stdlib"]``), distributed with Python under the PSF License Agreement.
Files under the top-level ``site-packages/``, ``dist-packages/`` (third-party code) and
``encodings/`` (mostly generated codec tables) are left out; the test suite is kept (about half of
the bytes, and ordinary Python). Some installs drop the test suite (Debian's, many containers'):
``--export-corpus DIR`` copies one interpreter's corpus files to a directory and ``--corpus-root
DIR`` trains on such a copy anywhere; the shipped checkpoints were trained that way, on CPython
3.11.7's 30 MB, on an H200 whose own Python had 8.8 MB. Files are taken in sorted order of their
relative POSIX path; a file is held out when the first 8 bytes of sha256(relative path), read as a
big-endian integer, are < ``HELDOUT_PERCENT`` mod 100, so the split of a file does not depend on
the Python version. Each split is one stream of tokens, file after file, each file as ``<bos>
bytes <eos>``, capped at whole files (``--max-train-bytes``, ``--max-heldout-bytes``). Different
Python versions have different standard libraries: the record (training.json) keeps the version,
file counts, byte counts and sha256 of both streams, and the held-out windows the checkpoint tests
use.

Training. Random crops of ``seq + 1`` tokens from the train stream (a seeded generator on the
training device), next-token cross-entropy, AdamW (betas 0.9/0.95, weight decay on matrices only),
linear warmup then cosine decay to ``min_lr_ratio * lr``, gradient clipping, bf16 autocast on
CUDA and float32 on the CPU. With ``--time-budget-s`` the schedule runs on whichever is further
along, steps or wall time, so the learning rate has decayed when the budget ends the run (such a
run is not step-for-step reproducible; one bounded by ``--steps`` alone is on a CPU, and on a GPU
up to the order of its atomic reductions). The default of 1,600 steps (105 M tokens, about 3.6
passes over CPython 3.11's training split, 28.9 MB) is where the held-out loss stopped falling on
the H200: LFM2 reached 0.998 and 0.999 bits/byte in two runs of 1,600 steps, 1.018 in one of 3,000. (On a standard
library without its test suite, 8.8 MB, the best was about 1.57 bits/byte, after 500 steps; more
overfit, and greedy text fell into runs of spaces.)

Evaluation. Held-out loss in nats per token (= per byte but for the two specials per file) and
bits per byte, on ``--eval-windows`` windows of ``seq + 1`` tokens at evenly spaced offsets of the
held-out stream: periodically in the training precision on 64 evenly spaced ones, and at the end in
float32 on all of them, from the saved bfloat16 weights reloaded with ``labkit.load``, i.e. the
model users get. A subset (``--check-windows``) is stored in training.json with its loss, so a
test can recompute the figure on any machine without this machine's standard library.

Outputs in ``--out``: config.json + model.safetensors (``labkit.save``, bfloat16),
byte_tokenizer.json, training.json and a README.md model card made from the results.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools
import hashlib
import json
import math
import platform
import shlex
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .checkpoint import load, save
from .checkpoints import REPO_ROOT, checkpoints_dir
from .config import ModelConfig
from .model import HybridLM, empty_model
from .tokenizer import ByteTokenizer

HELDOUT_PERCENT = 5
EXCLUDED_TOP_DIRS = ("site-packages", "dist-packages", "encodings")
SAMPLE_PROMPT = "def fibonacci(n):"
SAMPLE_BYTES = 96
PERIODIC_EVAL_WINDOWS = 64
LN2 = math.log(2.0)


# -- model configurations -------------------------------------------------------------------------
def byte_config(family: str, size: str = "6m") -> ModelConfig:
    """A byte-vocabulary model of ``family`` ("lfm2" or "qwen3.5") with the family's structure.

    "6m": hidden 256, 8 layers, SwiGLU width 768, head dims 64 (multiples of 64 throughout).
      LFM2: short conv at layers 0,1,3,4,6 and GQA attention (4 q heads, 2 kv heads, q/k RMSNorm,
      full RoPE) at 2,5,7, like LFM2-350M's conv-first pattern with attention growing denser.
      Qwen3.5: 3 Gated DeltaNet layers then 1 attention, twice; attention with 4 q heads of 64, 2 kv
      heads, q/k norm, a sigmoid output gate and RoPE on a quarter of each head (16 channels);
      Gated DeltaNet with 2 key heads and 4 value heads of 64 (each key head shared by two value
      heads, as in the larger Qwen3.5 models), conv kernel 4.
    "tiny": the same patterns at hidden 64 for CPU tests.
    """
    tok = ByteTokenizer()
    common = dict(
        vocab_size=tok.vocab_size,
        tie_embeddings=True,
        bos_token_id=tok.BOS,
        eos_token_id=tok.EOS,
        pad_token_id=tok.PAD,
        max_position_embeddings=4096,
    )
    if size == "6m":
        dims = dict(hidden_size=256, intermediate_size=768, num_heads=4, num_kv_heads=2, head_dim=64)
        lfm2_layers = ("conv", "conv", "attention", "conv", "conv", "attention", "conv", "attention")
        qwen_layers = ("gdn", "gdn", "gdn", "attention") * 2
        gdn = dict(gdn_num_k_heads=2, gdn_num_v_heads=4, gdn_k_head_dim=64, gdn_v_head_dim=64)
    elif size == "tiny":
        dims = dict(hidden_size=64, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=32)
        lfm2_layers = ("conv", "attention", "conv")
        qwen_layers = ("gdn", "gdn", "attention")
        gdn = dict(gdn_num_k_heads=1, gdn_num_v_heads=2, gdn_k_head_dim=32, gdn_v_head_dim=32)
    else:
        raise ValueError(f"unknown size {size!r}; sizes: '6m', 'tiny'")
    if family == "lfm2":
        return ModelConfig(
            family="lfm2",
            name=f"byte-lfm2-{size}",
            layer_types=lfm2_layers,
            norm_eps=1e-5,
            norm_unit_offset=False,
            rope_theta=1e6,
            rotary_dim=dims["head_dim"],
            conv_kernel=3,
            **dims,
            **common,
        )
    if family == "qwen3.5":
        return ModelConfig(
            family="qwen3.5",
            name=f"byte-qwen3.5-{size}",
            layer_types=qwen_layers,
            norm_eps=1e-6,
            norm_unit_offset=True,
            rope_theta=1e7,
            rotary_dim=dims["head_dim"] // 4,
            attn_output_gate=True,
            gdn_conv_kernel=4,
            **gdn,
            **dims,
            **common,
        )
    raise ValueError(f"unknown family {family!r}; families: 'lfm2', 'qwen3.5'")


@torch.no_grad()
def init_for_training(model: HybridLM, seed: int) -> HybridLM:
    """Initial weights for training from scratch (``labkit.model.init_random`` is for tests).

    Matrices ~ N(0, 0.02), the ones that write into the residual stream scaled by 1/sqrt(2 L);
    norms at their neutral value; depthwise conv taps ~ U(+-1/sqrt(K)); Gated DeltaNet decay
    rates A = exp(A_log) ~ U(1, 16) and dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1],
    so the per-step decay exp(g) starts spread between about 0.2 and 0.999.
    """
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    out_std = 0.02 / math.sqrt(2 * cfg.num_layers)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        r = torch.empty(p.shape, dtype=torch.float32)
        if "norm" in name and p.dim() == 1:  # RMSNorm weights, incl. q/k norms and GDN's gated norm
            unit = cfg.norm_unit_offset and leaf == "weight"  # GDN's norm_weight multiplies directly
            r.fill_(0.0 if unit else 1.0)
        elif leaf == "conv_weight":
            bound = 1.0 / math.sqrt(p.shape[1])
            r.uniform_(-bound, bound, generator=gen)
        elif leaf == "A_log":
            r.uniform_(1.0, 16.0, generator=gen).log_()
        elif leaf == "dt_bias":
            dt = torch.empty(p.shape).uniform_(math.log(1e-3), math.log(0.1), generator=gen).exp()
            r.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif leaf in ("wo", "out_proj", "down"):
            r.normal_(0.0, out_std, generator=gen)
        else:
            r.normal_(0.0, 0.02, generator=gen)
        p.copy_(r)
    return model


def forward_logits(model: HybridLM, input_ids: torch.Tensor) -> torch.Tensor:
    """``model(input_ids)`` without its input checks (which read ids back to the host every call)."""
    B, T = input_ids.shape
    positions = torch.arange(T, device=input_ids.device).expand(B, T)
    h = model.embed(input_ids)
    for block in model.layers:
        h = block(h, positions, None)
    return F.linear(model.final_norm(h), model.lm_head_weight)


def loss_sum(model: HybridLM, windows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy (nats) over ``windows [B, L+1]``, and the target count."""
    logits = forward_logits(model, windows[:, :-1])
    targets = windows[:, 1:]
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
    return loss, targets.numel()


# -- corpus ---------------------------------------------------------------------------------------
@dataclass
class Corpus:
    train: torch.Tensor  # int16 token stream
    heldout: torch.Tensor
    stats: dict[str, Any] = field(default_factory=dict)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


CORPUS_MANIFEST = "CORPUS.json"


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


def _stream(root: Path, files: list[str], cap: int, tok: ByteTokenizer) -> tuple[torch.Tensor, list[str], int]:
    """The token stream of ``files`` (whole files up to ``cap`` tokens), the files used, and their
    characters: UTF-8, an undecodable byte counting as one (the card's bytes per character)."""
    pieces, used, total, chars = [], [], 0, 0
    for rel in files:
        data = (root / rel).read_bytes()
        if total + len(data) + 2 > cap:
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
    root: Path | None = None, max_train_bytes: int = 64 << 20, max_heldout_bytes: int = 4 << 20
) -> Corpus:
    """The train and held-out token streams of the standard library (see the module docstring)."""
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


@torch.no_grad()
def heldout_loss(model: HybridLM, windows: torch.Tensor, batch: int, autocast: bool = False) -> float:
    """Mean next-token loss in nats over ``windows`` [N, L+1]."""
    device = model.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            s, n = loss_sum(model, w)
        total += s.double()
        count += n
    return float(total) / count


# -- the run ---------------------------------------------------------------------------------------
def lr_at(step: int, progress: float, lr: float, warmup: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from ``lr`` to ``min_lr_ratio * lr``
    as ``progress`` (the fraction of the run done, by steps or by time) goes from 0 to 1."""
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min(max(progress, 0.0), 1.0)
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


def _versions() -> dict[str, Any]:
    from . import __version__

    v: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "labkit": __version__}
    from importlib import metadata

    for dist in ("transformers", "triton", "numpy", "safetensors"):
        try:  # the installed version, without importing the package (transformers takes seconds)
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    v["cuda"] = torch.version.cuda
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
        if head.returncode == 0:
            v["git_commit"] = head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:  # noqa: BLE001 - not a git checkout, or no git
        pass
    return v


def _device_info(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                "capability": f"{p.major}.{p.minor}"}
    return {"type": device.type, "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def _command(opts: dict[str, Any]) -> str:
    parts = ["python", "-m", "labkit.train"]
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
        elif value is not None:
            parts += [flag, str(value)]
    return shlex.join(parts)


def train(
    family: str,
    out: str | Path | None = None,
    *,
    size: str = "6m",
    name: str | None = None,
    steps: int = 1600,
    batch: int = 128,
    seq: int = 512,
    lr: float = 2e-3,
    min_lr_ratio: float = 0.1,
    warmup: int = 200,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    seed: int = 0,
    device: str | None = None,
    time_budget_s: float | None = None,
    eval_every: int = 250,
    eval_windows_n: int = 256,
    check_windows: int = 16,
    log_every: int = 25,
    compile: bool = False,
    max_train_bytes: int = 64 << 20,
    max_heldout_bytes: int = 4 << 20,
    progress: bool = True,
    sample_tokens: int = SAMPLE_BYTES,
    corpus_root: str | Path | None = None,
    config: ModelConfig | None = None,
    argv: list[str] | None = None,
) -> dict[str, Any]:
    """Train one model and save it to ``out``; returns the run's record (also written as
    training.json), whose ``"history"`` holds the logged train losses and held-out evaluations.

    ``config`` overrides the (family, size) configuration; it must have the byte vocabulary.
    ``out=None`` trains and evaluates without writing anything (and without the reload check).
    """
    t_start = time.perf_counter()
    opts = dict(
        family=family, out=str(out) if out is not None else None, size=size, name=name, steps=steps,
        batch=batch, seq=seq, lr=lr, min_lr_ratio=min_lr_ratio, warmup=warmup, weight_decay=weight_decay,
        grad_clip=grad_clip, seed=seed, device=device, time_budget_s=time_budget_s, eval_every=eval_every,
        eval_windows=eval_windows_n, check_windows=check_windows, log_every=log_every, compile=compile,
        max_train_bytes=max_train_bytes, max_heldout_bytes=max_heldout_bytes, sample_tokens=sample_tokens,
        corpus_root=str(corpus_root) if corpus_root is not None else None,
    )
    tok = ByteTokenizer()
    cfg = config or byte_config(family, size)
    if name:
        cfg = cfg.replace(name=name)
    if cfg.family != family:
        raise ValueError(f"config family {cfg.family!r} differs from --family {family!r}")
    if cfg.vocab_size != tok.vocab_size:
        raise ValueError(f"a byte-level model needs vocab_size {tok.vocab_size}, config has {cfg.vocab_size}")
    if steps < 1 or batch < 1 or seq < 2:
        raise ValueError("steps and batch must be >= 1 and seq >= 2")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    opts["device"] = str(dev)
    use_bf16 = dev.type == "cuda"

    torch.manual_seed(seed)
    corpus = load_corpus(corpus_root, max_train_bytes, max_heldout_bytes)
    if corpus.train.numel() <= seq + 1:
        raise ValueError(f"train stream ({corpus.train.numel()} tokens) is shorter than one crop of {seq + 1}")
    windows = eval_windows(corpus.heldout, eval_windows_n, seq + 1)
    check_idx = torch.linspace(0, windows.shape[0] - 1, min(check_windows, windows.shape[0])).round().long().unique()
    check = windows[check_idx]
    # periodic evaluations use an evenly spaced subset, so they estimate the final figure (the first
    # windows alone come from the first few held-out files)
    periodic = windows[:: max(1, windows.shape[0] // PERIODIC_EVAL_WINDOWS)][:PERIODIC_EVAL_WINDOWS]
    stream = corpus.train.to(dev)

    model = init_for_training(empty_model(cfg, torch.float32, dev), seed).requires_grad_(True).train()
    n_params = model.num_parameters()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if dev.type == "cuda" else {}),
    )
    step_loss = torch.compile(loss_sum, dynamic=False) if compile else loss_sum
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    offsets = torch.arange(seq + 1, device=dev)
    warm = min(warmup, max(1, steps // 10))

    def batch_at() -> torch.Tensor:
        starts = torch.randint(0, stream.numel() - seq, (batch, 1), device=dev, generator=gen)
        return stream[starts + offsets].long()

    history: dict[str, list] = {"train": [], "eval": []}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=cfg.name, unit="step", dynamic_ncols=True, mininterval=1.0)
    say = bar.write if bar is not None else functools.partial(print, flush=True)  # logs survive a kill
    say(f"{cfg.name}: {n_params / 1e6:.2f} M parameters; corpus: Python {corpus.stats['python_version']} stdlib, "
        f"{corpus.stats['train_files']} train files ({corpus.stats['train_tokens'] / 1e6:.1f} M tokens), "
        f"{corpus.stats['heldout_files']} held-out files; device {dev}; batch {batch} x seq {seq}")

    def periodic_eval(step: int, train_loss: float | None, elapsed: float) -> None:
        model.eval()
        loss = heldout_loss(model, periodic, batch, autocast=use_bf16)
        model.train()
        history["eval"].append({"step": step, "tokens": step * batch * seq, "heldout_loss": loss,
                                "heldout_bits_per_byte": loss / LN2, "train_loss": train_loss,
                                "elapsed_s": round(elapsed, 2)})
        say(f"step {step:6d}  train {train_loss if train_loss is not None else float('nan'):.4f}  "
            f"held-out {loss:.4f} nats/byte = {loss / LN2:.3f} bits/byte  ({elapsed:.0f} s)")

    t_setup = time.perf_counter() - t_start
    # On a CPU the first steps of a fresh model (LFM2's gated conv multiplies three small numbers)
    # produce float32 denormals, which x86 cores handle many times slower: flush them to zero
    # while training.
    flushing = dev.type == "cpu" and torch.set_flush_denormal(True)
    t0 = time.perf_counter()
    acc = torch.zeros((), device=dev)
    acc_n, last_log_t, last_log_step = 0, t0, 0
    last_train_loss: float | None = None
    step, stopped_by = 0, "steps"
    try:
        while step < steps:
            elapsed = time.perf_counter() - t0
            if time_budget_s is not None and step > 0 and elapsed >= time_budget_s:  # at least one step
                stopped_by = "time_budget"
                break
            progress_frac = max(step / steps, elapsed / time_budget_s if time_budget_s else 0.0)
            cur_lr = lr_at(step, progress_frac, lr, warm, min_lr_ratio)
            for group in optim.param_groups:
                group["lr"] = cur_lr
            w = batch_at()
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
                s, n = step_loss(model, w)
            loss = s / n
            optim.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optim.step()
            acc += loss.detach()
            acc_n += 1
            step += 1
            if bar is not None:
                bar.update(1)
            if step % log_every == 0 or step == steps:
                mean = float(acc) / acc_n  # the one host sync per log interval
                now = time.perf_counter()
                history["train"].append({"step": step, "tokens": step * batch * seq, "loss": mean, "lr": cur_lr,
                                         "grad_norm": float(grad_norm), "elapsed_s": round(now - t0, 2),
                                         "steps_per_s": round((step - last_log_step) / max(now - last_log_t, 1e-9), 3)})
                if bar is not None:
                    bar.set_postfix(loss=f"{mean:.3f}", lr=f"{cur_lr:.2e}", refresh=False)
                last_train_loss, acc_n, last_log_t, last_log_step = mean, 0, now, step
                acc.zero_()
            if eval_every and step % eval_every == 0 and step < steps:
                periodic_eval(step, last_train_loss, time.perf_counter() - t0)
    finally:
        if flushing:
            torch.set_flush_denormal(False)
    if acc_n:
        last_train_loss = float(acc) / acc_n
        now = time.perf_counter()
        history["train"].append({"step": step, "tokens": step * batch * seq, "loss": last_train_loss, "lr": cur_lr,
                                 "elapsed_s": round(now - t0, 2),
                                 "steps_per_s": round((step - last_log_step) / max(now - last_log_t, 1e-9), 3)})
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t_train = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    if not history["eval"] or history["eval"][-1]["step"] != step:
        periodic_eval(step, last_train_loss, t_train)

    # Final evaluation in float32 of the weights as saved (bfloat16), reloaded the way users load them.
    t1 = time.perf_counter()
    model.eval().requires_grad_(False)
    out_path = Path(out) if out is not None else None
    if out_path is not None:
        save(model, out_path, dtype=torch.bfloat16, extra_config={"labkit_tokenizer": "byte_tokenizer.json"})
        tok.save(out_path)
        final = load(out_path, dtype=torch.float32, device=dev)
    else:
        final = empty_model(cfg, torch.float32, dev)
        with torch.no_grad():
            for p, q in zip(final.parameters(), model.parameters()):
                p.copy_(q.to(torch.bfloat16).float())
    full = heldout_loss(final, windows, batch)
    check_loss = heldout_loss(final, check, batch)
    # The card's sample: greedy, float32, reference backend, on the CPU (so anyone can reproduce it).
    from .generate import generate

    cpu_model = final.to("cpu")
    prompt = torch.tensor([tok.encode(SAMPLE_PROMPT)])
    sample = generate(cpu_model, prompt, sample_tokens, stop_tokens=[tok.EOS], progress=False)
    sample_ids = sample.tokens[0].tolist()
    t_eval = time.perf_counter() - t1

    record: dict[str, Any] = {
        "format": "labkit-train-record",
        "version": 1,
        "name": cfg.name,
        "family": cfg.family,
        "command": _command(opts),
        "argv": argv,
        "args": opts,
        "model": {"config": cfg.to_dict(), "parameters": n_params, "saved_dtype": "bfloat16",
                  "checkpoint_bytes": (out_path / "model.safetensors").stat().st_size if out_path else None},
        "tokenizer": tok.to_dict(),
        "corpus": corpus.stats,
        "steps": step,
        "stopped_by": stopped_by,
        "tokens_seen": step * batch * seq,
        "epochs": step * batch * seq / corpus.stats["train_tokens"],
        "warmup_steps": warm,
        "seconds": {"setup": round(t_setup, 2), "train": round(t_train, 2), "final_eval": round(t_eval, 2),
                    "total": round(time.perf_counter() - t_start, 2)},
        "steps_per_s": step / t_train if t_train > 0 else None,
        "device": _device_info(dev),
        "autocast": "bfloat16" if use_bf16 else None,
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "final": {
            "train_loss": last_train_loss,
            "train_bits_per_byte": last_train_loss / LN2 if last_train_loss is not None else None,
            "heldout_loss": full,
            "heldout_bits_per_byte": full / LN2,
            "heldout_windows": int(windows.shape[0]),
            "window_tokens": seq + 1,
            "how": "float32 forward of the saved bfloat16 weights; mean next-token cross-entropy in nats",
        },
        "check": {
            "what": "held-out windows (a subset of the final evaluation's) and their loss, for tests",
            "window_indices": check_idx.tolist(),
            "windows": pack_windows(check),
            "loss": check_loss,
            "bits_per_byte": check_loss / LN2,
            "device": str(dev),
        },
        "sample": {"prompt": SAMPLE_PROMPT, "bos": True, "max_new_tokens": sample_tokens, "greedy": True,
                   "backend": "reference", "dtype": "float32", "device": "cpu", "stop_tokens": [tok.EOS],
                   "tokens": sample_ids, "text": tok.decode(sample_ids)},
        "history": history,
    }
    say(f"{cfg.name}: {step} steps ({stopped_by}), {record['tokens_seen'] / 1e6:.1f} M tokens in {t_train:.0f} s; "
        f"held-out {full:.4f} nats/byte = {full / LN2:.3f} bits/byte")
    if out_path is not None:
        (out_path / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        (out_path / "README.md").write_text(model_card(record))
    return record


# -- model card ------------------------------------------------------------------------------------
def model_card(r: dict[str, Any]) -> str:
    """The README.md of a trained checkpoint, written from its training record."""
    cfg, c, f = r["model"]["config"], r["corpus"], r["final"]
    a = r["args"]
    kinds = cfg["layer_types"]
    pattern = " ".join({"conv": "C", "attention": "A", "gdn": "D"}[k] for k in kinds)
    if cfg["family"] == "lfm2":
        arch = (f"LFM2 structure: {len(kinds)} blocks, gated short convolution (kernel {cfg['conv_kernel']}) "
                f"in {kinds.count('conv')}, grouped-query attention in {kinds.count('attention')} "
                f"({cfg['num_heads']} query heads, {cfg['num_kv_heads']} KV heads, head dim {cfg['head_dim']}, "
                f"q/k RMSNorm, RoPE θ={cfg['rope_theta']:g})")
    else:
        arch = (f"Qwen3.5 structure: {len(kinds)} blocks, Gated DeltaNet in {kinds.count('gdn')} "
                f"({cfg['gdn_num_k_heads']} key heads × {cfg['gdn_k_head_dim']}, {cfg['gdn_num_v_heads']} value "
                f"heads × {cfg['gdn_v_head_dim']}, conv kernel {cfg['gdn_conv_kernel']}), gated attention in "
                f"{kinds.count('attention')} ({cfg['num_heads']} query heads, {cfg['num_kv_heads']} KV heads, "
                f"head dim {cfg['head_dim']}, q/k RMSNorm, sigmoid output gate, RoPE on {cfg['rotary_dim']} of "
                f"{cfg['head_dim']} channels, θ={cfg['rope_theta']:g})")
    mb = (r["model"]["checkpoint_bytes"] or 0) / 1e6
    dev = r["device"]["name"] + (f" ({r['device']['type']})" if r["device"]["type"] != "cuda" else "")
    sample = r["sample"]["text"]
    fence = "```"
    while fence in sample:
        fence += "`"
    return f"""# {r['name']}

A toy byte-level language model with the structure of {'Liquid AI’s LFM2' if cfg['family'] == 'lfm2' else 'Qwen3.5'},
trained from scratch by `labkit.train` on the Python standard library's own source code, so that the
labkit workbook has a real trained model to decode, offline, with recognisable output. It is not a
useful language model and not a release of {'LFM2' if cfg['family'] == 'lfm2' else 'Qwen3.5'}; only the
architecture is shared.

## Model

- {arch}; SwiGLU MLP width {cfg['intermediate_size']} in every block; pattern `{pattern}`
  (C = short conv, D = Gated DeltaNet, A = attention).
- Hidden size {cfg['hidden_size']}, vocabulary {cfg['vocab_size']} (bytes 0-255, `<pad>`=256, `<bos>`=257,
  `<eos>`=258, 259-263 reserved; see `byte_tokenizer.json`), tied embeddings.
- {r['model']['parameters']:,} parameters; stored in bfloat16 ({mb:.1f} MB) in transformers' format
  (`config.json` + `model.safetensors`): `labkit.load` and `transformers.AutoModelForCausalLM` both read it.
- Trained context: {a['seq']} bytes (RoPE positions beyond it were never seen).

## Data

The `.py` files of the standard library of Python {c['python_version']} ({c['python_implementation']}),
found with `sysconfig.get_paths()["stdlib"]`{_exported(c)}, without the top-level directories
{', '.join(f'`{d}/`' for d in c['excluded_top_dirs'])}; the test suite is included. Each file is one
document, `<bos>` + its bytes + `<eos>`, in sorted path order. A file is held out when
`{c['heldout_rule']}`.

| split | files | tokens (≈ bytes) | sha256 of the token stream |
| --- | ---: | ---: | --- |
| train | {c['train_files']:,} | {c['train_tokens']:,} | `{c['train_sha256'][:16]}…` |
| held out | {c['heldout_files']:,} | {c['heldout_tokens']:,} | `{c['heldout_sha256'][:16]}…` |

Another Python version has a different standard library, hence a different corpus: the counts and
hashes above identify this one. License: the Python source is distributed by the Python Software
Foundation under the PSF License Agreement, which permits use, modification and redistribution of
derived works with its copyright notice retained; this model was trained on that text and its
samples may reproduce fragments of it.

## Training

{r['steps']:,} steps ({'stopped by the time budget' if r['stopped_by'] == 'time_budget' else 'all planned steps'})
of {a['batch']} random crops × {a['seq']} bytes = {r['tokens_seen'] / 1e6:.1f} M tokens seen
({r['epochs']:.3g} passes over the train split), in {r['seconds']['train']:.0f} s on {dev}
({r['steps_per_s']:.1f} steps/s), {'bfloat16 autocast' if r['autocast'] else 'float32'}. AdamW
(β = 0.9, 0.95; weight decay {a['weight_decay']} on matrices), peak learning rate {a['lr']:g} after
{r['warmup_steps']} warmup steps, cosine decay to {a['min_lr_ratio']:g}× (by steps or by elapsed time,
whichever is further along), gradient clipping at {a['grad_clip']}, seed {a['seed']}.
Date {r['date']}; Python {r['versions']['python']}, torch {r['versions']['torch']},
labkit {r['versions']['labkit']}{_commit(r['versions'].get('git_commit'))}.

```
{r['command']}
```

## Results

| | nats / byte | bits / byte |
| --- | ---: | ---: |
| train loss (last {a['log_every']} steps, training precision) | {f['train_loss']:.4f} | {f['train_bits_per_byte']:.3f} |
| held-out loss ({f['heldout_windows']} windows × {f['window_tokens']} tokens, float32) | {f['heldout_loss']:.4f} | {f['heldout_bits_per_byte']:.3f} |

{_per_char(c, f)}The held-out figure is a float32 forward of the saved bfloat16 weights. `training.json` has the whole
history, every argument, the versions and a stored subset of held-out windows
({len(r['check']['window_indices'])} windows, loss {r['check']['loss']:.4f} nats/byte) that the tests
recompute.

Greedy continuation of `{r['sample']['prompt']}` ({r['sample']['max_new_tokens']} bytes at most, reference
backend, float32, CPU):

{fence}python
{r['sample']['prompt']}{sample}
{fence}

## Use

```python
import torch, labkit

path = labkit.checkpoint_path("{r['name']}")
model = labkit.load(path, dtype=torch.float32)
tok = labkit.ByteTokenizer.from_checkpoint(path)
ids = torch.tensor([tok.encode("{r['sample']['prompt']}")])
out = labkit.generate(model, ids, max_new_tokens=96, stop_tokens=[tok.eos_id])
print(tok.decode(out.tokens[0]))
```
"""


def _per_char(c: dict[str, Any], f: dict[str, Any]) -> str:
    if "heldout_bytes_per_char" not in c:  # records made before the corpus counted characters
        return ""
    bpc = c["heldout_bytes_per_char"]
    return (f"The held-out text has {bpc:.4f} bytes per character (UTF-8; train split "
            f"{c['train_bytes_per_char']:.4f}),\nso the held-out loss is "
            f"{f['heldout_bits_per_byte'] * bpc:.3f} bits per character.\n\n")


def _exported(c: dict[str, Any]) -> str:
    if c.get("corpus_root", c["stdlib_root"]) == c["stdlib_root"]:
        return ""
    return f" (`{c['stdlib_root']}`, exported with `--export-corpus` and read from a copy)"


def _commit(commit: str | None) -> str:
    if not commit:
        return ""
    return f" at commit {commit[:12]}" + (" with uncommitted changes" if commit.endswith("-dirty") else "")


# -- command line -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m labkit.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--family", choices=("lfm2", "qwen3.5"), help="required unless --export-corpus")
    p.add_argument("--out", help="checkpoint directory; if not given, data/checkpoints/<name>")
    p.add_argument("--size", default="6m", choices=("6m", "tiny"))
    p.add_argument("--name", help="model name; if not given, byte-<family>-<size>")
    p.add_argument("--steps", type=int, default=1600, help="most optimizer steps (more overfits the stdlib corpus)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seq", type=int, default=512, help="bytes per training crop")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=200, help="warmup steps (at most steps/10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="cuda, cuda:1, cpu; if not given, cuda when available")
    p.add_argument("--time-budget-s", type=float, help="stop training after this many seconds (then evaluate and save)")
    p.add_argument("--eval-every", type=int, default=250, help="steps between held-out evaluations (0: only at the end)")
    p.add_argument("--eval-windows", type=int, default=256, help="held-out windows in the final evaluation")
    p.add_argument("--check-windows", type=int, default=16, help="held-out windows stored for the tests")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--compile", action="store_true", help="torch.compile the loss (compile time counts in the budget)")
    p.add_argument("--max-train-bytes", type=int, default=64 << 20)
    p.add_argument("--max-heldout-bytes", type=int, default=4 << 20)
    p.add_argument("--sample-tokens", type=int, default=SAMPLE_BYTES, help="bytes in the card's greedy sample")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--corpus-root", help="train on a corpus exported by --export-corpus instead of this Python's stdlib")
    p.add_argument("--export-corpus", metavar="DIR", help="copy this Python's corpus files to DIR and exit")
    a = p.parse_args(argv)
    if a.export_corpus:
        m = export_corpus(a.export_corpus)
        print(f"{m['files']} files, {m['bytes'] / 1e6:.1f} MB of Python {m['python_version']} stdlib -> {a.export_corpus}")
        return 0
    if a.family is None:
        p.error("--family is required")
    name = a.name or byte_config(a.family, a.size).name
    out = a.out or str(checkpoints_dir() / name)
    train(
        a.family, out, size=a.size, name=a.name, steps=a.steps, batch=a.batch, seq=a.seq, lr=a.lr,
        min_lr_ratio=a.min_lr_ratio, warmup=a.warmup, weight_decay=a.weight_decay, grad_clip=a.grad_clip,
        seed=a.seed, device=a.device, time_budget_s=a.time_budget_s, eval_every=a.eval_every,
        eval_windows_n=a.eval_windows, check_windows=a.check_windows, log_every=a.log_every, compile=a.compile,
        max_train_bytes=a.max_train_bytes, max_heldout_bytes=a.max_heldout_bytes, progress=not a.no_progress,
        sample_tokens=a.sample_tokens, corpus_root=a.corpus_root, argv=argv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
