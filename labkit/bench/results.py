"""Results files: every measurement is written with the GPU, the software versions, the host's CPU,
the date and the exact command (``data/bench/<gpu>/<name>.json``), and the README's table is made from them."""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from .. import resources
from ..lab.hw import DeviceFacts, host, versions

# data/bench of the checkout; None where labkit is installed without its repository (results_dir says so)
DATA_DIR = resources.bench_dir() if resources.checkout() else None


def results_dir(data_dir: Path | None = None) -> Path:
    """``data_dir``, else the checkout's ``data/bench`` (:class:`labkit.resources.MissingResource`,
    naming what is absent, where labkit is installed without its repository)."""
    return Path(data_dir) if data_dir is not None else resources.bench_dir()


def provenance(facts: DeviceFacts, command: str | None = None) -> dict:
    return {
        "gpu": facts.name if facts.kind == "cuda" else None,
        "device": facts.to_dict(),
        "versions": versions(),
        "host": host(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in ["python", "-m", "labkit", *sys.argv[1:]]),
    }


def check_name(name: str) -> str:
    """``name`` as a results file's stem: a plain file name, so that ``<data_dir>/<gpu>/<name>.json``
    stays inside the results folder (no path separator, no '..', not empty)."""
    if not isinstance(name, str) or name in ("", ".") or any(bad in name for bad in ("..", "/", "\\")):
        raise ValueError(f"results name {name!r} must be a plain file name (no '/', '\\' or '..'): "
                         f"it becomes data/bench/<gpu>/<name>.json; e.g. --name decode-b16")
    return name


def write_results(name: str, kind: str, rows: list, facts: DeviceFacts, command: str | None = None,
                  data_dir: Path | None = DATA_DIR) -> Path:
    """``data_dir/<gpu>/<name>.json``: the provenance, ``kind`` and the rows (dataclasses) as "results"."""
    return write_document(name, kind, {"results": [asdict(r) for r in rows]}, facts, command, data_dir)


def write_document(name: str, kind: str, fields: dict, facts: DeviceFacts, command: str | None = None,
                   data_dir: Path | None = DATA_DIR) -> Path:
    """A results file whose figures are named ``fields`` (JSON values) beside the provenance and ``kind``."""
    check_name(name)
    out_dir = results_dir(data_dir) / facts.slug
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    doc = {**provenance(facts, command), "kind": kind, **fields}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


class ResultsFileError(ValueError):
    """A results file that cannot be read into the table: the message names the file and what is wrong."""


def load_results(data_dir: Path | None = DATA_DIR) -> list[dict]:
    data_dir = results_dir(data_dir)
    docs = []
    for path in sorted(data_dir.glob("*/*.json")):
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ResultsFileError(f"{path}: not a JSON results file ({exc})") from None
        if not isinstance(doc, dict):
            raise ResultsFileError(f"{path}: a results file holds one JSON object, not {type(doc).__name__}")
        doc["path"] = shown_path(path, data_dir)
        doc["file"] = str(path)
        docs.append(doc)
    return docs


def shown_path(path: Path, data_dir: Path) -> str:
    """The file as the README links it: relative to the repository (data/bench/<gpu>/<name>.json)."""
    try:
        return str(path.relative_to(data_dir.parent.parent))
    except ValueError:  # a data dir with fewer than two parents
        return str(path)


def _rows(docs: list[dict], kind: str, fields: tuple[str, ...]) -> list[tuple[dict, dict]]:
    """The (file, row) pairs of every ``kind`` file, each row checked for the fields the table reads."""
    out = []
    for d in docs:
        if d.get("kind") != kind:
            continue
        where = d.get("file", d.get("path", "a results file"))
        if not isinstance(d.get("results"), list):
            raise ResultsFileError(f"{where}: a {kind!r} results file needs a 'results' list; it has none")
        for i, r in enumerate(d["results"]):
            need = fields if not (isinstance(r, dict) and r.get("error")) else fields[:3]
            missing = [f for f in need if not isinstance(r, dict) or f not in r]
            if missing:
                raise ResultsFileError(f"{where}: row {i} of its {kind!r} results has no field "
                                       f"{missing[0]!r} (needs {', '.join(map(repr, need))})")
            out.append((d, r))
    return out


def _cell(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _link(d: dict) -> str:
    return f"[{Path(d['path']).name}]({d['path']})"


def _slug(d: dict) -> str:
    """The GPU folder a results file sits in (data/bench/<slug>/<name>.json)."""
    return Path(d["path"]).parent.name


def ladder_docs(docs: list[dict]) -> list[dict]:
    """The decode ladder file of each GPU (``data/bench/<gpu>/ladder.json``, :mod:`labkit.bench.ladder`)."""
    from ..lab.ladder import LADDER_NAME

    return [d for d in docs if d.get("kind") == "decode" and Path(d["path"]).stem == LADDER_NAME]


def complete_prefill(doc: dict) -> bool:
    """A prefill file the README can show on its own: no failed row, and for every model in it a
    labkit rung and a transformers peer at every prompt length the file names."""
    from .decode import PEERS

    rows = doc.get("results") or []
    if not rows or any(r.get("error") for r in rows):
        return False
    lengths = {r["tokens"] for r in rows}
    for model in {r["model"] for r in rows}:
        mine = [r for r in rows if r["model"] == model]
        for side in (lambda i: i in PEERS, lambda i: i not in PEERS):
            if {r["tokens"] for r in mine if side(r["impl"])} != lengths:
                return False
    return True


def prefill_docs(docs: list[dict]) -> list[dict]:
    """Per GPU, the newest complete prefill file (:func:`complete_prefill`), by its recorded date."""
    newest: dict[str, dict] = {}
    for d in docs:
        if d.get("kind") == "prefill" and complete_prefill(d):
            if _slug(d) not in newest or str(d.get("date")) > str(newest[_slug(d)].get("date")):
                newest[_slug(d)] = d
    return [newest[k] for k in sorted(newest)]


# rungs whose kernels read no tuning file: their figures do not depend on one
TUNING_FREE = ("transformers", "transformers+fla", "transformers+compile", "reference", "reference+graph")


def _tuning_of(slug: str, row: dict) -> str:
    """What kernel settings a row ran with: none to speak of for :data:`TUNING_FREE` rungs; the
    row's ``tuning`` where it records one; else labkit's default, the GPU's tuning file (rows
    written before the field existed ran with whatever file the GPU had)."""
    if row["impl"] in TUNING_FREE:
        return "n/a"
    return row.get("tuning") or f"data/tuning/{slug}.json"


def figure_key(doc: dict, row: dict) -> tuple:
    """What one figure is of: (gpu, kind, model, implementation, kernel settings, batch, prompt
    and steps for decode / prompt tokens for prefill). Two files with a row of the same key
    measure the same thing."""
    slug = _slug(doc)
    if doc.get("kind") == "decode":
        return (slug, "decode", row["model"], row["impl"], _tuning_of(slug, row), row["batch"], row.get("prompt"),
                row.get("new_tokens"))
    return (slug, "prefill", row["model"], row["impl"], _tuning_of(slug, row), row.get("batch", 1), row["tokens"])


def clashes(docs: list[dict]) -> dict[tuple, list[tuple[str, float]]]:
    """Every :func:`figure_key` that two or more files give different tokens/s for: key -> [(file,
    tokens/s)], files sorted. (Failed and absent rows hold no figure.)"""
    seen: dict[tuple, dict[str, float]] = {}
    for d in docs:
        if d.get("kind") not in ("decode", "prefill"):
            continue
        for r in d.get("results") or []:
            if r.get("error") or r.get("absent") or r.get("tokens_per_s") is None:
                continue
            seen.setdefault(figure_key(d, r), {}).setdefault(d["path"], r["tokens_per_s"])
    return {k: sorted(v.items()) for k, v in seen.items() if len(v) > 1 and len(set(v.values())) > 1}


NOT_MEASURED = ("Decode ladder: not measured yet on any GPU. `python -m labkit bench ladder` measures every "
                "rung of both models at batch 1 and 16 and writes `data/bench/<gpu>/ladder.json`; then "
                "`python -m labkit bench table --readme README.md` rewrites this table.")


def markdown_table(docs: list[dict]) -> str:
    """The README's results: per GPU, one row per (model, rung, batch) of its ladder file, then the
    prefill rows of its newest complete prefill file. Every decode and prefill file is checked
    for the fields the table reads (a malformed one is a :class:`ResultsFileError`), shown or not."""
    from ..lab.ladder import RUNGS

    decode = _rows(docs, "decode", ("model", "impl", "batch", "tokens_per_s", "achieved_bytes_per_s"))
    _rows(docs, "prefill", ("model", "impl", "tokens", "ms"))
    ladders = ladder_docs(docs)
    lines = []
    if not ladders:
        lines += [NOT_MEASURED, ""]
    for d in ladders:
        rows = sorted((r for doc, r in decode if doc is d),
                      key=lambda r: (RUNGS.index(r["rung"]) if r.get("rung") in RUNGS else len(RUNGS), r["model"],
                                     r["batch"]))
        shape = sorted({(r.get("prompt"), r.get("new_tokens")) for r in rows}, key=str)
        steps = ", ".join(f"{p}-token prompt, {n} new tokens" for p, n in shape)
        lines += [f"Decode on {d.get('gpu') or 'a CPU'}, {steps}: {_link(d)} ({str(d.get('date'))[:10]}, "
                  f"`{d.get('command')}`).", "",
                  "| GPU | model | rung | kernel settings | batch | tok/s | % of roofline | achieved GB/s | file |",
                  "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for r in rows:
            if r.get("absent"):
                cells = [f"absent: {_cell(r['absent'])}", "", ""]
            elif r.get("error") or r.get("tokens_per_s") is None:
                cells = [f"failed: {_cell(r.get('error') or 'no figure')}", "", ""]
            else:
                pct = r.get("pct_of_roofline")
                cells = [f"{r['tokens_per_s']:,.1f}", f"{pct:.1f}%" if pct is not None else "",
                         f"{r['achieved_bytes_per_s'] / 1e9:,.0f}"]
            lines.append(f"| {d.get('gpu') or 'cpu'} | {r['model']} | {r.get('rung', r['impl'])} | "
                         f"{r.get('tuning', '')} | {r['batch']} | " + " | ".join(cells) + f" | {_link(d)} |")
        lines.append("")
    for d in prefill_docs(docs):
        lines += [f"Prefill on {d.get('gpu') or 'a CPU'}: {_link(d)} ({str(d.get('date'))[:10]}, `{d.get('command')}`), "
                  "the newest prefill file with a labkit rung and the transformers peer for every model and length.",
                  "", "| GPU | model | implementation | batch | prompt tokens | prefill ms | file |",
                  "| --- | --- | --- | ---: | ---: | ---: | --- |"]
        for r in sorted(d["results"], key=lambda r: (r["model"], r["impl"], r.get("batch", 1), r["tokens"])):
            lines.append(f"| {d.get('gpu') or 'cpu'} | {r['model']} | {r['impl']} | {r.get('batch', 1)} | {r['tokens']} | "
                         f"{r['ms']:,.2f} | {_link(d)} |")
        lines.append("")
    return "\n".join(lines).rstrip()


README_BEGIN = "<!-- results:begin (python -m labkit bench table --readme README.md) -->"
README_END = "<!-- results:end -->"


def update_readme(readme: Path, docs: list[dict]) -> None:
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} has no results markers ({README_BEGIN} ... {README_END})")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{markdown_table(docs)}\n{README_END}{tail}")


def plot_prefill_file(path: Path, *more: Path) -> Path:
    """Prefill ms against prompt length (:func:`labkit.lab.plots.prefill_vs_length`) from the prefill rows
    of the results file ``path`` and of ``more`` files, drawn to ``path`` with a .png suffix; the
    title names the GPU and the files' dates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..lab.plots import prefill_vs_length

    missing = [str(p) for p in more if not Path(p).exists()]
    if missing:  # a peer's run that did not finish: plot what there is, and say so
        print(f"plot: left out missing results files {missing}")
    docs = [json.loads(Path(p).read_text()) for p in (path, *more) if Path(p).exists()]
    rows = [r for d in docs if d.get("kind") == "prefill" for r in d["results"]]
    models = sorted({r["model"] for r in rows})
    if not models:
        raise ValueError(f"no prefill rows in {[str(p) for p in (path, *more)]}")
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        prefill_vs_length([r for r in rows if r["model"] == m], ax=ax, title=m)
    dates = sorted({d["date"][:10] for d in docs})
    fig.suptitle(f"prefill, batch 1: {docs[0].get('gpu') or 'CPU'} ({', '.join(dates)})", fontsize=10)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
