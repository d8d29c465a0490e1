"""Run the workbook's notebooks in batch with papermill (``make run``, ``python -m labkit notebooks``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"


def notebook_paths(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))


def run_notebooks(
    out_dir: str | Path = "build",
    parameters: dict[str, Any] | None = None,
    only: list[str] | None = None,
    directory: Path = NOTEBOOK_DIR,
    kernel_name: str = "python3",
    cell_timeout_s: int = 1200,
    log_output: bool = False,
) -> list[dict[str, Any]]:
    """Execute each notebook into ``out_dir``; returns one summary row per notebook.

    A notebook that fails (its asserts included) is reported, and the rest still run; the caller
    decides the exit status from the rows.
    """
    import papermill as pm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for nb in notebook_paths(directory):
        if only and not any(key in nb.name for key in only):
            continue
        t0 = time.perf_counter()
        error = None
        try:
            pm.execute_notebook(
                str(nb),
                str(out / nb.name),
                # a batch run has no frontend to draw widgets in (and ipywidgets can stall it)
                parameters={"INTERACTIVE": False, **(parameters or {})},
                kernel_name=kernel_name,
                cwd=str(nb.parent),
                progress_bar=False,
                execution_timeout=cell_timeout_s,  # a hung kernel fails the run instead of stalling it
                log_output=log_output,
            )
        except Exception as exc:  # papermill wraps the cell's exception; keep its first line
            error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        rows.append({"notebook": nb.name, "seconds": time.perf_counter() - t0, "error": error})
    return rows


def print_summary(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no notebooks to run")
        return
    width = max(len(r["notebook"]) for r in rows)
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
    from .checkpoints import available_checkpoints

    return available_checkpoints() or ["tiny-lfm2", "tiny-qwen3.5"]


def load_model(name: str, dtype, device: str, seed: int = 0):
    """A shipped checkpoint by name (``labkit.checkpoints.CHECKPOINTS``), else a preset with seeded
    random weights (``labkit.build``)."""
    import labkit
    from .checkpoints import CHECKPOINTS, checkpoint_path

    if name in CHECKPOINTS:
        return labkit.load(checkpoint_path(name), dtype=dtype, device=device)
    return labkit.build(name, dtype=dtype, device=device, seed=seed)
