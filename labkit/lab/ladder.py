"""The decode ladder's headline figures, from one place: ``data/bench/<gpu>/ladder.json``.

One run of ``python -m labkit bench ladder`` (:mod:`labkit.bench.ladder`) measures every rung of
:data:`RUNGS` for both models at batch 1 and 16 and writes that file; notebooks and the README read
its rows through :func:`figure` and :func:`rows`, so that a rung's tokens/s is the same number on
every page. :func:`fixed_cost_per_kernel` is the one "fixed cost per kernel" the workbook quotes.

Nothing here measures or makes up a figure: an absent file, rung or row is a :class:`LadderMissing`
that names the command which makes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..bench.results import ResultsFileError, check_name, results_dir, shown_path

# ladder order; every rung but "tuned" runs with the heuristic kernel settings (no tuning file)
RUNGS = ("transformers", "reference", "reference+graph", "fused", "fused+graph", "fused+graph+pdl",
         "persistent", "tuned")
TUNED_IMPL = "fused+graph+pdl"  # "tuned" is this rung with the GPU's tuning file
LADDER_NAME = "ladder"
LADDER_COMMAND = "python -m labkit bench ladder"
CHAIN_NAME = "chain"
CHAIN_COMMAND = "python -m labkit bench chain"

FIGURE_KEYS = ("model", "rung", "impl", "tuning", "batch", "prompt", "new_tokens", "tokens_per_s", "step_ms",
               "pct_of_roofline", "roofline_tokens_per_s", "achieved_bytes_per_s")


class LadderMissing(FileNotFoundError, KeyError):
    """The ladder file, or a row of it, is not there (or holds no figure): the message names
    the command that measures it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def ladder_path(gpu: str = "nvidia-h200", data_dir: Path | None = None) -> Path:
    return results_dir(data_dir) / check_name(gpu) / f"{LADDER_NAME}.json"  # never archive/


def _document(gpu: str, data_dir: Path | None) -> tuple[dict, Path]:
    path = ladder_path(gpu, data_dir)
    if not path.exists():
        raise LadderMissing(f"no ladder measured for {gpu}: {path} does not exist; run `{LADDER_COMMAND}` on that GPU "
                            f"(it writes data/bench/<gpu>/{LADDER_NAME}.json)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{path}: not a JSON results file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "decode" or not isinstance(doc.get("results"), list):
        raise ResultsFileError(f"{path}: a ladder file is a 'decode' results file with a 'results' list")
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or r.get("rung") not in RUNGS:
            raise ResultsFileError(f"{path}: row {i} has rung {r.get('rung') if isinstance(r, dict) else r!r}, "
                                   f"not one of {', '.join(RUNGS)}")
    return doc, path


def _with_source(row: dict, doc: dict, path: Path, data_dir: Path | None) -> dict:
    return {**row, "file": shown_path(path, results_dir(data_dir)), "date": doc.get("date"),
            "command": doc.get("command")}


def rows(gpu: str = "nvidia-h200", *, data_dir: Path | None = None) -> list[dict]:
    """Every row of the GPU's ladder file (absent and failed rungs too: their ``absent`` or
    ``error`` says why they hold no figure), in :data:`RUNGS` order, then model, then batch."""
    doc, path = _document(gpu, data_dir)
    out = [_with_source(r, doc, path, data_dir) for r in doc["results"]]
    return sorted(out, key=lambda r: (RUNGS.index(r["rung"]), r["model"], r["batch"]))


def figure(model: str, rung: str, batch: int, gpu: str = "nvidia-h200", *, data_dir: Path | None = None) -> dict:
    """The ladder row of ``model`` at ``rung`` and ``batch`` (see :data:`FIGURE_KEYS`, plus
    ``file``, ``date``, ``command``). :class:`LadderMissing` when the file or the row is absent,
    or when the row records why the rung has no figure on that GPU (or that it failed)."""
    if rung not in RUNGS:
        raise ValueError(f"unknown rung {rung!r}; the ladder's rungs: {', '.join(RUNGS)}")
    found = [r for r in rows(gpu, data_dir=data_dir) if r["model"] == model and r["rung"] == rung and r["batch"] == batch]
    if not found:
        raise LadderMissing(f"{ladder_path(gpu, data_dir)} has no row for {model} at rung {rung!r}, batch {batch}; "
                            f"`{LADDER_COMMAND} --models {model} --batch {batch}` measures it")
    if len(found) > 1:
        raise ResultsFileError(f"{found[0]['file']}: {len(found)} rows for {model}, {rung!r}, batch {batch}")
    row = found[0]
    why = row.get("absent") or row.get("error")
    if why or row.get("tokens_per_s") is None:
        raise LadderMissing(f"{row['file']} holds no figure for {model} at rung {rung!r}, batch {batch}: "
                            f"{why or 'no tokens_per_s recorded'}")
    missing = [k for k in FIGURE_KEYS if k not in row]
    if missing:
        raise ResultsFileError(f"{row['file']}: the row for {model}, {rung!r}, batch {batch} lacks {missing}")
    return row


def _plain_chain_rows(doc: dict, path: Path) -> list[dict]:
    """The rows of the chain of plain-Triton GEMVs, no PDL, batch 1 (one per model)."""
    found = [r for r in doc.get("results", []) if r.get("gemv") == "plain" and not r.get("pdl")
             and r.get("batch") == 1 and not r.get("error")]
    if not found:
        raise LadderMissing(f"{path} has no chain of plain GEMVs at batch 1 without PDL; run "
                            f"`{CHAIN_COMMAND} --batch 1 --gemvs plain` on that GPU")
    return found


def fixed_cost_per_kernel(gpu: str = "nvidia-h200", *, data_dir: Path | None = None) -> dict:
    """The one "fixed cost per kernel" of the workbook: the intercept of ``time = fixed + bytes /
    bandwidth`` fitted (:func:`labkit.bench.chain.fit_per_kernel`, each point weighted by the kernels
    it stands for) over every group of kernels of the chained plain-Triton GEMVs (each weight matrix
    of the step once, batch 1, no PDL, in one CUDA graph, L2-cold) of both models in ``chain.json``.

    Keys: ``us``, ``bandwidth_bytes_per_s``, ``r2``, ``file``, ``date``, ``what`` (a sentence saying
    which chain and fit this is), ``per_model`` (each model's own fit, as chain.json records it)."""
    from ..bench.chain import fit_per_kernel

    path = results_dir(data_dir) / check_name(gpu) / f"{CHAIN_NAME}.json"
    if not path.exists():
        raise LadderMissing(f"no chain measured for {gpu}: {path} does not exist; run `{CHAIN_COMMAND}` on that GPU")
    doc = json.loads(path.read_text())
    chains = _plain_chain_rows(doc, path)
    groups = [(r["model"], g) for r in chains for g in r.get("groups", []) if "us_per_kernel" in g]
    fit = fit_per_kernel([g["bytes_per_kernel"] for _, g in groups], [g["us_per_kernel"] for _, g in groups],
                         [g["kernels"] for _, g in groups])
    models = sorted({m for m, _ in groups})
    kernels = sum(g["kernels"] for _, g in groups)
    per_model = {}
    for r in chains:
        if r.get("fit") and "t0_us" in r["fit"]:
            per_model[r["model"]] = {"us": r["fit"]["t0_us"], "bandwidth_bytes_per_s": r["fit"]["tb_per_s"] * 1e12,
                                     "r2": r["fit"]["r2"]}
    return {
        "us": fit.t0_us,
        "bandwidth_bytes_per_s": fit.bytes_per_s,
        "r2": fit.r2,
        "file": shown_path(path, results_dir(data_dir)),
        "date": doc.get("date"),
        "what": (f"the intercept of time = fixed + bytes / bandwidth, fitted over {len(groups)} groups "
                 f"({kernels} kernels) of the chained plain-Triton GEMVs of {' and '.join(models)} (every weight "
                 f"matrix of a decode step once, batch 1, no PDL, back to back in one CUDA graph; "
                 f"`{CHAIN_COMMAND}`, {shown_path(path, results_dir(data_dir))})"),
        "per_model": per_model,
    }
