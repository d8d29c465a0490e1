"""Run the workbook's notebooks in batch with papermill (``make run``, ``python -m labkit notebooks``)."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import resources
from ..shipped import load_model  # noqa: F401  (the notebooks' loader: a shipped checkpoint or a preset)

NOTEBOOK_DIR = resources.notebooks_dir() if resources.checkout() else None  # the lab's: not installed
INJECTED = "injected-parameters"  # the tag of the cell papermill adds with a run's parameters

# The repository on GitHub, for the notebooks' "Open in Colab" links and their Colab install cell.
# PLACEHOLDER: the project has no public remote yet; change it here (and in pyproject.toml's
# [project.urls], which tests/test_colab_cells.py checks agrees), then run
# `python -m labkit colab-cells` to rewrite the notebooks' cells.
REPOSITORY = "https://github.com/labkit-workbook/labkit"
BRANCH = "main"
COLAB_BADGE, COLAB_INSTALL = "colab-badge", "colab-install"  # the two cells' tags (and ids)
COLAB_CLONE = "/content/labkit"  # where the install cell clones the repository on Colab
# What the install cell adds on Colab: the peers (transformers, notebook 01). Not the notebooks extra:
# Colab brings its own Jupyter kernel and widgets, and papermill's pins (ipykernel < 7) would replace
# the kernel the notebook runs in. Torch stays Colab's own (CUDA) build: the cell pins it as installed.
COLAB_EXTRAS = "peers"


def notebook_paths(directory: Path | None = NOTEBOOK_DIR) -> list[Path]:
    directory = directory if directory is not None else resources.notebooks_dir()  # says what is missing
    return sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))


def run_notebooks(
    out_dir: str | Path = "build",
    parameters: dict[str, Any] | None = None,
    only: list[str] | None = None,
    directory: Path | None = NOTEBOOK_DIR,
    kernel_name: str = "python3",
    cell_timeout_s: int = 1200,
    log_output: bool = False,
) -> list[dict[str, Any]]:
    """Execute each notebook into ``out_dir``; returns one summary row per notebook.

    Each notebook gets the ``parameters`` its parameters cell declares (and INTERACTIVE=False where it
    has widgets); ``only`` matching no notebook, or a parameter that no notebook declares (a typo), is a
    ValueError before anything runs (it names the notebooks).
    Results are written under data/ only by notebooks given SAVE_RESULTS=True. A notebook that fails
    (its asserts included) is reported by its cell's exception, and the rest still run; the caller decides the exit status
    from the rows.
    """
    import papermill as pm

    paths = notebook_paths(directory)
    selected = [nb for nb in paths if not only or any(key in nb.name for key in only)]
    if not selected:
        raise ValueError(f"no notebook in {directory} matches --only {' '.join(only or [])}; the notebooks: "
                         f"{', '.join(nb.name for nb in paths) or 'none'}")
    declared = {nb: set(pm.inspect_notebook(str(nb))) for nb in paths}
    unknown = set(parameters or {}) - set().union(*declared.values())
    if unknown:
        raise ValueError(f"no notebook has the parameter(s) {sorted(unknown)} in its parameters cell")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for nb in selected:
        # a batch run has no frontend to draw widgets in (and ipywidgets can stall it)
        given = {name: value for name, value in {"INTERACTIVE": False, **(parameters or {})}.items()
                 if name in declared[nb]}
        t0 = time.perf_counter()
        error = None
        try:
            with _batch_environment():
                pm.execute_notebook(
                    str(nb),
                    str(out / nb.name),
                    parameters=given,
                    kernel_name=kernel_name,
                    cwd=str(nb.parent),
                    progress_bar=False,
                    execution_timeout=cell_timeout_s,  # a hung kernel fails the run instead of stalling it
                    log_output=log_output,
                )
        except Exception as exc:  # noqa: BLE001  a notebook that fails is a row; the others still run
            error = _failure(exc)
        if (out / nb.name).exists():
            drop_injected_parameters(out / nb.name)
        rows.append({"notebook": nb.name, "seconds": time.perf_counter() - t0, "error": error})
    return rows


def _failure(exc: Exception) -> str:
    """One line saying why a notebook failed: the cell's own exception (papermill's
    PapermillExecutionError carries its name and value; its str() starts with a separator line)."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename is not None:
        cell = getattr(exc, "cell_index", None)
        first = str(evalue).strip().splitlines()[0] if str(evalue).strip() else ""
        return f"{ename}: {first}" + (f" (cell {cell})" if cell is not None else "")
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__


@contextmanager
def _batch_environment():
    """What the kernels of a batch run inherit (they copy this process's environment): no progress
    bars, which tqdm writes to stderr and which would end up in the executed notebook's outputs."""
    before = os.environ.get("TQDM_DISABLE")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        yield
    finally:
        if before is None:
            del os.environ["TQDM_DISABLE"]


def drop_injected_parameters(path: str | Path) -> bool:
    """Remove papermill's injected-parameters cell from a notebook file in place; True if it had one.

    An executed notebook is committed without it: opened in JupyterLab, its batch values
    (INTERACTIVE=False, SAVE_RESULTS=True) would override the defaults of the ``parameters`` cell.
    Only the cells list changes; every other byte is written back as it was (nbformat's layout,
    checked before writing), and ``metadata.papermill.parameters`` still records what the run was given.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    ending = text[len(text.rstrip("\n")):]
    if _nbformat_json(nb) + ending != text:
        raise ValueError(f"{path} is not laid out as nbformat writes it; refusing to rewrite it")
    cells = [c for c in nb["cells"] if INJECTED not in c.get("metadata", {}).get("tags", [])]
    if len(cells) == len(nb["cells"]):
        return False
    nb["cells"] = cells
    path.write_text(_nbformat_json(nb) + ending, encoding="utf-8")
    return True


def lab_metadata() -> dict:
    """The notebook metadata JupyterLab writes when it opens a notebook with the kernel ``make lab``
    installs (``ipykernel install --name python3`` in this interpreter's environment): the
    kernelspec from that kernel's spec, and the ``language_info`` its kernel_info reply carries,
    whose ``version`` is this interpreter's Python. A committed notebook that carries exactly
    these opens in JupyterLab unmodified, so autosave never rewrites it."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

    spec = get_kernel_dict()
    return {"kernelspec": {"display_name": spec["display_name"], "language": spec["language"], "name": KERNEL_NAME},
            "language_info": json.loads(json.dumps(IPythonKernel.language_info))}


def normalise_metadata(nb: dict) -> bool:
    """Set ``nb``'s kernelspec and language_info to :func:`lab_metadata`, in place; True if they changed."""
    want = lab_metadata()
    changed = any(nb["metadata"].get(key) != value for key, value in want.items())
    nb["metadata"].update(want)
    return changed


def unrun_colab_cells(nb: dict) -> bool:
    """Give the Colab cells of the notebook ``nb`` (its JSON, changed in place) the metadata, outputs
    and execution count :func:`colab_cells` gives them, keeping their ids and sources; True if any
    changed. A committed notebook opens on Colab with the install cell not yet run."""
    changed = False
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", [])) & {COLAB_BADGE, COLAB_INSTALL}
        if not tags:
            continue
        want = {"metadata": {"tags": sorted(tags)}}
        if cell["cell_type"] == "code":
            want.update(outputs=[], execution_count=None)
        for k, v in want.items():
            if cell.get(k) != v:
                cell[k] = v
                changed = True
    return changed


def strip_notebook(path: str | Path) -> list[str]:
    """What ``python -m labkit strip-notebooks`` does to one notebook before it is committed: drop
    papermill's injected-parameters cell (:func:`drop_injected_parameters`), put the Colab cells
    back as :func:`colab_cells` makes them (a run executes the install cell, which only acts on
    Colab, and records its timings) and normalise the metadata to what JupyterLab writes
    (:func:`normalise_metadata`), in the layout it saves (:func:`lab_layout`). Returns what changed."""
    path = Path(path)
    done = ["removed the injected-parameters cell"] if drop_injected_parameters(path) else []
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    if unrun_colab_cells(nb):
        done.append("left the Colab cells un-run")
    if normalise_metadata(nb):
        done.append("normalised kernelspec and language_info")
    if lab_layout(nb) != text:
        path.write_text(lab_layout(nb), encoding="utf-8")
        done.append("wrote it as JupyterLab saves it")
    return done


def lab_layout(nb: dict) -> str:
    """The bytes JupyterLab's server writes for ``nb`` when it saves it: nbformat's layout and one
    final newline."""
    return _nbformat_json(nb) + "\n"


def colab_url(notebook: str) -> str:
    """Colab's page for ``notebooks/<notebook>`` of :data:`REPOSITORY` (its ``main`` branch)."""
    owner_repo = REPOSITORY.removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/notebooks/{notebook}"


def colab_cells(notebook: str) -> list[dict]:
    """The two cells :func:`add_colab_cells` puts first in ``notebook`` (a file name): a markdown
    "Open in Colab" badge, and a code cell that installs labkit on Colab and does nothing anywhere
    else. On Colab it clones :data:`REPOSITORY` (the notebooks read the repository's committed
    results and checkpoints, which a wheel leaves out), installs it in editable mode with
    :data:`COLAB_EXTRAS` and Colab's own torch pinned, puts the clone on ``sys.path`` (an editable
    install reaches only processes started after it) and moves into its ``notebooks/`` folder, where
    the notebooks' relative paths start."""
    badge = (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(notebook)})\n"
             "\n"
             "On Colab, run the next cell first: it installs labkit there (elsewhere it does nothing). Colab's L4 and "
             "A100 are older than Hopper (sm_90): the sections that need PDL or TMA say so and skip.")
    install = f"""\
# On Google Colab: clone labkit and install it (Colab's own torch kept). Anywhere else: nothing.
import sys

if "google.colab" in sys.modules:
    import importlib.metadata, os, subprocess

    _clone = "{COLAB_CLONE}"
    if not os.path.isdir(_clone):
        subprocess.check_call(["git", "clone", "--depth", "1", "-q", "{REPOSITORY}", _clone])
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "-e", _clone + "[{COLAB_EXTRAS}]",
                           "torch==" + importlib.metadata.version("torch")])
    sys.path.insert(0, _clone)
    os.chdir(os.path.join(_clone, "notebooks"))"""
    return [
        {"cell_type": "markdown", "id": COLAB_BADGE, "metadata": {"tags": [COLAB_BADGE]},
         "source": badge.splitlines(keepends=True)},
        {"cell_type": "code", "execution_count": None, "id": COLAB_INSTALL, "metadata": {"tags": [COLAB_INSTALL]},
         "outputs": [], "source": install.splitlines(keepends=True)},
    ]


def has_colab_cells(nb: dict, notebook: str) -> bool:
    """Whether the notebook ``nb`` (its JSON) starts with :func:`colab_cells` of ``notebook`` (its
    file name): their kinds, tags and sources (a run may add metadata, and the badge's link names
    the file)."""
    def key(c: dict) -> tuple:
        return c["cell_type"], set(c.get("metadata", {}).get("tags", [])), "".join(c["source"])

    return [key(c) for c in nb["cells"][:2]] == [key(c) for c in colab_cells(notebook)]


def add_colab_cells(path: str | Path) -> bool:
    """Put :func:`colab_cells` first in the notebook at ``path``, in place; True if the file changed.
    Idempotent: a notebook that has them is left as it is; stale ones (found by their tags) are
    replaced, so a new REPOSITORY reaches every notebook. Nothing else changes (nbformat's layout, checked before writing); papermill's
    ``parameters`` cell stays the one so tagged, and nbval finds one more cell without outputs."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    ending = text[len(text.rstrip("\n")):]
    if has_colab_cells(nb, path.name):
        return False
    if _nbformat_json(nb) + ending != text:
        raise ValueError(f"{path} is not laid out as nbformat writes it; refusing to rewrite it")
    ours = {COLAB_BADGE, COLAB_INSTALL}
    rest = [c for c in nb["cells"] if not ours & set(c.get("metadata", {}).get("tags", []))]
    clash = [c["id"] for c in rest if c.get("id") in ours]
    if clash:
        raise ValueError(f"{path} has untagged cells with the ids {clash} the Colab cells use")
    nb["cells"] = colab_cells(path.name) + rest
    path.write_text(_nbformat_json(nb) + ending, encoding="utf-8")
    return True


def _nbformat_json(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False, separators=(",", ": "))


def print_summary(rows: list[dict[str, Any]]) -> None:
    """One line per notebook run (its seconds, ok or why it failed), then the counts."""
    width = max((len(r["notebook"]) for r in rows), default=0)
    for r in rows:
        status = "ok" if r["error"] is None else f"FAILED: {r['error']}"
        print(f"{r['notebook']:<{width}}  {r['seconds']:7.1f} s  {status}")
    failed = sum(r["error"] is not None for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed")


def setup(device: str = "auto", seed: int = 0) -> str:
    """The first call of every notebook: resolve ``device`` ("auto": the GPU if there is one), make
    Triton use its interpreter on a CPU, seed torch, and set figure defaults."""
    import matplotlib.pyplot as plt
    import torch

    device = default_device() if device == "auto" else device
    if device == "cpu":
        cpu_environment()
    elif not torch.cuda.is_available():
        raise RuntimeError(f"DEVICE={device!r} was asked for, but torch sees no CUDA GPU here")
    torch.manual_seed(seed)
    plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "axes.axisbelow": True})
    return device


def auto(value, on_gpu: bool, gpu, cpu):
    """Resolve a notebook parameter left at "auto": the real size on a GPU, a CPU-sized one otherwise."""
    return (gpu if on_gpu else cpu) if value == "auto" else value


def value_range(values, fmt: str = "{:.1f}", unit: str = "") -> str:
    """Prose for a measured spread: "a to b" (each formatted with ``fmt``, then ``unit``), or one value
    where the extremes print the same (a single row, or rows that agree to the printed precision)."""
    values = list(values)
    if not values:
        raise ValueError("value_range needs at least one value")
    lo, hi = fmt.format(min(values)) + unit, fmt.format(max(values)) + unit
    return lo if lo == hi else f"{lo} to {hi}"


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_environment() -> None:
    """Kernels need Triton's interpreter where there is no GPU; set it before triton is imported."""
    if default_device() == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def default_models(on_gpu: bool) -> list[str]:
    """What ``MODELS = "auto"`` means: the real presets on a GPU; on a CPU the shipped byte-level
    checkpoints (trained, so their text is readable) where present, else the tiny random presets."""
    if on_gpu:
        return ["lfm2-350m", "qwen3.5-0.8b"]
    from ..shipped import available_checkpoints

    return available_checkpoints() or ["tiny-lfm2", "tiny-qwen3.5"]


REFERENCE_GPU = "nvidia-h200"  # the GPU whose committed results a notebook teaches with where there is none


def committed_results(name: str, gpu: str = REFERENCE_GPU) -> dict:
    """A committed results file, ``data/bench/<gpu>/<name>.json`` (GPU, versions, date, command and
    rows), for a notebook to read its numbers from instead of typing them. ``name`` is a plain file
    name: superseded files under ``data/bench/<gpu>/archive/`` are never read."""
    from ..bench.results import check_name, results_dir

    path = results_dir() / check_name(gpu) / f"{check_name(name)}.json"
    if not path.exists():
        have = sorted(p.stem for p in path.parent.glob("*.json"))
        raise FileNotFoundError(f"no committed results {path}; {gpu} has: {', '.join(have) or 'none'}")
    return json.loads(path.read_text())


def no_gpu_notice(device: str, gpu: str = REFERENCE_GPU) -> str:
    """Markdown for the top of a notebook run without a GPU: what the CPU numbers are (interpreter
    timings that teach nothing about speed) and where the lesson's figures come from instead."""
    if device != "cpu":
        return ""
    return (f"> **No GPU here.** Kernels run in Triton's interpreter on the CPU, so every time this run "
            f"measures is the interpreter's, not a GPU's. The figures the lesson rests on are the committed "
            f"{gpu} results in `data/bench/{gpu}/`, drawn beside what this machine measures and labelled so.")
