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

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        import dataclasses

        import triton.runtime.interpreter as _interp

        # The interpreter checks every int32 index operation for overflow, in numpy, at ~0.5 ms
        # each: a third of the kernel tests' time. Test shapes are tiny and cannot overflow int32;
        # the real-shape checks are tests/gpu, on a GPU.
        _interp.interpreter_builder.options = dataclasses.replace(
            _interp.interpreter_builder.options, sanitize_overflow=False
        )
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - no triton, or another layout
        pass


def pytest_configure(config):
    # Triton 3.6's interpreter turns 1-element arrays into loop bounds, which numpy >= 1.25 warns about.
    config.addinivalue_line("filterwarnings", "ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64; NaN or Inf anywhere fails."""
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def poison_empty(monkeypatch, module) -> None:
    """Make ``torch.empty`` as ``module`` calls it return tensors filled with NaN (until ``monkeypatch``
    is undone), so that an element a kernel of that module fails to write fails the comparison."""
    real = torch.empty

    def empty(*shape, dtype=None, device=None, **kw):
        return real(*shape, dtype=dtype, device=device, **kw).fill_(float("nan"))

    class PoisonedTorch:
        def __getattr__(self, name):
            return empty if name == "empty" else getattr(torch, name)

    monkeypatch.setattr(module, "torch", PoisonedTorch())


@pytest.fixture(params=["reversed", "shuffled"])
def scrambled_grid(request, monkeypatch):
    """Interpreted kernels run their grid backwards, then shuffled (tests/grid_order.py): a result
    that depends on the order programs run in (a race on the GPU) fails here. A no-op on a GPU."""
    from grid_order import scramble_grid

    scramble_grid(monkeypatch, request.param, seed=1)
    return request.param


@pytest.fixture
def device():
    return "cuda" if _cuda else "cpu"


class RecordedStep:
    def __init__(self, step, owner):
        self.step, self.owner = step, owner

    def replay(self):
        self.owner.replays += 1
        self.step()


class RecordingGraphs:
    """Stand-in for CUDA graphs: capture records the step (without running it), replay re-runs it."""

    def __init__(self):
        self.warm_ups = self.captures = self.replays = 0

    def available(self, device):
        return True

    def warm_up(self, step, device):
        self.warm_ups += 1
        step()

    def capture(self, step, device):
        self.captures += 1
        return RecordedStep(step, self)


@pytest.fixture
def graphs(monkeypatch):
    """labkit.decode.graphs.GRAPHS replaced by the recording stand-in, for this test."""
    from labkit.decode import graphs

    stand_in = RecordingGraphs()
    monkeypatch.setattr(graphs, "GRAPHS", stand_in)
    return stand_in


def random_prompt(model, batch, length, seed=0):
    """Token ids [batch, length] drawn from the model's vocabulary, reproducibly."""
    return torch.randint(0, model.cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def gpu_named(monkeypatch):
    """Pretend every CUDA device has the given name; forget loaded files and warnings."""
    from labkit import tuning

    tuning.forget()

    def name(gpu: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)

    yield name
    tuning.forget()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of tiny matmuls: on the shared 2-core machine a second thread
    made each generate call of the prefix-cache suites 4x slower (0.04 -> 0.17 s of CPU), not faster.
    Put back after. Use: ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def shipped_float32(name: str):
    """A shipped checkpoint in float32 on the CPU; skipped, saying why, where it is absent."""
    import labkit

    path = labkit.shipped.checkpoints_dir() / name
    if not (path / "config.json").exists():
        pytest.skip(f"{name} is not in {path.parent} (make it with python -m labkit.train)")
    return labkit.load(path, dtype=torch.float32)
