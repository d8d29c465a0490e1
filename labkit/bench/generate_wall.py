"""``python -m labkit bench generate``: the wall clock of :func:`labkit.generate` as its caller waits
for it, set-up included, beside the split the call reports.

The call a user makes: ``generate(model, ids, new_tokens, backend=...)`` with no cache of its own,
so that a pooled backend lends it the decoder, cache and graphs of the calls before. The prompt's
ids are on the GPU or on the host (a tokenizer's output): ``--ids``. Per case:

- ``first_call_ms``: one call after the model's pool was emptied, as the first call of a process
  meets it (the decoder made, its graphs captured when due; compiles, where Triton's disk cache
  does not hold them, in the first case of a run only);
- after ``--warmup`` calls more (a graph backend captures a prompt length at its second call), the
  medians over ``--repeats`` calls, each timed on the host with the device synchronised before and
  after: ``wall_ms``, and the parts :class:`labkit.GenerationResult` reports (``setup_ms``,
  ``ttft_ms``, ``decode_ms``), with ``rest_ms`` = wall - (set-up + TTFT + decode) of each call: the
  argument checks before set-up (for ids on the GPU, their range read back: a sync) and the return.

What this separates: a prefill benchmark times the decoder's prefill; a user waits for the whole
call. ``--against FILE`` times another ``generate.py`` beside this one, in the same process and on
the same pooled decoder, the two called in turns (ABBA), for a change to ``generate`` itself: e.g.
``git show <commit>:labkit/generate.py > /tmp/generate_then.py``, then ``--against
/tmp/generate_then.py``. The file is loaded as a module of this labkit package (its relative imports
are this package's), and both must produce the same tokens. Its figures are the ``against_*``
fields, and ``paired_saving_ms`` is the median over rounds of its wall minus this one's. Writes
``data/bench/<gpu>/<name>.json`` (kind ``generate``) with its provenance.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..generate import _sync, generate
from ..model import HybridLM


@dataclass
class GenerateWall:
    model: str
    backend: str
    prompt: int
    new_tokens: int
    ids: str  # where the prompt's ids are: "device" (the model's) or "host"
    repeats: int
    first_call_ms: float = float("nan")
    wall_ms: float = float("nan")
    setup_ms: float = float("nan")
    ttft_ms: float = float("nan")
    decode_ms: float = float("nan")
    rest_ms: float = float("nan")
    runs_ms: list[float] = field(default_factory=list)
    against: str | None = None  # another generate.py, timed in turns with this one (--against)
    against_wall_ms: float = float("nan")
    against_setup_ms: float = float("nan")
    against_ttft_ms: float = float("nan")
    against_decode_ms: float = float("nan")
    against_rest_ms: float = float("nan")
    paired_saving_ms: float = float("nan")  # median over rounds of (against's wall - this one's)
    error: str | None = None


def load_generate(path: str):
    """The ``generate`` function of the file ``path`` (an older or changed ``labkit/generate.py``),
    loaded as a module of this labkit package so that its relative imports resolve here."""
    name = f"labkit._generate_against_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "labkit"
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "generate", None)):
        raise ValueError(f"{path} defines no generate function")
    return module.generate


def _medians(walls: list[float], outs: list) -> tuple[float, ...]:
    """Medians in ms of the walls and of each call's set-up, TTFT, decode and rest."""
    parts = [(o.setup_s, o.ttft_s, o.decode_s, w - o.setup_s - o.ttft_s - o.decode_s) for w, o in zip(walls, outs)]
    return (statistics.median(walls) * 1e3, *(statistics.median(p[i] for p in parts) * 1e3 for i in range(4)))


@torch.no_grad()
def time_generate(model: HybridLM, backend: str, prompt: int, new_tokens: int, ids_on: str = "device",
                  repeats: int = 20, warmup: int = 3, seed: int = 0, against: str | None = None) -> GenerateWall:
    """One case (module docstring): greedy ``generate`` of ``new_tokens`` after ``prompt`` random
    token ids, batch 1; with ``against``, that file's ``generate`` in turns with this one."""
    from ..decode.registry import release_pooled

    if ids_on not in ("device", "host"):
        raise ValueError(f"ids_on must be 'device' or 'host', got {ids_on!r}")
    row = GenerateWall(model.cfg.name, backend, prompt, new_tokens, ids_on, repeats, against=against)
    ids = torch.randint(0, model.cfg.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(seed))
    if ids_on == "device":
        ids = ids.to(model.device)

    def call(fn):
        _sync(model.device)
        t = time.perf_counter()
        out = fn(model, ids, new_tokens, backend=backend, progress=False)
        _sync(model.device)
        return time.perf_counter() - t, out

    try:
        sides = {"this": generate} if against is None else {"this": generate, "against": load_generate(against)}
        release_pooled(model)
        row.first_call_ms = call(generate)[0] * 1e3
        for _ in range(warmup):
            for fn in sides.values():
                call(fn)
        timed = {k: ([], []) for k in sides}
        for i in range(repeats):
            for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):  # ABBA: neither side always first
                wall, out = call(sides[k])
                timed[k][0].append(wall)
                timed[k][1].append(out)
        if against is not None:
            if not all(torch.equal(a.tokens, b.tokens) for a, b in zip(*(timed[k][1] for k in sides))):
                raise RuntimeError(f"{against}'s generate and this one produced different tokens")
            (row.against_wall_ms, row.against_setup_ms, row.against_ttft_ms, row.against_decode_ms,
             row.against_rest_ms) = _medians(*timed["against"])
            row.paired_saving_ms = statistics.median(a - b for a, b in zip(timed["against"][0], timed["this"][0])) * 1e3
    except Exception as exc:  # noqa: BLE001 - a failed case is a row that says so
        row.error = f"{type(exc).__name__}: {exc}"
        return row
    row.runs_ms = [w * 1e3 for w in timed["this"][0]]
    row.wall_ms, row.setup_ms, row.ttft_ms, row.decode_ms, row.rest_ms = _medians(*timed["this"])
    return row


def _print(r: GenerateWall) -> None:
    head = f"{r.model:>14} {r.backend:>16} T={r.prompt:<6} new={r.new_tokens:<4} ids on {r.ids:6}"
    if r.error:
        print(f"{head} failed: {r.error}")
        return
    print(f"{head} wall {r.wall_ms:8.3f} ms = set-up {r.setup_ms:.3f} + TTFT {r.ttft_ms:.3f} + decode "
          f"{r.decode_ms:.3f} + rest {r.rest_ms:.3f} (medians of {r.repeats}); first call {r.first_call_ms:.1f} ms")
    if r.against:
        print(f"{'':>60} against {r.against}: wall {r.against_wall_ms:8.3f} ms = set-up {r.against_setup_ms:.3f} + TTFT "
              f"{r.against_ttft_ms:.3f} + decode {r.against_decode_ms:.3f} + rest {r.against_rest_ms:.3f}; "
              f"saved per call {r.paired_saving_ms:.3f} ms (median of pairs)")


def main(argv: list[str]) -> int:
    """``python -m labkit bench generate [options]``."""
    from ..config import PRESETS
    from ..lab.hw import device_facts
    from .cli import _models, positive_int, results_name
    from .results import DATA_DIR, write_results

    p = argparse.ArgumentParser(prog="labkit bench generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"], choices=list(PRESETS))
    p.add_argument("--impls", nargs="+", default=["fused+graph"], help="labkit backends")
    p.add_argument("--prompts", nargs="+", type=positive_int, default=[4096], help="prompt lengths, in tokens")
    p.add_argument("--new-tokens", nargs="+", type=positive_int, default=[1], help="tokens generated per call")
    p.add_argument("--ids", nargs="+", choices=["device", "host"], default=["device", "host"],
                   help="where the prompt's ids are when generate is called")
    p.add_argument("--repeats", type=positive_int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="calls after the first, before the timed ones")
    p.add_argument("--against", metavar="FILE", help="another generate.py, timed in turns with this one")
    p.add_argument("--device", default="auto")
    p.add_argument("--name", required=True, type=results_name, help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    from ..decode.registry import BACKENDS

    bad = [i for i in args.impls if i not in BACKENDS]
    if bad:
        p.error(f"argument --impls: {bad[0]!r} is not a labkit backend; choose from {', '.join(BACKENDS)}")
    if args.warmup < 0:
        p.error(f"argument --warmup: must be >= 0, got {args.warmup}")
    if args.against is not None and not Path(args.against).is_file():
        p.error(f"argument --against: no file {args.against!r} (e.g. git show <commit>:labkit/generate.py > FILE)")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    facts = device_facts(device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    rows = []
    for model in _models(args.models, device, dtype):
        for impl in args.impls:
            for prompt in args.prompts:
                for new in args.new_tokens:
                    for ids_on in args.ids:
                        rows.append(time_generate(model, impl, prompt, new, ids_on, args.repeats, args.warmup,
                                                  against=args.against))
                        _print(rows[-1])
    command = shlex.join(["python", "-m", "labkit", "bench", "generate", *argv])
    print(f"wrote {write_results(args.name, 'generate', rows, facts, command=command, data_dir=args.data_dir)}")
    return 1 if any(r.error for r in rows) else 0
