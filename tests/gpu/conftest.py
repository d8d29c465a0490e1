"""GPU tests: every op and backend at the real shapes of both presets, on a CUDA GPU.

    python -m pytest -m gpu tests/gpu          # on the GPU machine (about 3 minutes on an H200)
    make gpu-test                              # the same, from the Makefile

Every test in this folder is marked ``gpu`` and skipped where there is no CUDA device, so a plain
``make test`` on a CPU passes over them. (The folder is a package so that this conftest does not
take the place of tests/conftest.py, which test modules import helpers from.)

What the suite costs is compiling, not arithmetic: Triton compiles every distinct constexpr
configuration of every kernel (bf16 and float32, batch 1, 3 and 16, with and without PDL), the
graph backends capture, and ``labkit.cuda`` builds ``kernels/*.cu`` with nvcc once (60-85 s on the
H200 machine). Serially that is well past ten minutes; so, when the command names this folder as a
whole on a CUDA machine with pytest-xdist installed, this conftest runs it on several worker
processes by itself (``-n <workers> --dist loadgroup``: 8 on a machine of 16 cores;
``LABKIT_GPU_WORKERS=N`` to choose, ``-n 0`` or ``-p no:xdist`` to run serially, which still works
without pytest-xdist). Within one run, compiled Triton kernels are shared between the workers
through Triton's on-disk cache; the CUDA extension is built by one worker only (its tests are one
``xdist_group``). Checked with pytest 9.1 and pytest-xdist 3.8 (the H200 machine's); pytest 9.2
renamed what xdist 3.8 appends a test's group to, so there the group spreads over the workers,
which then wait on the build's lock in turn: slower, still right.

Markers of this folder:

- ``heavy(seconds=...)``: a test that compiles much on its own (about ``seconds`` on the H200
  machine from a cold cache): scheduled first, longest first, so that it does not start last and
  end the run late;
- ``serial``: a test that times the GPU and asserts on the times: it runs alone. With workers it
  takes a lock that every other test holds shared, so it starts once every running test has
  ended, and no test starts while it runs; these tests are collected last, so in practice they
  run after all the others.

Every test has a time limit (:data:`TEST_TIMEOUT`, unless ``--timeout`` is given): a stalled test
fails with its name instead of eating the call, and the run ends with its summary and the
slowest durations (``--durations`` defaults to :data:`DURATIONS` here).
"""

import copy
import fcntl
import os
import tempfile
from pathlib import Path

import pytest
import torch

import labkit

HERE = Path(__file__).resolve().parent
REAL_PRESETS = ["lfm2-350m", "qwen3.5-0.8b"]
BATCHES = [1, 3, 16]  # the two decode buckets of the linear kernels, and an odd batch

# The longest test of a cold run takes ~130 s on the H200 machine (float32 Qwen3.5 greedy decode:
# its float32 kernels compile), the nvcc build of labkit.cuda 60-85 s; anything past this limit
# has stalled. pytest-timeout's signal method fails the test in its process, which goes on with
# the next one. (Not the thread method: it ends the worker, and pytest-xdist 3.8's group scheduler
# can hang the whole run when it replaces a crashed worker, pytest-xdist issues 1323, 1327, 1378.
# For the same reason a crashed worker is not replaced here: the run ends with its summary. A
# kernel that never returns keeps even a signal from being handled: give the command an outer
# ``timeout -s INT``, and pytest still prints what ran.)
TEST_TIMEOUT = 170
DURATIONS = 30
MAX_WORKERS = 8  # measured: 8 processes on one H200 and 16 cores (one per two cores: compiles are CPU-bound)
DIST_ENV = "LABKIT_GPU_DIST"  # how the controller tells its workers that it schedules by group


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy(seconds): compiles much on its own; tests/gpu schedules it first")
    config.addinivalue_line("markers", "serial: times the GPU; tests/gpu runs it alone, after the others")
    # pytest-xdist registers it too; without xdist the marker does nothing
    config.addinivalue_line("markers", "xdist_group(name): tests run by one xdist worker (pytest-xdist)")
    if _in_this_folder(config) and torch.cuda.is_available() and config.option.durations is None:
        config.option.durations = DURATIONS
    if _worker() and os.environ.get(DIST_ENV) == "loadgroup":
        # xdist's workers parse the command line, which did not say --dist loadgroup: without this
        # flag a worker would not name its tests' groups, and the controller would not keep them together
        config.option.loadgroup = True


def _worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _arg_paths(config) -> list[Path]:
    base = Path(config.invocation_params.dir)
    return [(base / str(a).split("::")[0]).resolve() for a in config.args]


def _in_this_folder(config) -> bool:
    paths = _arg_paths(config)
    return bool(paths) and all(p == HERE or HERE in p.parents for p in paths)


def _workers() -> int:
    """Worker processes for the whole folder: one per two CPU cores, one per 12 GiB of GPU memory
    (each holds both presets in bf16 and float32), at most :data:`MAX_WORKERS`;
    ``LABKIT_GPU_WORKERS`` overrides."""
    if "LABKIT_GPU_WORKERS" in os.environ:
        return int(os.environ["LABKIT_GPU_WORKERS"])
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 2) // 2, int(gib // 12)))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads -n (this conftest is an initial one for tests/gpu)
def pytest_cmdline_main(config):
    """Run the whole folder on workers when nothing says otherwise (see the module docstring)."""
    if (_worker() or not config.pluginmanager.hasplugin("xdist") or config.option.numprocesses is not None
            or config.option.dist != "no" or config.option.collectonly or config.option.usepdb
            or not _arg_paths(config) or any(p != HERE for p in _arg_paths(config))
            or not torch.cuda.is_available()):
        return None
    workers = _workers()
    if workers > 1:
        config.option.numprocesses = workers
        config.option.dist = "loadgroup"
        if config.option.maxworkerrestart is None:
            config.option.maxworkerrestart = "0"  # see TEST_TIMEOUT
        os.environ[DIST_ENV] = "loadgroup"  # the workers inherit it (see pytest_configure)
    return None


def pytest_report_header(config):
    if _worker() or not _in_this_folder(config) or not torch.cuda.is_available():
        return None
    workers = getattr(config.option, "numprocesses", None)  # the option exists with pytest-xdist only
    if workers:
        how = f"{workers} workers, --dist {config.option.dist}"
    elif not config.pluginmanager.hasplugin("xdist"):
        how = "serially: pytest-xdist is not loaded (pip install pytest-xdist for the ~3-minute run)"
    else:
        how = "serially"
    limit = config.getoption("timeout", None) or TEST_TIMEOUT
    return f"tests/gpu: {how}; {limit:g} s per test; the slowest {config.option.durations} durations at the end"


def _order(item) -> tuple:
    """Sort key: heavy tests first (longest first), then the others as collected, serial ones last."""
    if item.get_closest_marker("serial"):
        return (2, 0)
    heavy = item.get_closest_marker("heavy")
    if heavy:
        return (0, -heavy.kwargs.get("seconds", 0))
    return (1, 0)


@pytest.hookimpl(tryfirst=True)  # before `-m gpu` selects by marker
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU: python -m pytest -m gpu tests/gpu on the GPU machine")
    cuda = torch.cuda.is_available()
    # a --timeout given on the command line wins
    timed = config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None
    slots = []
    for k, item in enumerate(items):
        if HERE in Path(str(item.fspath)).resolve().parents:
            slots.append(k)
            item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(skip)
            elif timed and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT, method="signal"))
    if cuda:
        # this folder's tests in their slots, sorted; stable, so each class keeps the collection
        # order (modules stay together for their fixtures), and every worker sorts alike, as xdist requires
        for k, item in zip(slots, sorted((items[k] for k in slots), key=_order)):
            items[k] = item


_lock_file = None


def _gpu_lock():
    """This worker's handle on the run's lock file (one per run: xdist's test-run id), or None
    without workers."""
    global _lock_file
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return None
    if _lock_file is None:
        _lock_file = open(Path(tempfile.gettempdir()) / f"labkit-gpu-tests-{run}.lock", "a")
    return _lock_file


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's timer: waiting is not running
def pytest_runtest_protocol(item, nextitem):
    """With workers: a ``serial`` test holds the run's lock exclusively, every other test of this
    folder holds it shared, so a serial test runs while no other test does."""
    lock = _gpu_lock() if HERE in Path(str(item.fspath)).resolve().parents else None
    if lock is None or not torch.cuda.is_available():
        return (yield)
    fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("serial") else fcntl.LOCK_SH)
    try:
        return (yield)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


_models: dict = {}


@pytest.fixture(scope="session")
def real_model():
    """``real_model(preset, dtype=torch.bfloat16)``: the preset with random bf16 weights on the GPU,
    built once per session (per worker process); with ``dtype=torch.float32``, the same weights
    widened (the truth that bf16 implementations approximate)."""

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
