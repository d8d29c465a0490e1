"""The source article's claims as data, each beside the measurement our verdict rests on.

Each :class:`Claim` restates one claim in our own words, names the article's stage, the notebook
that measured it, the results file (``data/bench/<gpu>/<results>.json``) and the function that
reads our figure from it. A verdict is written for what was measured, so each claim also says what
must hold of the figure for its verdict to stand (:attr:`Claim.holds`); :func:`verdicts` reports
the claims whose figure no longer supports their verdict, and notebook 08 fails on any.

The article's own figures (its ladder, its GPUs, its target) are the inputs here, quoted as it
states them; every other number is read from a results file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .notebooks import REFERENCE_GPU, committed_results

# The article's ladder on 8 x B200, as it tells it: (stage, tokens/s after that stage).
ARTICLE_LADDER = (("baseline", 52), ("fusion", 145), ("adaptive KV cache", 240), ("TMA + async", 380),
                  ("B200-specific tuning", 480))
ARTICLE_GPUS = "8 x B200"
ARTICLE_TARGET_PCT = 80  # its target: more than 80% of the memory bandwidth (notebook 00)
# the Nsight Compute metric names the article profiles with (notebook 01 looks each up in ncu's listing)
ARTICLE_METRICS = ("sm__maximum_warps_avg", "sm__warps_active_avg", "tma__bytes_queried", "tma__throughput")

LFM2, QWEN = "lfm2-350m", "qwen3.5-0.8b"


@dataclass(frozen=True)
class Claim:
    stage: str                                   # the article's stage (ARTICLE_LADDER's names, or "setup")
    says: str                                    # the claim, in our words
    notebook: str                                # the notebook that measures it (a file in notebooks/)
    results: str | None                          # data/bench/<gpu>/<results>.json; None: not a measurement
    figure: Callable[[str], float] | None        # gpu -> the number the verdict rests on
    shows: str                                   # how the figure reads ("{:.1f}" where it goes)
    holds: Callable[[float], bool] | None        # what the verdict assumes of the figure
    verdict: str                                 # ours, in our words

    def measure(self, gpu: str = REFERENCE_GPU) -> float | None:
        """The figure, from the committed results file (None for a claim that is not a measurement).
        A missing file or row raises (FileNotFoundError, KeyError, ladder.LadderMissing)."""
        if self.figure is None:
            return None
        value = float(self.figure(gpu))
        if not math.isfinite(value):
            raise ValueError(f"claim {self.says!r}: its figure from {self.results}.json is {value}")
        return value


def _ladder(model: str, rung: str, batch: int, key: str, gpu: str) -> float:
    from .ladder import figure  # the one source of the headline figures

    return figure(model, rung, batch, gpu=gpu)[key]


def _row(name: str, gpu: str, **match) -> dict:
    rows = [r for r in committed_results(name, gpu)["results"] if all(r.get(k) == v for k, v in match.items())]
    if len(rows) != 1:
        raise KeyError(f"{name}.json ({gpu}) has {len(rows)} rows with {match}, expected one")
    return rows[0]


def _gdn_layers(gpu: str) -> float:
    from ..config import PRESETS

    return PRESETS[LFM2].layer_types.count("gdn")


def _gpu_busy_pct(gpu: str) -> float:
    r = _row("baseline-diagnosis", gpu, model=LFM2, batch=1)
    return 100 * r["gpu_busy_ms"] / r["step_ms"]


def _eager_launch_us(gpu: str) -> float:
    return committed_results("fusion-evidence", gpu)["launch"]["eager_us"]


def _one_program_per_head_slowdown(gpu: str) -> float:
    rows = [r for r in committed_results("fusion-evidence", gpu)["block_v"] if (r["model"], r["batch"]) == (QWEN, 1)]
    whole = [r["us"] for r in rows if r["block_v"] == max(x["block_v"] for x in rows)]
    return whole[0] / min(r["us"] for r in rows)


def _bank_model_ratio(gpu: str) -> float:
    naive = next(r for r in committed_results("bank-conflicts", gpu)["results"] if r["layout"] == "naive")
    return naive["counters"]["wavefronts_ld"] / naive["prediction"]["ld_wavefronts"]


def _silent_big_launches(gpu: str) -> float:
    smem = committed_results("pitfalls", gpu)["smem"]
    over = [r for r in smem["launches"] if r["shared_bytes"] > smem["limits"]["per_block"] and not r["opted_in"]]
    if not over:
        raise KeyError(f"pitfalls.json ({gpu}) has no launch above {smem['limits']['per_block']} bytes without opt-in")
    return sum(bool(r["launched"]) for r in over)


def _ttft_speedup(gpu: str) -> float:
    rows = committed_results("prefix-cache-ttft", gpu)["results"]
    longest = max(rows, key=lambda r: r["prefix"])
    return longest["ttft_nocache_ms"] / longest["ttft_hit_ms"]


def _tma_latency_ratio(gpu: str) -> float:
    rows = [r for r in committed_results("load-latency", gpu)["results"] if r["pattern"] == "random" and not r["error"]]
    biggest = max(r["nbytes"] for r in rows)  # far past L2: a load from HBM
    by_style = {r["style"]: r["ns_per_load"] for r in rows if r["nbytes"] == biggest}
    return by_style["descriptor"] / by_style["pointer"]


def _ratio(rung: str, over: str, model: str = LFM2, batch: int = 1) -> Callable[[str], float]:
    return lambda gpu: (_ladder(model, rung, batch, "tokens_per_s", gpu)
                        / _ladder(model, over, batch, "tokens_per_s", gpu))


def _tf32_min_speedup(gpu: str) -> float:
    return min(v["tf32"] for v in committed_results("pitfalls", gpu)["tf32"]["summary"]["speed_over_fp32"].values())


def _article_metrics_listed(gpu: str) -> float:
    listed = {r["name"]: r["listed"] for r in committed_results("ncu-metric-names", gpu)["results"]}
    missing = [m for m in ARTICLE_METRICS if m not in listed]
    if missing:
        raise KeyError(f"ncu-metric-names.json ({gpu}) did not look up {missing}")
    return sum(listed[m] for m in ARTICLE_METRICS)


def _rungs() -> tuple[str, ...]:
    from .ladder import RUNGS

    return tuple(RUNGS)


def _best_batch1_over_article(gpu: str) -> float:
    best = max(_ladder(LFM2, rung, 1, "tokens_per_s", gpu) for rung in _rungs())
    return best / ARTICLE_LADDER[-1][1]


CLAIMS: tuple[Claim, ...] = (
    Claim("setup", "LFM2-350M is a Gated DeltaNet model.", "00_model_and_roofline.ipynb", None, _gdn_layers,
          "{:.0f} Gated DeltaNet layers in its config (`labkit.PRESETS`)", lambda x: x == 0,
          "Wrong: it stacks gated short convolutions and GQA attention. Gated DeltaNet hybrids are another "
          "family (Qwen3.5), which the workbook measures too."),
    Claim("setup", "About 500 tok/s is what LFM2-350M should reach at batch 1.", "00_model_and_roofline.ipynb",
          "ladder", lambda gpu: _ladder(LFM2, "reference", 1, "roofline_tokens_per_s", gpu),
          "roofline at batch 1 on one H200: {:,.0f} tok/s", lambda x: x > 2 * 500,
          "Far too modest: the bytes of one step allow several times that on a single GPU."),
    Claim("baseline", "The plain-PyTorch baseline decodes at 52 tok/s.", "01_diagnosis.ipynb", "ladder",
          lambda gpu: _ladder(LFM2, "reference", 1, "tokens_per_s", gpu),
          "our reference rung, LFM2-350M, batch 1: {:,.1f} tok/s", lambda x: 52 / 4 < x < 52 * 4,
          "The same order as ours. An eager step waits on the host (Python, dispatch, launches), so this rate "
          "says more about the CPU than about the GPU."),
    Claim("baseline", "The baseline used 35% of the memory bandwidth (the goal being over 80%).", "01_diagnosis.ipynb",
          "ladder", lambda gpu: _ladder(LFM2, "reference", 1, "pct_of_roofline", gpu),
          "our reference rung: {:.1f}% of roofline", lambda x: x < 35 / 3,
          "Inconsistent with its own 52 tok/s: a host-bound step moves a few percent of what the bandwidth allows."),
    Claim("baseline", "Tensor cores were in use 15% of the time, and that is what to fix.", "01_diagnosis.ipynb",
          "baseline-diagnosis", _gpu_busy_pct, "the GPU is busy {:.0f}% of an eager step", lambda x: x < 50,
          "Beside the point: batch-1 decode does about two FLOPs per weight byte, far too few for tensor cores "
          "to matter, and the GPU idles for most of the eager step."),
    Claim("baseline", "A kernel launch costs 5-10 µs, and launches are the bulk of a step.", "02_fusion.ipynb",
          "fusion-evidence", _eager_launch_us, "one launch from Python: {:.1f} µs", lambda x: 3 < x < 15,
          "Right about the launch from Python. One CUDA graph for the step takes it to about a microsecond, and "
          "removes the host code around each launch as well."),
    Claim("fusion", "Fusing kernels took decode from 52 to 145 tok/s (2.8x).", "02_fusion.ipynb", "ladder",
          _ratio("fused", "reference"), "fused over reference, LFM2-350M, batch 1: {:.1f}x", lambda x: x > 1.5,
          "A few times, as they found. Replaying the fused step from a CUDA graph, which the article never does, "
          "is worth far more (the ladder above)."),
    Claim("fusion", "Fuse each layer into a single program.", "02_fusion.ipynb", "fusion-evidence",
          _one_program_per_head_slowdown,
          "Qwen3.5 delta-rule step with one program per head: {:.1f}x the time of the best split", lambda x: x > 1.2,
          "Wrong for decode: too few programs leave most SMs idle. Fuse to remove launches, never parallelism."),
    Claim("B200-specific tuning", "Shared-memory banks are 8 bytes wide on Hopper and 4 on Blackwell.",
          "06_tuning_for_the_gpu.ipynb", "bank-conflicts", _bank_model_ratio,
          "counted / predicted (32 banks of 4 bytes) load wavefronts, naive tile: {:.2f}", lambda x: 0.9 < x < 1.1,
          "Wrong: 32 banks of 4 bytes on both, and the counters agree with that model."),
    Claim("B200-specific tuning", "A kernel that needs more than 48 KB of shared memory silently runs on the CPU.",
          "06_tuning_for_the_gpu.ipynb", "pitfalls", _silent_big_launches,
          "launches above 48 KB without opting in that ran: {:.0f}", lambda x: x == 0,
          "Wrong: such a launch fails with an error unless the kernel opts in. Silent host work comes from "
          "tensors left on the CPU."),
    Claim("adaptive KV cache", "An adaptive KV cache took decode from 145 to 240 tok/s.", "03_adaptive_caching.ipynb",
          "prefix-cache-ttft", _ttft_speedup, "a prefix-cache hit makes the first token {:.1f}x sooner",
          lambda x: x > 1.5,
          "A prefix cache shortens the time to the first token; the decode step, and so tokens/s, stays as "
          "it was. A delta-rule layer has no growing KV cache at all, only a fixed state."),
    Claim("TMA + async", "TMA cuts a load's latency from about 200 ns to 40 ns.", "04_tma_and_async.ipynb",
          "load-latency", _tma_latency_ratio, "a dependent load from HBM through TMA / a plain load: {:.2f}x the time",
          lambda x: x >= 1,
          "Wrong: memory answers no sooner through TMA. What it buys is many bytes in flight per thread "
          "without registers."),
    Claim("TMA + async", "`cudaTensorMapCreate`, `cudaTensorMapObjectParams` and an inter-chiplet async copy are "
          "the API to use.", "04_tma_and_async.ipynb", None, None, "not a measurement", None,
          "Wrong: CUDA has none of them. The real path is `cuTensorMapEncodeTiled` + `cp.async.bulk.tensor` + "
          "`mbarrier`, or Triton's tensor descriptors; B200 is two dies seen as one device, not four chiplets."),
    Claim("TMA + async", "TMA and asynchronous copies took decode from 240 to 380 tok/s.", "04_tma_and_async.ipynb",
          "ladder", _ratio("fused+graph+pdl", "fused+graph"),
          "overlapping kernels (PDL) over fused+graph, LFM2-350M, batch 1: {:.2f}x", lambda x: x < 380 / 240,
          "A smaller step here: our TMA GEMV is correct but not faster than the plain Triton one, so it is no "
          "rung; the asynchronous gain we keep is PDL's overlap of one kernel's start with the last one's end."),
    Claim("TMA + async", "A persistent kernel removes the launch overhead, so decode gets faster.",
          "05_persistent_decode.ipynb", "ladder", _ratio("persistent", "fused+graph+pdl"),
          "persistent over fused+graph+pdl, LFM2-350M, batch 1: {:.2f}x", lambda x: x < 1,
          "Not yet here: inside a graph the launch was never the cost. Our persistent step is correct but "
          "slower, its resident programs keeping too few bytes in flight."),
    Claim("B200-specific tuning", "Tuning for the B200 took decode from 380 to 480 tok/s (+26%).",
          "06_tuning_for_the_gpu.ipynb", "ladder", _ratio("tuned", "fused+graph+pdl"),
          "tuned over untuned (fused+graph+pdl), LFM2-350M, batch 1 on the H200: {:.2f}x", lambda x: x < 1.26,
          "No B200 here. Tuning for the GPU at hand gains less than that, since a fixed cost per kernel, "
          "which tiles do not change, is a large part of the step."),
    Claim("B200-specific tuning", "TF32 tensor cores need a special data layout, or run at a quarter of their speed.",
          "06_tuning_for_the_gpu.ipynb", "pitfalls", _tf32_min_speedup,
          "TF32 over float32, slowest size measured: {:.1f}x", lambda x: x > 1,
          "Half right: TF32 beat float32 at every size; sizes off a 16-byte boundary slow every dtype, bf16 too. "
          "Alignment matters, not a TF32 layout."),
    Claim("B200-specific tuning", "Profile with `nv-nsight-cu-cli` and metrics such as `tma__bytes_queried`.",
          "01_diagnosis.ipynb", "ncu-metric-names", _article_metrics_listed,
          "of the article's {} metric names, ncu lists: {{:.0f}}".format(len(ARTICLE_METRICS)), lambda x: x == 0,
          "Outdated and wrong: the tool is `ncu` now, and these names are not in its listing "
          "(`ncu --query-metrics` gives the real ones)."),
    Claim("B200-specific tuning", "The end point: 480 tok/s on eight B200s.", "07_more_gpus.ipynb", "ladder",
          _best_batch1_over_article, "our best batch-1 rung on one H200: {:.1f}x the article's eight GPUs together",
          lambda x: x > 1,
          "Not comparable like-for-like (other GPUs, setting and harness), but a batch-1 step cannot use eight "
          "GPUs well: replicas add throughput, tensor parallelism adds two all-reduces per block to every step."),
)


def verdicts(gpu: str = REFERENCE_GPU) -> list[dict]:
    """One row per claim: stage, says, measured (the figure as prose, or "not a measurement"), verdict,
    notebook, results (the file, or None), figure, holds (False where the figure no longer supports the
    verdict: revise the verdict, never the figure)."""
    out = []
    for claim in CLAIMS:
        value = claim.measure(gpu)
        out.append({
            "stage": claim.stage, "says": claim.says, "verdict": claim.verdict, "notebook": claim.notebook,
            "results": None if claim.results is None else f"data/bench/{gpu}/{claim.results}.json",
            "figure": value, "measured": claim.shows if value is None else claim.shows.format(value),
            "holds": True if claim.holds is None else bool(claim.holds(value)),
        })
    return out


def markdown_table(rows: list[dict], notebook_dir: str = "") -> str:
    """The claims as a markdown table (links to the notebooks relative to ``notebook_dir``)."""
    lines = ["| stage | the article says | we measured | our verdict | notebook |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = r["verdict"] if r["holds"] else f"**the figure no longer supports this verdict:** {r['verdict']}"
        link = f"[{r['notebook'][:2]}]({notebook_dir}{r['notebook']})"
        lines.append(f"| {r['stage']} | {r['says']} | {r['measured']} | {verdict} | {link} |")
    return "\n".join(lines)
