"""The closing ladder (notebook 08 and the README's last section): every rung of
:data:`labkit.lab.ladder.RUNGS` for both models at batch 1 and 16, read from ``ladder.json`` only,
beside the article's own ladder, and what is left between the best rung and the roofline.

``python -m labkit ladder-table --readme README.md`` rewrites the README's block between
:data:`README_BEGIN` and :data:`README_END` from the same rows.
"""

from __future__ import annotations

from pathlib import Path

from . import ladder
from .article_claims import ARTICLE_GPUS, ARTICLE_LADDER, ARTICLE_TARGET_PCT

MODELS = ("lfm2-350m", "qwen3.5-0.8b")
NAMES = {"lfm2-350m": "LFM2-350M", "qwen3.5-0.8b": "Qwen3.5-0.8B"}
BATCHES = (1, 16)
README_BEGIN = "<!-- ladder:begin (python -m labkit ladder-table --readme README.md) -->"
README_END = "<!-- ladder:end -->"


def ladder_rows(gpu: str = "nvidia-h200") -> list[dict]:
    """The ladder's rows for :data:`MODELS` at :data:`BATCHES`, in rung order; a rung that holds no
    figure on this GPU (absent, failed) keeps its row with ``tokens_per_s`` None and ``why``."""
    out = []
    for r in ladder.rows(gpu):
        if r["model"] not in MODELS or r["batch"] not in BATCHES:
            continue
        try:
            out.append({**ladder.figure(r["model"], r["rung"], r["batch"], gpu), "why": None})
        except ladder.LadderMissing as exc:
            out.append({**r, "tokens_per_s": None, "pct_of_roofline": None, "why": str(exc)})
    if not any(r["tokens_per_s"] for r in out):
        raise ladder.LadderMissing(f"the {gpu} ladder holds no figure for {MODELS} at batches {BATCHES}; "
                                   f"run `{ladder.LADDER_COMMAND}`")
    return out


def best(rows: list[dict], model: str, batch: int) -> dict:
    """The fastest rung of ``model`` at ``batch``."""
    have = [r for r in rows if (r["model"], r["batch"]) == (model, batch) and r["tokens_per_s"]]
    if not have:
        raise ladder.LadderMissing(f"no rung of {model} at batch {batch} has a figure; run `{ladder.LADDER_COMMAND}`")
    return max(have, key=lambda r: r["tokens_per_s"])


def markdown_table(rows: list[dict], link_prefix: str = "") -> str:
    """One row per (model, rung, batch): tok/s, % of roofline, the roofline, the file."""
    lines = ["| model | rung | batch | tok/s | % of roofline | roofline tok/s | file |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(rows, key=lambda r: (r["batch"], MODELS.index(r["model"]), ladder.RUNGS.index(r["rung"]))):
        link = f"[{Path(r['file']).name}]({link_prefix}{r['file']})"
        if r["tokens_per_s"] is None:
            lines.append(f"| {NAMES[r['model']]} | {r['rung']} | {r['batch']} | — | — | — | {link} (no figure: "
                         f"{r['why'].split(': ')[-1]}) |")
        else:
            lines.append(f"| {NAMES[r['model']]} | {r['rung']} | {r['batch']} | {r['tokens_per_s']:,.1f} | "
                         f"{r['pct_of_roofline']:.1f}% | {r['roofline_tokens_per_s']:,.0f} | {link} |")
    return "\n".join(lines)


def article_line() -> str:
    """The article's ladder as it reports it (its GPUs, its model and setting)."""
    return " → ".join(f"{tps} ({stage})" for stage, tps in ARTICLE_LADDER) + f" tok/s on {ARTICLE_GPUS}"


def what_is_left(rows: list[dict], gpu: str = "nvidia-h200") -> list[dict]:
    """Per model and batch: the best rung, its step against the roofline's step (what the bytes
    alone would take), the time above it per step, that time in fixed costs per kernel, and the
    tokens/s still missing to the article's target (:data:`ARTICLE_TARGET_PCT` of roofline)."""
    fixed = ladder.fixed_cost_per_kernel(gpu)
    out = []
    for model in MODELS:
        for batch in BATCHES:
            b = best(rows, model, batch)
            roof_step_us = batch / b["roofline_tokens_per_s"] * 1e6
            above_us = b["step_ms"] * 1e3 - roof_step_us
            target = ARTICLE_TARGET_PCT / 100 * b["roofline_tokens_per_s"]
            out.append({"model": model, "batch": batch, "rung": b["rung"], "tokens_per_s": b["tokens_per_s"],
                        "pct_of_roofline": b["pct_of_roofline"], "step_us": b["step_ms"] * 1e3,
                        "roofline_step_us": roof_step_us, "above_roofline_us": above_us,
                        "fixed_costs": above_us / fixed["us"], "target_tokens_per_s": target,
                        "to_target_tokens_per_s": max(0.0, target - b["tokens_per_s"])})
    return out


def plot_batch(rows: list[dict], batch: int, title: str | None = None):
    """One figure for ``batch``: a panel per model (our rungs, measured, with the roofline as a line)
    and a last panel with the article's ladder as it reports it, hatched and labelled as not ours.
    One log axis for all panels (the ladder spans decades), every value printed beside its bar."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MODELS) + 1, figsize=(12, 4.6),
                             gridspec_kw={"width_ratios": [1] * len(MODELS) + [0.8]})
    mine = {m: sorted((r for r in rows if (r["model"], r["batch"]) == (m, batch)),
                      key=lambda r: ladder.RUNGS.index(r["rung"])) for m in MODELS}
    measured = [r for rs in mine.values() for r in rs if r["tokens_per_s"]]
    article = [t for _, t in ARTICLE_LADDER]
    lo = min([r["tokens_per_s"] for r in measured] + article) / 2
    hi = max(r["roofline_tokens_per_s"] for r in measured) * 12  # room for the printed values

    def panel(ax, labels, values, texts, name):
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        for yi, (v, text) in enumerate(zip(values, texts)):
            ax.text((v or lo) * 1.15, yi, text, va="center", fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("tokens/s (log scale)")
        ax.set_title(name, fontsize=10)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=8, frameon=False)

    for ax, model in zip(axes, MODELS):
        rs = mine[model]
        values = [r["tokens_per_s"] for r in rs]
        ax.barh(range(len(rs)), [v or 0 for v in values], color="tab:blue", label="measured, one H200")
        roof = max(r["roofline_tokens_per_s"] for r in rs if r["tokens_per_s"])
        ax.axvline(roof, color="tab:red", linestyle="--", label=f"roofline {roof:,.0f} tok/s")
        texts = [f"{r['tokens_per_s']:,.0f} ({r['pct_of_roofline']:.1f}%)" if r["tokens_per_s"] else "no figure" for r in rs]
        panel(ax, [r["rung"] for r in rs], values, texts, f"{NAMES[model]}, batch {batch}")
    ax = axes[-1]
    ax.barh(range(len(article)), article, color="none", edgecolor="tab:gray", hatch="//",
            label="reported by the article, not measured here")
    panel(ax, [s for s, _ in ARTICLE_LADDER], article, [f"{t}" for t in article], f"the article, {ARTICLE_GPUS}")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def update_readme(readme: Path, gpu: str = "nvidia-h200") -> None:
    """Rewrite the README's ladder block from ``ladder.json`` (nothing else in the file changes)."""
    text = readme.read_text(encoding="utf-8")
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} has no ladder markers ({README_BEGIN} ... {README_END})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{markdown_table(ladder_rows(gpu))}\n{README_END}{tail}", encoding="utf-8")


# the rung of ours that does what each stage of the article did (None: no decode rung does it;
# its "adaptive KV cache" shortens prefill, notebook 03)
NEAREST_RUNG = {"baseline": "reference", "fusion": "fused", "adaptive KV cache": None,
                "TMA + async": "fused+graph+pdl", "B200-specific tuning": "tuned"}


def stage_table(rows: list[dict], model: str = "lfm2-350m", batch: int = 1) -> str:
    """The article's stages beside our nearest rungs: each side's tokens/s and gain over its own
    previous stage (ours over the rung of the last stage that has one, the rungs between named)."""
    have = {r["rung"]: r for r in rows if (r["model"], r["batch"]) == (model, batch) and r["tokens_per_s"]}
    prompt = {(r["prompt"], r["new_tokens"]) for r in have.values()}
    lines = [f"{NAMES[model]}, batch {batch}; ours: one H200, prompt / new tokens "
             + ", ".join(f"{p} / {n}" for p, n in sorted(prompt)) + f"; the article: {ARTICLE_GPUS}, its own setting.", "",
             "| the article's stage | its tok/s | its gain | our nearest rung | our tok/s | our gain | our rungs in between (ladder order) |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    last_tps, last_rung = None, None
    for stage, tps in ARTICLE_LADDER:
        gain = f"{tps / last_tps:.2f}x" if last_tps else "—"
        rung = NEAREST_RUNG[stage]
        if rung is None or rung not in have:
            why = "none: it changes prefill, not the step" if rung is None else "no figure in this run"
            lines.append(f"| {stage} | {tps} | {gain} | {why} | — | — | — |")
        else:
            ours = have[rung]["tokens_per_s"]
            if rung == "tuned":  # the same kernels as fused+graph+pdl, with the GPU's tuning file
                last_rung = ladder.TUNED_IMPL if ladder.TUNED_IMPL in have else last_rung
            if last_rung:
                lo, hi = ladder.RUNGS.index(last_rung), ladder.RUNGS.index(rung)
                between = ("— (the same kernels, tuned)" if rung == "tuned"
                           else ", ".join(f"`{r}`" for r in ladder.RUNGS[lo + 1:hi]) or "—")
                ours_gain = f"{ours / have[last_rung]['tokens_per_s']:.2f}x"
            else:
                between, ours_gain = "—", "—"
            lines.append(f"| {stage} | {tps} | {gain} | `{rung}` | {ours:,.0f} | {ours_gain} | {between} |")
            last_rung = rung
        last_tps = tps
    return "\n".join(lines)


def target_table(left: list[dict]) -> str:
    """The best rung per model and batch against :data:`ARTICLE_TARGET_PCT` of roofline."""
    lines = [f"| model | batch | best rung | tok/s | % of roofline | target ({ARTICLE_TARGET_PCT}%) tok/s | still missing |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in left:
        missing = f"{r['to_target_tokens_per_s']:,.0f} tok/s" if r["to_target_tokens_per_s"] else "none: met"
        lines.append(f"| {NAMES[r['model']]} | {r['batch']} | `{r['rung']}` | {r['tokens_per_s']:,.0f} | "
                     f"{r['pct_of_roofline']:.1f}% | {r['target_tokens_per_s']:,.0f} | {missing} |")
    return "\n".join(lines)


def left_table(left: list[dict], fixed: dict) -> str:
    """The time above the roofline per step, and that time in fixed costs per kernel."""
    lines = [f"Fixed cost per kernel: **{fixed['us']:.2f} µs**, {fixed['what']}.", "",
             "| model | batch | best rung | step µs | at the roofline µs | above it µs | in fixed costs per kernel |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in left:
        lines.append(f"| {NAMES[r['model']]} | {r['batch']} | `{r['rung']}` | {r['step_us']:,.1f} | "
                     f"{r['roofline_step_us']:,.1f} | {r['above_roofline_us']:,.1f} | {r['fixed_costs']:,.0f} |")
    return "\n".join(lines)


def batch16_prediction(rows: list[dict], model: str = "lfm2-350m", rung: str = "fused+graph+pdl") -> dict:
    """The exercise's answer: % of roofline at batch 16 if the step took as long as at batch 1,
    = 100 * 16 tokens / (batch-1 step) / (batch-16 roofline tok/s); with the measured figure."""
    one = next(r for r in rows if (r["model"], r["rung"], r["batch"]) == (model, rung, 1))
    many = next(r for r in rows if (r["model"], r["rung"], r["batch"]) == (model, rung, 16))
    predicted = 100 * 16 / (one["step_ms"] * 1e-3) / many["roofline_tokens_per_s"]
    return {"predicted_pct": predicted, "measured_pct": many["pct_of_roofline"], "batch1_pct": one["pct_of_roofline"],
            "step1_ms": one["step_ms"], "step16_ms": many["step_ms"], "roofline16": many["roofline_tokens_per_s"]}


def check_batch16_prediction(rows: list[dict], mine: float | None, tolerance_pct: float = 1.0) -> str:
    """Markdown: whether ``mine`` matches the exercise's answer (within ``tolerance_pct`` points),
    then the answer and its reading, collapsed in a <details> block."""
    a = batch16_prediction(rows)
    if mine is None:
        verdict = "Put your prediction in `my_prediction_pct` above and run this cell again."
    elif abs(mine - a["predicted_pct"]) <= tolerance_pct:
        verdict = f"**Right**: {mine:.1f}% is within {tolerance_pct:g} point of the model's figure."
    else:
        verdict = f"**Not yet**: {mine:.1f}% is more than {tolerance_pct:g} point away. Look again at what the roofline counts."
    slower = a["step16_ms"] / a["step1_ms"]
    answer = (f"If the step took {a['step1_ms'] * 1e3:,.1f} µs at batch 16 as at batch 1, batch 16 would produce "
              f"16 / {a['step1_ms'] * 1e3:,.1f} µs = {16 / (a['step1_ms'] * 1e-3):,.0f} tok/s, "
              f"**{a['predicted_pct']:.1f}%** of its roofline of {a['roofline16']:,.0f} tok/s: almost batch 1's own "
              f"{a['batch1_pct']:.1f}%, since the bytes per step hardly change. Measured: **{a['measured_pct']:.1f}%**, "
              f"because the batch-16 step takes {slower:.2f}x the batch-1 step: its kernels do sixteen rows of work per "
              "weight tile, with the heuristic blockings (notebook 06 tunes them for each batch).")
    return f"{verdict}\n\n<details><summary>Answer</summary>\n\n{answer}\n\n</details>"
