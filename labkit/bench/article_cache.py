"""``python -m labkit bench article-cache``: what the article's two-level cache saves and what it costs.

Two measurements per threshold (see labkit.lab.article_cache for the cache and how work is counted):

- quality, on the shipped byte-level checkpoints (trained weights, float32): the held-out windows
  kept in each checkpoint's training record are decoded token by token, teacher-forced, once on
  the exact path and once with the article's cache. Per threshold: the counted share of the work
  skipped, the logits' error against the exact path (relative RMS over every decoded logit, and the
  largest absolute difference), top-1 agreement at each position, held-out loss in bits per byte
  (of the decoded positions, both paths), and free-running greedy decoding from the windows'
  prompts: the fraction of positions whose token matches the exact path's, and the first mismatch.
- speed, at the real presets' shapes with RANDOM weights (bf16, batch 1): decode tokens/s of the
  reference path with and without the cache, and the share skipped there.

The quality measurement also runs on "repeated" text, each window's first ``--period`` tokens tiled
(default one byte repeated): the article credits its saving to "stable contexts", and this is the
most stable one there is, the article's best case. Random weights give
  their own gate statistics, so this column says what the skipping buys in time, not how often a
  trained model would skip.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..lab.article_cache import DEFAULT_EMA_RATE, DEFAULT_THRESHOLD, GDN_SKIP_BOUND, KINDS, ArticleCache
from ..model import HybridLM

THRESHOLDS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
CHECKPOINTS = ("byte-lfm2-6m", "byte-qwen3.5-6m")
ARTICLE_CLAIM = 0.60  # "-60% compute for stable contexts"
FREE_BPB_INCREASE = 0.01  # what we call "no loss": held-out bits per byte up by less than 1%
PRESETS = ("lfm2-350m", "qwen3.5-0.8b")


@dataclass
class ArticleCacheRow:
    model: str
    measure: str  # "quality" (trained checkpoint) or "speed" (real shapes, random weights)
    context: str  # the text decoded: "held-out" windows, or "repeated" (each window's first bytes tiled)
    weights: str
    dtype: str
    threshold: float
    ema_rate: float
    kinds: list  # the layer kinds whose cores the cache approximates
    batch: int
    prompt: int  # tokens prefilled exactly before the decoded ones
    steps: int  # decode steps measured
    reuse_fraction: dict  # per layer kind: (step, sequence) decisions that returned level 2
    skipped_of_core: dict  # per layer kind and "all": counted FLOPs skipped / the exact cores' FLOPs
    skipped_of_mixer: float  # ... / (cores + the wrapped mixers' projections)
    skipped_of_step: float  # ... / the whole decode step's FLOPs
    identical_to_exact: bool | None = None  # logits bit for bit equal to the exact path's
    logit_rel_rms: float | None = None
    logit_max_abs: float | None = None
    top1_agreement: float | None = None
    bits_per_byte: float | None = None
    bits_per_byte_exact: float | None = None
    greedy_steps: int | None = None
    greedy_agreement: float | None = None
    greedy_first_mismatch: int | None = None  # earliest step any sequence differs (None: none did)
    tokens_per_s: float | None = None
    tokens_per_s_exact: float | None = None
    error: str | None = None


def _stats_fields(ac: ArticleCache) -> dict:
    s = ac.stats()
    return {
        "reuse_fraction": {k: v["reuse_fraction"] for k, v in s["by_kind"].items()},
        "skipped_of_core": {**{k: v["skipped_of_core"] for k, v in s["by_kind"].items()}, "all": s["all"]["skipped_of_core"]},
        "skipped_of_mixer": s["all"]["skipped_of_mixer"],
        "skipped_of_step": s["all"]["skipped_of_step"],
    }


@torch.no_grad()
def _teacher_forced(step, model: HybridLM, windows: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits [B, L - prompt, V] for positions prompt-1 .. L-2 of ``windows`` [B, L], decoded one token
    at a time after an exact prefill of the first ``prompt`` tokens; ``step(ids, cache)`` runs one call."""
    B, L = windows.shape
    cache = model.new_cache(B, L)
    first = step(windows[:, :prompt], cache)[:, -1:]
    rest = [step(windows[:, t : t + 1], cache) for t in range(prompt, L - 1)]
    return torch.cat([first, *rest], dim=1).float()


@torch.no_grad()
def _greedy(step, model: HybridLM, prompts: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy tokens [B, steps] after ``prompts`` [B, P]."""
    B, P = prompts.shape
    cache = model.new_cache(B, P + steps)
    nxt = step(prompts, cache)[:, -1].argmax(-1, keepdim=True)
    out = [nxt]
    for _ in range(steps - 1):
        nxt = step(nxt, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
    return torch.cat(out, dim=1)


def quality_rows(model: HybridLM, name: str, windows: torch.Tensor, thresholds=THRESHOLDS, ema_rate: float = DEFAULT_EMA_RATE,
                 prompt: int = 16, greedy_steps: int = 64, kinds=KINDS, context: str = "held-out") -> list[ArticleCacheRow]:
    """Rows of the quality measurement for one model over held-out ``windows`` [B, L] (see the module doc)."""
    windows = windows.to(model.device)
    B, L = windows.shape
    if not 1 <= prompt < L - 1:
        raise ValueError(f"prompt must leave tokens to decode: 1 <= prompt < {L - 1}, got {prompt}")
    exact_step = lambda ids, cache: model(ids, cache=cache)  # noqa: E731
    exact = _teacher_forced(exact_step, model, windows, prompt)
    targets = windows[:, prompt:]
    ln2 = math.log(2)
    bpb_exact = F.cross_entropy(exact.flatten(0, 1), targets.flatten()).item() / ln2
    greedy_exact = _greedy(exact_step, model, windows[:, :prompt], greedy_steps)
    rows = []
    for thr in thresholds:
        ac = ArticleCache(model, threshold=thr, ema_rate=ema_rate, kinds=kinds)
        got = _teacher_forced(ac, model, windows, prompt)
        fields = _stats_fields(ac)  # the teacher-forced run's counts
        ac.reset()
        greedy = _greedy(ac, model, windows[:, :prompt], greedy_steps)
        diff = got - exact
        same = (greedy == greedy_exact)
        mismatched_steps = (~same).any(0).nonzero()
        rows.append(ArticleCacheRow(
            model=name, measure="quality", context=context, weights="trained checkpoint", dtype=str(model.dtype).removeprefix("torch."),
            threshold=thr, ema_rate=ema_rate, kinds=list(kinds), batch=B, prompt=prompt, steps=L - 1 - prompt, **fields,
            identical_to_exact=bool(torch.equal(got, exact)),
            logit_rel_rms=(diff.pow(2).sum() / exact.pow(2).sum()).sqrt().item(),
            logit_max_abs=diff.abs().max().item(),
            top1_agreement=(got.argmax(-1) == exact.argmax(-1)).float().mean().item(),
            bits_per_byte=F.cross_entropy(got.flatten(0, 1), targets.flatten()).item() / ln2,
            bits_per_byte_exact=bpb_exact,
            greedy_steps=greedy_steps, greedy_agreement=same.float().mean().item(),
            greedy_first_mismatch=int(mismatched_steps[0]) if mismatched_steps.numel() else None,
        ))
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def _decode_rate(step, model: HybridLM, prompt_ids: torch.Tensor, steps: int) -> float:
    """Greedy decode tokens/s (batch x steps / seconds) after an untimed prefill."""
    B, P = prompt_ids.shape
    cache = model.new_cache(B, P + steps + 3)
    nxt = step(prompt_ids, cache)[:, -1].argmax(-1, keepdim=True)
    for _ in range(2):  # warm-up steps, untimed (first-call allocations)
        nxt = step(nxt, cache)[:, -1].argmax(-1, keepdim=True)
    _sync(model.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = step(nxt, cache)[:, -1].argmax(-1, keepdim=True)
    _sync(model.device)
    return B * steps / (time.perf_counter() - t0)


def speed_rows(model: HybridLM, name: str, thresholds=THRESHOLDS, ema_rate: float = DEFAULT_EMA_RATE,
               prompt: int = 256, steps: int = 32, batch: int = 1, seed: int = 0, kinds=KINDS) -> list[ArticleCacheRow]:
    """Decode tokens/s of the reference path with and without the article's cache (random prompt)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, prompt), generator=gen).to(model.device)
    exact_step = lambda i, c: model(i, cache=c)  # noqa: E731
    _decode_rate(exact_step, model, ids, steps)  # warm-up of the whole measurement (round A: a cold first run was 3.6x slow)
    exact = _decode_rate(exact_step, model, ids, steps)
    rows = []
    for thr in thresholds:
        ac = ArticleCache(model, threshold=thr, ema_rate=ema_rate, kinds=kinds)
        rate = _decode_rate(ac, model, ids, steps)
        rows.append(ArticleCacheRow(
            model=name, measure="speed", context="random tokens", weights="random (seed 0)", dtype=str(model.dtype).removeprefix("torch."),
            threshold=thr, ema_rate=ema_rate, kinds=list(kinds), batch=batch, prompt=prompt, steps=steps, **_stats_fields(ac),
            tokens_per_s=rate, tokens_per_s_exact=exact,
        ))
    again = _decode_rate(exact_step, model, ids, steps)  # the exact path once more, after the others
    for r in rows:
        r.tokens_per_s_exact = max(exact, again)
    return rows


def heldout_windows(checkpoint: str, n: int, tokens: int) -> torch.Tensor:
    """``n`` held-out windows of ``tokens`` tokens: the windows kept in a shipped checkpoint's training
    record, each cut into consecutive pieces of ``tokens`` (a decode step costs about the same at any
    small batch, so more, shorter windows measure more text in the same time)."""
    from ..shipped import checkpoint_path
    from ..train import unpack_windows

    record = json.loads((checkpoint_path(checkpoint) / "training.json").read_text())
    w = unpack_windows(record["check"]["windows"])
    if not 2 <= tokens <= w.shape[1]:
        raise ValueError(f"{checkpoint} keeps windows of {w.shape[1]} tokens; asked for pieces of {tokens}")
    per = w.shape[1] // tokens
    pieces = w[:, : per * tokens].reshape(-1, tokens)
    if not 1 <= n <= pieces.shape[0]:
        raise ValueError(f"{checkpoint} gives {pieces.shape[0]} windows of {tokens} tokens; asked for {n}")
    return pieces[:n]


def repeated_windows(windows: torch.Tensor, period: int) -> torch.Tensor:
    """Each window's first ``period`` tokens tiled to its length: the most "stable context" text can
    give (the article credits its saving to stable contexts)."""
    if not 1 <= period <= windows.shape[1]:
        raise ValueError(f"period must be in [1, {windows.shape[1]}], got {period}")
    reps = -(-windows.shape[1] // period)
    return windows[:, :period].repeat(1, reps)[:, : windows.shape[1]]


def run(args) -> list[ArticleCacheRow]:
    from .. import load
    from ..shipped import checkpoint_path
    from ..model import build

    device = torch.device(args.device)
    rows: list[ArticleCacheRow] = []
    t0 = time.perf_counter()
    for ck in args.checkpoints:
        model = load(checkpoint_path(ck), dtype=torch.float32, device=device)
        held = heldout_windows(ck, args.windows, args.tokens)
        for context in args.contexts:
            windows = held if context == "held-out" else repeated_windows(held, args.period)
            rows += quality_rows(model, ck, windows, args.thresholds, args.ema_rate, args.prompt, args.greedy_steps,
                                 args.kinds, context=context)
            print_rows(rows[-len(args.thresholds):])
            print(f"  ({time.perf_counter() - t0:.1f} s so far)", flush=True)
    for preset in args.presets:
        model = build(preset, dtype=torch.bfloat16, device=device, seed=0)
        rows += speed_rows(model, preset, args.thresholds, args.ema_rate, args.speed_prompt, args.speed_steps, kinds=args.kinds)
        print_rows(rows[-len(args.thresholds):])
        print(f"  ({time.perf_counter() - t0:.1f} s so far)", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_rows(rows: list[ArticleCacheRow]) -> None:
    for r in rows:
        core = " ".join(f"{k} {v:6.1%}" for k, v in r.skipped_of_core.items())
        line = f"{r.model:>16} {r.context:>13} thr {r.threshold:5.2f} skipped of core: {core}; of step {r.skipped_of_step:6.2%}"
        if r.measure == "quality":
            line += (f" | rel RMS {r.logit_rel_rms:.2e} max {r.logit_max_abs:.2e} top-1 {r.top1_agreement:6.1%}"
                     f" bpb {r.bits_per_byte:.4f} (exact {r.bits_per_byte_exact:.4f}) greedy {r.greedy_agreement:6.1%}")
        else:
            line += f" | {r.tokens_per_s:8.1f} tok/s (exact {r.tokens_per_s_exact:8.1f})"
        print(line)


def add_arguments(s) -> None:
    s.add_argument("--checkpoints", nargs="*", default=list(CHECKPOINTS), help="shipped checkpoints (quality)")
    s.add_argument("--presets", nargs="*", default=list(PRESETS), help="real shapes, random weights (speed)")
    s.add_argument("--thresholds", nargs="+", type=float, default=list(THRESHOLDS))
    s.add_argument("--ema-rate", type=float, default=DEFAULT_EMA_RATE)
    s.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="layer kinds the cache approximates")
    s.add_argument("--windows", type=int, default=64, help="held-out windows decoded at once (the batch)")
    s.add_argument("--tokens", type=int, default=65, help="tokens per window (pieces of the records' 16 x 513)")
    s.add_argument("--prompt", type=int, default=16, help="tokens prefilled exactly before decoding")
    s.add_argument("--contexts", nargs="+", choices=("held-out", "repeated"), default=["held-out", "repeated"],
                   help="decode the held-out windows and/or each window's first --period tokens tiled")
    s.add_argument("--period", type=int, default=1, help="tokens tiled in the 'repeated' context (1: one byte "
                   "repeated, the most stable context there is; 32, a line of code, changed nothing on a CPU run)")
    s.add_argument("--greedy-steps", type=int, default=24)
    s.add_argument("--speed-prompt", type=int, default=512)
    s.add_argument("--speed-steps", type=int, default=16)
    s.add_argument("--device", default="auto")
    s.add_argument("--name", default="article-cache", help="results go to data/bench/<gpu>/<name>.json")


def load_results(path: str | Path | None = None, gpu: str = "nvidia-h200") -> dict:
    """The results file (default ``data/bench/<gpu>/article-cache.json``) as a dict."""
    from .results import results_dir

    path = Path(path) if path is not None else results_dir() / gpu / "article-cache.json"
    return json.loads(path.read_text())


def command_line(argv: list[str]) -> str:
    return shlex.join(["python", "-m", "labkit", "bench", *argv])


def verdict(doc: dict, claim: float = ARTICLE_CLAIM, article_threshold: float = DEFAULT_THRESHOLD,
            free_bpb_increase: float = FREE_BPB_INCREASE) -> dict:
    """The figures the verdict on the article's "-60% compute" rests on, per trained checkpoint.

    For each quality model: the skipped share of the cores and of the whole step at the article's
    threshold, with its cost; the smallest threshold that skips ``claim`` of the cores (None if
    none does) with its cost; the largest GDN skip seen (against GDN_SKIP_BOUND); and ``holds``:
    the claim is met at the article's threshold with held-out bits per byte up by less than
    ``free_bpb_increase`` (relative). For each speed model: tok/s relative to the exact path.
    """
    rows = [r for r in doc["results"] if not r.get("error")]
    out: dict = {"claim": claim, "article_threshold": article_threshold, "free_bpb_increase": free_bpb_increase,
                 "gdn_skip_bound": GDN_SKIP_BOUND, "quality": {}, "speed": {}}

    def cost(r: dict) -> dict:
        return {"threshold": r["threshold"], "skipped_of_core": r["skipped_of_core"]["all"],
                "skipped_of_step": r["skipped_of_step"], "reuse_fraction": r["reuse_fraction"],
                "bpb_increase": r["bits_per_byte"] / r["bits_per_byte_exact"] - 1,
                "logit_rel_rms": r["logit_rel_rms"], "top1_agreement": r["top1_agreement"],
                "greedy_agreement": r["greedy_agreement"]}

    def key(r: dict) -> str:
        return r["model"] if r.get("context", "held-out") == "held-out" else f"{r['model']}, {r['context']} text"

    for m in sorted({key(r) for r in rows if r["measure"] == "quality"}):
        rs = sorted((r for r in rows if r["measure"] == "quality" and key(r) == m), key=lambda r: r["threshold"])
        at = next((cost(r) for r in rs if r["threshold"] == article_threshold), None)
        reach = next((cost(r) for r in rs if r["skipped_of_core"]["all"] >= claim), None)
        gdn = [r["skipped_of_core"]["gdn"] for r in rs if "gdn" in r["skipped_of_core"]]
        out["quality"][m] = {
            "at_article_threshold": at, "first_reaching_claim": reach,
            "max_skipped_of_core": max(r["skipped_of_core"]["all"] for r in rs),
            "max_gdn_skipped_of_core": max(gdn) if gdn else None,
            "exact_at_zero": all(r["identical_to_exact"] for r in rs if r["threshold"] == 0),
            "holds": bool(at and at["skipped_of_core"] >= claim and at["bpb_increase"] < free_bpb_increase),
        }
    for m in sorted({r["model"] for r in rows if r["measure"] == "speed"}):
        rs = sorted((r for r in rows if r["measure"] == "speed" and r["model"] == m), key=lambda r: r["threshold"])
        out["speed"][m] = {"ratio": {r["threshold"]: r["tokens_per_s"] / r["tokens_per_s_exact"] for r in rs},
                           "tokens_per_s_exact": rs[0]["tokens_per_s_exact"],
                           "skipped_of_step": {r["threshold"]: r["skipped_of_step"] for r in rs}}
    return out


def verdict_markdown(doc: dict, **kw) -> str:
    """The verdict as Markdown, every figure taken from ``doc`` (a results file of this bench)."""
    v = verdict(doc, **kw)
    claim, thr = v["claim"], v["article_threshold"]
    lines = [f"**The article's claim:** the two-level cache skips {claim:.0%} of the compute for stable contexts "
             f"(threshold {thr:g}). Measured on {doc.get('gpu') or 'a CPU'} (`{doc.get('command', '')}`):", ""]
    for m, q in v["quality"].items():
        at, reach = q["at_article_threshold"], q["first_reaching_claim"]
        s = f"- **{m}**: "
        if at:
            s += (f"at threshold {thr:g} it skips {at['skipped_of_core']:.1%} of the cores' work "
                  f"({at['skipped_of_step']:.2%} of the whole step), held-out bits per byte {at['bpb_increase']:+.2%}, "
                  f"greedy tokens agreeing {at['greedy_agreement']:.1%}. ")
        if reach:
            s += (f"{claim:.0%} of the cores is first skipped at threshold {reach['threshold']:g}, costing "
                  f"{reach['bpb_increase']:+.2%} bits per byte and leaving {reach['greedy_agreement']:.1%} of greedy tokens "
                  f"as the exact path's. ")
        else:
            s += f"No threshold skips {claim:.0%} of the cores (at most {q['max_skipped_of_core']:.1%}). "
        if q["max_gdn_skipped_of_core"] is not None:
            s += (f"Its GDN layers skip at most {q['max_gdn_skipped_of_core']:.1%}, under the bound "
                  f"{v['gdn_skip_bound']:.1%} (only readouts can be skipped while every token reaches the state). ")
        s += "Threshold 0 reproduces the exact logits bit for bit." if q["exact_at_zero"] else "THRESHOLD 0 DIFFERS FROM THE EXACT PATH."
        lines.append(s)
    for m, sp in v["speed"].items():
        r = sp["ratio"]
        best = max(r, key=r.get)
        lines.append(f"- **{m}** (real shapes, random weights, reference decode, batch 1): exact "
                     f"{sp['tokens_per_s_exact']:,.1f} tok/s; with the cache {r.get(thr, float('nan')):.2f}x at threshold "
                     f"{thr:g}, best {r[best]:.2f}x at threshold {best:g} (skipping {sp['skipped_of_step'][best]:.2%} "
                     "of the step's FLOPs).")
    held = [m for m, q in v["quality"].items() if q["holds"]]
    lines += ["", f"**Verdict:** the claim {'holds for ' + ', '.join(held) if held else 'does not hold for any checkpoint and text measured'} "
              f"by our test (at least {claim:.0%} of the cores skipped at threshold {thr:g} with held-out bits per byte "
              f"up by less than {v['free_bpb_increase']:.0%})."]
    return "\n".join(lines)
