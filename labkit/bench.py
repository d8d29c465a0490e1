"""Benchmarks of decode and prefill, for labkit's backends and for peers measured in the same run.

The protocol, everywhere: warm up first (compilation, autotuning, graph capture, allocator), then
time whole runs with CUDA events (a host clock on a CPU), and report the median of several runs.
Decode feeds each step the greedy token of the previous one, so every step depends on the last
as in real generation. Achieved bandwidth is the bytes a step must move (``labkit.roofline``)
over the measured step time; "% of roofline" compares tokens/s with bytes / measured copy
bandwidth. Results are written with the GPU, versions, date and the exact command.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .backends import make_decoder
from .config import PRESETS
from .hw import DeviceFacts, Stopwatch, device_facts, versions
from .model import HybridLM, build
from .roofline import step_cost

PEERS = ("transformers", "transformers+compile")
DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "bench"


# -- runners: one interface for labkit backends and peers -----------------------------------------
@dataclass
class Runner:
    """``reset()`` forgets all sequences; ``prefill(ids) -> last logits``; ``step(tokens) -> logits``;
    ``greedy(tokens) -> next tokens``, by the implementation's fastest greedy path."""

    reset: Callable[[], None]
    prefill: Callable[[torch.Tensor], torch.Tensor]
    step: Callable[[torch.Tensor], torch.Tensor]
    greedy: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if self.greedy is None:
            self.greedy = lambda tokens: self.step(tokens).argmax(-1)


def labkit_runner(model: HybridLM, backend: str, batch: int, max_len: int) -> Runner:
    cache = model.new_cache(batch, max_len)
    decoder = make_decoder(backend, model, cache)
    # backends that can pick the next token without writing logits (the fused ones) do so here
    return Runner(cache.reset, decoder.prefill, decoder.step, getattr(decoder, "step_greedy", None))


def transformers_runner(model: HybridLM, compiled: bool = False) -> Runner:
    from .peers import transformers_twin

    twin = transformers_twin(model)
    call = torch.compile(twin) if compiled else twin
    state: dict = {}

    def reset() -> None:
        state.clear()

    @torch.no_grad()
    def prefill(ids: torch.Tensor) -> torch.Tensor:
        out = call(input_ids=ids, use_cache=True, logits_to_keep=1)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    @torch.no_grad()
    def step(tokens: torch.Tensor) -> torch.Tensor:
        out = call(input_ids=tokens[:, None], past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[:, -1]

    return Runner(reset, prefill, step)


def make_runner(model: HybridLM, name: str, batch: int, max_len: int) -> Runner:
    if name == "transformers":
        return transformers_runner(model)
    if name == "transformers+compile":
        return transformers_runner(model, compiled=True)
    return labkit_runner(model, name, batch, max_len)


# -- measurements --------------------------------------------------------------------------------
@dataclass
class DecodeResult:
    model: str
    impl: str
    batch: int
    prompt: int
    new_tokens: int
    tokens_per_s: float | None = None
    step_ms: float | None = None
    runs_tokens_per_s: list[float] = field(default_factory=list)
    bytes_per_step: int | None = None
    achieved_bytes_per_s: float | None = None
    roofline_tokens_per_s: float | None = None
    pct_of_roofline: float | None = None
    error: str | None = None


@dataclass
class PrefillResult:
    model: str
    impl: str
    batch: int
    tokens: int
    ms: float | None = None
    runs_ms: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    error: str | None = None


def _prompt(model: HybridLM, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=gen).to(model.device)


@torch.no_grad()
def time_decode(
    model: HybridLM,
    impl: str,
    batch: int,
    prompt: int = 128,
    new_tokens: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    facts: DeviceFacts | None = None,
) -> DecodeResult:
    """Median tokens/s of ``new_tokens`` greedy decode steps after a ``prompt``-token prefill."""
    res = DecodeResult(model.cfg.name, impl, batch, prompt, new_tokens)
    try:
        runner = make_runner(model, impl, batch, prompt + new_tokens + 1)
        ids = _prompt(model, batch, prompt)
        for r in range(warmup + repeats):
            runner.reset()
            token = runner.prefill(ids).argmax(-1)
            with Stopwatch(model.device) as sw:
                for _ in range(new_tokens):
                    token = runner.greedy(token)
            if r >= warmup:
                res.runs_tokens_per_s.append(batch * new_tokens / (sw.ms * 1e-3))
    except Exception as exc:  # recorded in the results: a peer that fails is a finding, not a crash
        res.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return res
    res.tokens_per_s = statistics.median(res.runs_tokens_per_s)
    res.step_ms = batch / res.tokens_per_s * 1e3
    cost = step_cost(model.cfg, batch, context=prompt + new_tokens // 2, dtype_bytes=model.dtype.itemsize)
    res.bytes_per_step = cost.bytes
    res.achieved_bytes_per_s = cost.bytes / (res.step_ms * 1e-3)
    if facts is not None and facts.copy_bytes_per_s:
        res.roofline_tokens_per_s = cost.tokens_per_s_limit(facts.copy_bytes_per_s)
        res.pct_of_roofline = 100 * res.tokens_per_s / res.roofline_tokens_per_s
    return res


@torch.no_grad()
def time_prefill(
    model: HybridLM, impl: str, tokens: int, batch: int = 1, repeats: int = 5, warmup: int = 1
) -> PrefillResult:
    """Median milliseconds to prefill ``tokens`` tokens into an empty cache (last logits only)."""
    res = PrefillResult(model.cfg.name, impl, batch, tokens)
    try:
        runner = make_runner(model, impl, batch, tokens + 1)
        ids = _prompt(model, batch, tokens)
        for r in range(warmup + repeats):
            runner.reset()
            with Stopwatch(model.device) as sw:
                runner.prefill(ids)
            if r >= warmup:
                res.runs_ms.append(sw.ms)
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return res
    res.ms = statistics.median(res.runs_ms)
    res.tokens_per_s = batch * tokens / (res.ms * 1e-3)
    return res


# -- results files -------------------------------------------------------------------------------
def provenance(facts: DeviceFacts, command: str | None = None) -> dict:
    return {
        "gpu": facts.name if facts.kind == "cuda" else None,
        "device": facts.to_dict(),
        "versions": versions(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in ["python", "-m", "labkit", *sys.argv[1:]]),
    }


def write_results(name: str, kind: str, rows: list, facts: DeviceFacts, command: str | None = None,
                  data_dir: Path = DATA_DIR) -> Path:
    out_dir = data_dir / facts.slug
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    doc = {**provenance(facts, command), "kind": kind, "results": [asdict(r) for r in rows]}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_results(data_dir: Path = DATA_DIR) -> list[dict]:
    docs = []
    for path in sorted(data_dir.glob("*/*.json")):
        doc = json.loads(path.read_text())
        doc["path"] = str(path.relative_to(data_dir.parent.parent))
        docs.append(doc)
    return docs


def markdown_table(docs: list[dict]) -> str:
    """The README's results table: every decode and prefill row of every results file."""
    lines = []
    decode = [(d, r) for d in docs if d.get("kind") == "decode" for r in d["results"]]
    if decode:
        lines += [
            "| GPU | model | implementation | batch | tok/s | % of roofline | achieved GB/s | file |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for d, r in decode:
            if r.get("error"):
                cells = ["failed", "", ""]
            else:
                pct = r.get("pct_of_roofline")
                cells = [
                    f"{r['tokens_per_s']:,.1f}",
                    f"{pct:.1f}%" if pct is not None else "",
                    f"{r['achieved_bytes_per_s'] / 1e9:,.0f}",
                ]
            lines.append(f"| {d.get('gpu') or 'cpu'} | {r['model']} | {r['impl']} | {r['batch']} | "
                         + " | ".join(cells) + f" | [{Path(d['path']).name}]({d['path']}) |")
    prefill = [(d, r) for d in docs if d.get("kind") == "prefill" for r in d["results"]]
    if prefill:
        lines += ["", "| GPU | model | implementation | prompt tokens | prefill ms | file |",
                  "| --- | --- | --- | ---: | ---: | --- |"]
        for d, r in prefill:
            ms = "failed" if r.get("error") else f"{r['ms']:,.2f}"
            lines.append(f"| {d.get('gpu') or 'cpu'} | {r['model']} | {r['impl']} | {r['tokens']} | {ms} | "
                         f"[{Path(d['path']).name}]({d['path']}) |")
    return "\n".join(lines)


README_BEGIN = "<!-- results:begin (python -m labkit bench table --readme README.md) -->"
README_END = "<!-- results:end -->"


def update_readme(readme: Path, docs: list[dict]) -> None:
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} has no results markers ({README_BEGIN} ... {README_END})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{markdown_table(docs)}\n{README_END}{tail}")


# -- command line --------------------------------------------------------------------------------
def _models(names: list[str], device: str, dtype: torch.dtype) -> list[HybridLM]:
    for n in names:
        if n not in PRESETS:
            raise SystemExit(f"unknown preset {n!r}; presets: {', '.join(PRESETS)}")
    return [build(n, dtype=dtype, device=device, seed=0) for n in names]


def _print_rows(rows: list) -> None:
    for r in rows:
        if r.error:
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} FAILED {r.error}")
        elif isinstance(r, DecodeResult):
            pct = f"{r.pct_of_roofline:5.1f}% of roofline" if r.pct_of_roofline is not None else ""
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} {r.tokens_per_s:10.1f} tok/s "
                  f"{r.step_ms:8.3f} ms/step {r.achieved_bytes_per_s / 1e9:8.1f} GB/s {pct}")
        else:
            print(f"{r.model:>14} {r.impl:>22} B={r.batch:<3} T={r.tokens:<5} {r.ms:10.2f} ms")


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="labkit bench")
    sub = p.add_subparsers(dest="what", required=True)
    for what in ("decode", "prefill"):
        s = sub.add_parser(what)
        s.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"])
        s.add_argument("--impls", nargs="+", default=["reference", "transformers"],
                       help=f"labkit backends and/or peers {PEERS}")
        s.add_argument("--batch", nargs="+", type=int, default=[1, 16] if what == "decode" else [1])
        s.add_argument("--repeats", type=int, default=5)
        s.add_argument("--device", default="auto")
        s.add_argument("--name", required=True, help="results go to data/bench/<gpu>/<name>.json")
        s.add_argument("--data-dir", type=Path, default=DATA_DIR)
        if what == "decode":
            s.add_argument("--prompt", type=int, default=128)
            s.add_argument("--new-tokens", type=int, default=128)
        else:
            s.add_argument("--lengths", nargs="+", type=int, default=[512, 4096])
    sub.add_parser("hw")
    t = sub.add_parser("table")
    t.add_argument("--readme", type=Path, help="rewrite the results section of this README")
    t.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)

    if not torch.cuda.is_available():  # Triton kernels can only run in its interpreter here
        from .notebooks import cpu_environment

        cpu_environment()
    if args.what == "table":
        docs = load_results(args.data_dir)
        if args.readme:
            update_readme(args.readme, docs)
        print(markdown_table(docs))
        return 0
    device = ("cuda" if torch.cuda.is_available() else "cpu") if getattr(args, "device", "auto") == "auto" else args.device
    facts = device_facts(device)
    print(f"{facts.name}: copy {facts.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 matmul {facts.bf16_flops / 1e12:.0f} TFLOP/s")
    if args.what == "hw":
        return 0
    if args.impls and any(i.startswith("fused") for i in args.impls):
        import labkit.fused  # noqa: F401  (registers the fused backends)
    rows: list = []
    for model in _models(args.models, device, torch.bfloat16):
        for b in args.batch:
            for impl in args.impls:
                if args.what == "decode":
                    rows.append(time_decode(model, impl, b, args.prompt, args.new_tokens, args.repeats, facts=facts))
                else:
                    for n in args.lengths:
                        rows.append(time_prefill(model, impl, n, b, args.repeats))
                _print_rows(rows[-1:] if args.what == "decode" else rows[-len(args.lengths):])
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    path = write_results(args.name, args.what, rows, facts, data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0
