"""What chapter 03 reads and draws about the exact prefix cache: the committed H200 runs of
``python -m labkit bench cache``, the breakdown of one hit's time, the cost of a cache that misses,
and the chapter's figures (one comparison per panel, linear axes, labels a reader can read).

Everything here reads results rows (dicts, as written by :mod:`labkit.bench.cache`) and profile
files; nothing times anything.
"""

from __future__ import annotations

import math
import statistics

import matplotlib.pyplot as plt

POLICY_COLOURS = {"lru": "#2e86c1", "flops": "#f0ad4e", "flops+ends": "#27ae60", "lru+ends": "#8e44ad"}


def committed_cache_results(gpu: str = "nvidia-h200") -> dict | None:
    """Rows of every committed ``prefix-cache*.json`` of ``gpu`` but the notebook's own, with one
    ``"<file>: <command>"`` line per source; None when none is committed."""
    from ..bench.results import results_dir
    from .notebooks import committed_results

    names = sorted(p.stem for p in (results_dir() / gpu).glob("prefix-cache*.json") if p.stem != "prefix-cache-notebook")
    docs = [committed_results(n, gpu) for n in names]
    if not docs:
        return None
    return {"results": [r for d in docs for r in d["results"]], "date": ", ".join(sorted({d["date"][:10] for d in docs})),
            "sources": [f"{n}.json: {d['command']}" for n, d in zip(names, docs)]}


def arithmetic_speedup(prefix: int, suffix: int) -> float:
    """The first model of a hit: TTFT proportional to the tokens prefilled, (prefix + suffix) / suffix."""
    if suffix <= 0 or prefix < 0:
        raise ValueError(f"need suffix > 0 and prefix >= 0, got prefix={prefix}, suffix={suffix}")
    return (prefix + suffix) / suffix


def hit_breakdown(timeline: dict, host: dict) -> dict:
    """One hit's time in three parts, from the two committed profiles of the same hit
    (``bench hit-timeline``: wall clock and the tail's kernels; ``bench hit-host``: the host side with
    the tail stubbed out, and the restore copies timed alone).

    Returns ms: ``host`` (lookup, checks, restore plan: the hit with its tail stubbed, less the
    copies), ``restore`` (the copies), ``tail`` (the tail prefill, measured from the last restore to
    the first token), ``predicted`` (their sum), ``measured`` (the hit's median wall clock), plus the
    tail's ``kernels`` and ``busy`` GPU ms (kernels' own durations): a tail whose kernels are busy for
    much less than it lasts is bound by launches, not by bytes.
    """
    for key in ("hit_wall_median_ms", "tail_continuation_median_ms", "kernels_per_hit", "busy_us_per_hit"):
        if key not in timeline:
            raise KeyError(f"hit-timeline profile lacks {key!r} (python -m labkit bench hit-timeline)")
    for key in ("hit: pc.prefill, tail stubbed = host side (ms)", "restore: the copies (ms)"):
        if key not in host:
            raise KeyError(f"hit-host profile lacks {key!r} (python -m labkit bench hit-host)")
    restore = host["restore: the copies (ms)"]
    host_ms = host["hit: pc.prefill, tail stubbed = host side (ms)"] - restore
    tail = timeline["tail_continuation_median_ms"]
    return dict(host=host_ms, restore=restore, tail=tail, predicted=host_ms + restore + tail,
                measured=timeline["hit_wall_median_ms"], kernels=timeline["kernels_per_hit"],
                busy=timeline["busy_us_per_hit"] / 1e3)


def ttft_over_nocache(rows: list[dict], hits: bool = False) -> dict:
    """TTFT with the cache over TTFT without it, per workload, on the rows that restored nothing
    (every prompt a miss): what storing snapshots costs a request that never gains from them; with
    ``hits``, on the rows where at least half the requests hit instead (``requests_hit``): what
    the cache gave. A row with a few hits among misses is in neither: its median is a miss's.

    A row's ratio is the median of its requests' own ratios (``ttft_ratio_median``: each request
    timed with and without the cache back to back); rows written before that field existed give the
    ratio of their two medians. Returns {workload: {"ratio_min", "ratio_max", "ttft_ms",
    "nocache_ms"}} over those rows (medians of the rows' medians for the two TTFTs); workloads with no
    such row are absent.
    """
    out = {}
    for name in sorted({r["workload"] for r in rows}):
        chosen = [r for r in rows if r["workload"] == name
                  and (2 * r.get("requests_hit", r["requests"]) >= r["requests"] if hits else True)
                  and (r["restored_tokens"] > 0) == hits]
        if not chosen:
            continue
        ratios = [r.get("ttft_ratio_median", math.nan) for r in chosen]
        ratios = [p if p == p else r["ttft_ms_median"] / r["ttft_nocache_ms_median"] for p, r in zip(ratios, chosen)]
        out[name] = dict(ratio_min=min(ratios), ratio_max=max(ratios),
                         ttft_ms=statistics.median(r["ttft_ms_median"] for r in chosen),
                         nocache_ms=statistics.median(r["ttft_nocache_ms_median"] for r in chosen))
    return out


def hit_reading(rows: list[dict]) -> str:
    """The rows that restored something, read in time to first token (Markdown, every figure from
    ``rows``, those where most requests hit): a hit prefills fewer tokens, so the first model says it
    is faster; where it was not, the revised model for the rung the rows ran on. Empty when no row
    qualifies."""
    from .notebooks import value_range

    hit = ttft_over_nocache(rows, hits=True)
    if not hit:
        return ""
    text = "TTFT with the cache over TTFT without it, rows where most requests hit: " + "; ".join(
        f"{w} **{value_range([v['ratio_min'], v['ratio_max']], '{:.2f}×')}** ({v['ttft_ms']:.1f} ms against "
        f"{v['nocache_ms']:.1f})" for w, v in hit.items()) + "."
    slower = [w for w, v in hit.items() if v["ratio_max"] > 1]
    if not slower:
        return text + " Every such row was faster than no cache."
    text += f" **Hits cost more than no cache** on {_listed(slower)}, though they prefill fewer tokens."
    if "fused+graph" in {r["backend"] for r in rows if r["restored_tokens"] and r["workload"] in slower}:
        text += (" **Revised model:** on `fused+graph` a prompt without the cache replays the CUDA graph of its "
                 "length once that length has come before, and a hit replays one graph of its restore and its "
                 "tail once the hit's shape (restored length, tail length) has come before; until then it runs "
                 "eagerly, and a hit whose tail reaches a block boundary also stores that boundary's snapshot. "
                 "On a model this small, launches set the time, not arithmetic: an eager hit, or one that "
                 "replays and then stores, costs more than one replay of the whole prompt.")
    else:
        text += " The restore's copies and the new boundaries' snapshots cost more than the tokens they save."
    return text


def _ends(policy: str) -> bool:
    return policy.endswith("+ends")


def _listed(words: list[str]) -> str:
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def _ends_against_every(rows: list[dict]) -> list[tuple[float, dict, dict]]:
    """Per budget of one workload's ``rows`` (where both kinds ran): (budget, the best row with states
    at prompt ends only (``+ends``), the best row of a policy that stores every block)."""
    out = []
    for budget in sorted({r["budget_snapshots"] for r in rows}):
        here = [r for r in rows if r["budget_snapshots"] == budget]
        ends = max((r for r in here if _ends(r["policy"])), key=lambda r: r["hit_rate"], default=None)
        every = max((r for r in here if not _ends(r["policy"])), key=lambda r: r["hit_rate"], default=None)
        if ends is not None and every is not None:
            out.append((budget, ends, every))
    return out


def _budgets(rows: list[dict]) -> str:
    return _listed([f"{b:g}" for b in sorted({r["budget_snapshots"] for r in rows})])


def workload_reading(rows: list[dict]) -> str:
    """Section 5's bars read against its prediction (Markdown), every claim taken from ``rows``
    (:class:`labkit.bench.cache.WorkloadRow` dicts of one run). Multi-turn: the prediction held if the
    best row restored at least half its ceiling; otherwise it was too kind, and the revised reading
    says why. Shared prefix: at each budget, states at prompt ends only (``+ends``) against the best
    policy that stores every block, and what that says about admission."""
    out = []
    chats = [r for r in rows if r["workload"] == "multi-turn"]
    if chats:
        best = max(chats, key=lambda r: (r["hit_rate"], -r["budget_snapshots"]))
        head = (f"{best['policy']} at {best['budget_snapshots']:g} snapshots, restores **{best['hit_rate']:.0%}** "
                f"of the prompt tokens against a ceiling of {best['ceiling_hit_rate']:.0%}")
        idle = [p for p in dict.fromkeys(r["policy"] for r in chats)
                if all(r["hit_rate"] == 0 for r in chats if r["policy"] == p)]
        evictions = sorted(r["evictions"] for r in chats)
        if best["hit_rate"] < best["ceiling_hit_rate"] / 2:
            out.append(
                f"**Reading the bars against the prediction.** The prediction for multi-turn was too kind: at this "
                f"run's budgets ({_budgets(chats)} snapshots of {best['block_size']} tokens) the best row, {head}"
                + (f", and {_listed(idle)} restore{'s' if len(idle) == 1 else ''} nothing at all" if idle else "")
                + f" ({evictions[0]} to {evictions[-1]} evictions a stream). **Revised reading:** a budget that small "
                "holds less prefix than the chats interleaved between one chat's turns push through the cache, so a "
                "chat's path is evicted before its next turn comes; the policies only get to differ once the budget "
                "holds several chats' depth, which is what the committed run below tries.")
        else:
            out.append(f"**Reading the bars against the prediction.** Multi-turn came out as predicted: the best row, "
                       f"{head}, once the budget holds the chats' paths between their turns.")
    wins, losses, parts = [], [], []
    for budget, ends, every in _ends_against_every([r for r in rows if r["workload"] == "shared-prefix"]):
        (wins if ends["hit_rate"] > every["hit_rate"] else losses if ends["hit_rate"] < every["hit_rate"] else []).append(budget)
        parts.append(f"at {budget:g} snapshots `{ends['policy']}` restores {ends['hit_rate']:.0%} against "
                     f"{every['hit_rate']:.0%} for {every['policy']} (ceiling {ends['ceiling_hit_rate']:.0%})")
    if parts:
        verdict = ("Keeping states only at prompt ends and branch points pays when the budget can keep those points, "
                   "and loses when it cannot." if wins and losses else
                   "Keeping states only at prompt ends and branch points paid at every budget here." if wins and not losses else
                   "Keeping states only at prompt ends and branch points did not pay at these budgets." if losses else
                   "Admission made no difference at these budgets.")
        out.append("On the shared prefix, " + "; ".join(parts) + ". " + verdict)
    return " ".join(out)


def admission_verdict(rows: list[dict]) -> str:
    """The Marconi verdict's measured half (Markdown): where admission at prompt ends (``+ends``) beat
    the best policy that stores every block, by workload and budget, and whether any policy brought
    multi-turn near (at least half) its ceiling, from ``rows`` (workload rows of one or more runs)."""
    said = []
    for name in dict.fromkeys(r["workload"] for r in rows if r["workload"] != "unrelated"):
        won, lost = [], []
        for budget, ends, every in _ends_against_every([r for r in rows if r["workload"] == name]):
            if ends["hit_rate"] != every["hit_rate"]:
                (won if ends["hit_rate"] > every["hit_rate"] else lost).append(f"{budget:g}")
        if won or lost:
            said.append(f"{name}: `+ends` " + ", ".join(
                f"{how} at {_listed(budgets)} snapshots" for how, budgets in (("ahead", won), ("behind", lost)) if budgets))
    chats = [r for r in rows if r["workload"] == "multi-turn"]
    if chats:
        best = max(chats, key=lambda r: r["hit_rate"])
        near = best["hit_rate"] >= best["ceiling_hit_rate"] / 2
        said.append(f"multi-turn's best row, {best['policy']} at {best['budget_snapshots']:g} snapshots, restored "
                    f"{best['hit_rate']:.0%} of a {best['ceiling_hit_rate']:.0%} ceiling"
                    + ("" if near else ": no policy brought it near its ceiling"))
    return "; ".join(said) + "." if said else "no workload rows with both kinds of admission."


def hit_rate_panels(rows: list[dict], title: str, width: float = 10.0):
    """One panel per workload: hit rate by budget (groups) and policy (bars), the unbounded cache's
    ceiling as a line. Returns the figure."""
    if not rows:
        raise ValueError("no workload rows to draw")
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(width, 3.4), sharey=True, squeeze=False)
    bar = 0.8 / len(policies)
    for ax, name in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == name]
        budgets = sorted({r["budget_snapshots"] for r in mine})
        for k, policy in enumerate(policies):
            got = {r["budget_snapshots"]: r for r in mine if r["policy"] == policy}
            xs = [i + (k - (len(policies) - 1) / 2) * bar for i, b in enumerate(budgets) if b in got]
            ys = [100 * got[b]["hit_rate"] for b in budgets if b in got]
            ax.bar(xs, ys, width=bar, color=POLICY_COLOURS.get(policy, "gray"), label=policy)
            for x, y in zip(xs, ys):
                ax.text(x, y + 1, f"{y:.0f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(100 * mine[0]["ceiling_hit_rate"], color="k", ls="--", lw=1, label="ceiling (unbounded cache)")
        ax.set_xticks(range(len(budgets)), [f"{b:g}" for b in budgets], fontsize=9)
        ax.set_xlabel("budget (snapshots)", fontsize=9)
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 105)
    axes[0][0].set_ylabel("prompt tokens restored (%)", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def ttft_bars(rows: list[tuple[str, dict]], width: float = 8.0):
    """TTFT without a cache and with a hit: one panel per (where, ttft row), each on its own linear axis
    (a CPU run and an H200 run differ by orders of magnitude) with the values on the bars. Returns the figure."""
    if not rows:
        raise ValueError("no TTFT rows to draw")
    fig, axes = plt.subplots(1, len(rows), figsize=(width, 3.0), squeeze=False)
    for ax, (where, r) in zip(axes[0], rows):
        vals = [r["ttft_nocache_ms"], r["ttft_hit_ms"]]
        ax.bar([0, 1], vals, width=0.6, color=["#95a5a6", "#2e86c1"])
        for x, v in enumerate(vals):
            ax.text(x, v, f"{v:.1f} ms", ha="center", va="bottom", fontsize=8)
        ax.set_xticks([0, 1], ["no prefix cache", "hit"], fontsize=9)
        ax.set_ylim(0, 1.18 * max(vals))
        ax.set_title(f"{where}: {r['model']}, {r['prefix']}+{r['suffix']}", fontsize=9)
    axes[0][0].set_ylabel("time to first token (ms)", fontsize=9)
    fig.tight_layout()
    return fig


def breakdown_bars(parts: dict, nocache_ms: float, width: float = 8.0):
    """The hit's three parts stacked beside its measured wall clock (ms, linear). Returns the figure."""
    fig, ax = plt.subplots(figsize=(width, 2.2))
    left = 0.0
    for key, colour in (("host", "#8e44ad"), ("restore", "#f0ad4e"), ("tail", "#2e86c1")):
        ax.barh(1, parts[key], left=left, color=colour, label=f"{key} {parts[key]:.2f} ms")
        left += parts[key]
    ax.barh(0, parts["measured"], color="none", edgecolor="black", hatch="//", label=f"measured hit {parts['measured']:.2f} ms")
    ax.set_yticks([0, 1], ["measured", "sum of parts"], fontsize=9)
    ax.set_xlabel(f"ms (no cache: {nocache_ms:.1f} ms)", fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def replay_hit_rates(model, streams: dict, block: int, budget: float, policies, backend: str) -> dict:
    """Hit rate and ceiling of every (stream, policy) at one block size and budget, from the cache's
    bookkeeping alone (:func:`labkit.bench.cache.replay_stream`: prefills, no decoding, no timing).
    Returns {"rows": [{"workload", "policy", "hit_rate", "ceiling"}], "snapshot_bytes"}."""
    from ..bench.cache import replay_stream

    rows, snapshot_bytes = [], None
    for name, requests in streams.items():
        for policy in policies:
            res = replay_stream(model, requests, block, budget, policy, backend=backend)
            rows.append(dict(workload=name, policy=policy, hit_rate=res["hit_rate"], ceiling=res["ceiling"]))
            snapshot_bytes = res["snapshot_bytes"]
    return {"rows": rows, "snapshot_bytes": snapshot_bytes}


def replay_figure(replay: dict, title: str, width: float = 8.0):
    """Bars of :func:`replay_hit_rates`' rows, grouped by stream, one colour per policy, each stream's
    ceiling as a short black line. Returns the figure."""
    rows = replay["rows"]
    if not rows:
        raise ValueError("no replay rows to draw")
    streams = list(dict.fromkeys(r["workload"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    bar = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(width, 3.2))
    for k, policy in enumerate(policies):
        got = {r["workload"]: r for r in rows if r["policy"] == policy}
        ax.bar([j + (k - (len(policies) - 1) / 2) * bar for j in range(len(streams))],
               [100 * got[s]["hit_rate"] for s in streams], width=bar, color=POLICY_COLOURS.get(policy, "gray"), label=policy)
    for j, s in enumerate(streams):
        ceiling = next(r["ceiling"] for r in rows if r["workload"] == s)
        ax.plot([j - 0.45, j + 0.45], [100 * ceiling] * 2, color="k", lw=1.5, label="ceiling" if j == 0 else None)
    ax.set_xticks(range(len(streams)), streams, fontsize=9)
    ax.set_ylim(0, 105)
    ax.set_ylabel("prompt tokens restored (%)", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def precision_figure(curves: list[tuple[str, list[float]]], width: float = 7.0):
    """Relative logit error against the decode step after a bf16 snapshot, one line per (label, errors),
    beside one element's bf16 rounding (2^-9). Log-log: the error and the steps span decades. Returns the figure."""
    if not curves:
        raise ValueError("no precision curves to draw")
    fig, ax = plt.subplots(figsize=(width, 3.4))
    for label, errs in curves:
        ax.plot(range(1, len(errs) + 1), errs, marker="." if len(errs) < 50 else None, label=label)
    ax.axhline(2 ** -9, color="gray", ls=":", label="bf16 rounding of one element (2⁻⁹)")
    ax.set(xscale="log", yscale="log", xlabel="decode step after the rounded snapshot", ylabel="relative logit error")
    ax.set_title("bf16 snapshot of the GDN states vs float32", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
