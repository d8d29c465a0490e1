import os
import sys
from pathlib import Path

# Kernels run in Triton's interpreter on machines without a GPU; it must be chosen before triton
# is first imported.
try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64; NaN or Inf anywhere fails."""
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.fixture
def device():
    return "cuda" if _cuda else "cpu"
