"""GPU tests: every op and backend at the real shapes of both presets, on a CUDA GPU.

    python -m pytest -m gpu tests/gpu          # on the GPU machine (a few minutes on an H200)

Every test in this folder is marked ``gpu`` and skipped where there is no CUDA device, so a plain
``make test`` on a CPU passes over them. (The folder is a package so that this conftest does not
take the place of tests/conftest.py, which test modules import helpers from.)
"""

import copy
from pathlib import Path

import pytest
import torch

import labkit

HERE = Path(__file__).resolve().parent
REAL_PRESETS = ["lfm2-350m", "qwen3.5-0.8b"]
BATCHES = [1, 3, 16]  # the two decode buckets of the linear kernels, and an odd batch


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU: python -m pytest -m gpu tests/gpu on the GPU machine")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)


_models: dict = {}


@pytest.fixture(scope="session")
def real_model():
    """``real_model(preset, dtype=torch.bfloat16)``: the preset with random bf16 weights on the GPU,
    built once per session; with ``dtype=torch.float32``, the same weights widened (the truth that
    bf16 implementations approximate)."""

    def get(preset: str, dtype: torch.dtype = torch.bfloat16):
        key = (preset, dtype)
        if key not in _models:
            if dtype == torch.bfloat16:
                _models[key] = labkit.build(labkit.PRESETS[preset], dtype=dtype, device="cuda", seed=0)
            else:
                _models[key] = copy.deepcopy(get(preset)).to(dtype)
        return _models[key]

    yield get
    _models.clear()
