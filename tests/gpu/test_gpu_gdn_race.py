"""The Gated DeltaNet step updates its state in place, and shares work between programs through
arrival counters: a missing barrier (threads storing the new state while others still read the
old, or a conv window shifted before every program of the head group has read it) shows up only
now and then, and only at real sizes. So: many calls at the real Qwen3.5 shape, each on fresh
random inputs, at several block_v (whole heads; heads split over programs), each output and both
states compared with the reference. One corrupted element of a 128 x 128 float32 head moves the
state's relative error far above the 1e-5 bound.

To show that this test catches the race it guards against, plant it for one run, without editing
a file: ``LABKIT_GDN_DROP_BARRIER`` names the barriers of labkit/ops/gated_delta_decode.py to drop
(comma-separated, or "all"): "state" (before the in-place store of the new state), "conv" (before
the conv windows are shifted in place), "shift" (inside the shift, between its loads and stores).
The test then runs a copy of the kernel built from the module's source without those lines (the
product module itself is untouched):

    LABKIT_GDN_DROP_BARRIER=shift python -m pytest -m gpu tests/gpu/test_gpu_gdn_race.py -q -n 4

What the plants gave on the H200 (2026-12-02, torch 2.11, Triton 3.6, 25 calls in each of the 12 cases):

- ``shift``: caught, 1 case failed (batch 16, whole heads); ``all``: caught, 6 cases failed;
- ``conv``: not caught in 25 calls of any case. The conv reads the old window with the tile
  layout the shift stores with, so a row is overwritten by a thread that read it, except where
  lanes are replicated (narrow tiles of few channels): the hazard is that narrow;
- ``state``: not a hazard. The state tile is stored with the layout it was loaded with, so each
  element is rewritten by the thread that read it; the PTX kept as many ``bar.sync`` (Triton places
  its own around the reductions' shared memory) and every case passed. The kernel says so beside
  the barrier.
"""

import importlib.util
import os

import pytest

from labkit.bench import ops

from .conftest import BATCHES

CALLS = 25
PLANT_ENV = "LABKIT_GDN_DROP_BARRIER"
BARRIERS = ("state", "conv", "shift")


def _barrier_kind(lines: list[str], i: int) -> str | None:
    """Which of BARRIERS the ``tl.debug_barrier()`` on line i is, from its context."""
    enclosing = next((ln for ln in reversed(lines[:i]) if ln.startswith("def ")), "")
    following = next((ln for ln in lines[i + 1:] if ln.strip()), "")
    if enclosing.startswith("def _shift_conv_state("):
        return "shift"
    if "_shift_conv_state(" in following:
        return "conv"
    if "in place" in lines[i]:
        return "state"
    return None


def source_without_barriers(source: str, drop: set[str]) -> str:
    """gated_delta_decode's source with the barriers named in ``drop`` replaced by ``pass``; each
    named barrier must be found exactly once (a plant that silently does nothing proves nothing)."""
    lines = source.splitlines()
    found = {kind: 0 for kind in drop}
    for i, line in enumerate(lines):
        if line.strip().startswith("tl.debug_barrier()"):
            kind = _barrier_kind(lines, i)
            if kind in drop:
                found[kind] += 1
                lines[i] = line[: len(line) - len(line.lstrip())] + "pass  # planted: barrier dropped"
    missing = [kind for kind, n in found.items() if n != 1]
    if missing:
        raise AssertionError(f"{PLANT_ENV}: barriers {missing} not found exactly once in gated_delta_decode.py")
    return "\n".join(lines) + "\n"


@pytest.fixture(autouse=True, scope="module")
def planted_race(tmp_path_factory):
    """With ``LABKIT_GDN_DROP_BARRIER`` set, the step's kernel is swapped for one built without
    those barriers, for this module's tests only."""
    wanted = os.environ.get(PLANT_ENV, "").strip()
    if not wanted:
        yield None
        return
    drop = set(BARRIERS) if wanted == "all" else {w.strip() for w in wanted.split(",")}
    unknown = drop - set(BARRIERS)
    if unknown:
        raise ValueError(f"{PLANT_ENV} names barriers {sorted(unknown)}; known: {BARRIERS} or 'all'")
    from labkit.ops import gated_delta_decode as gdd

    path = tmp_path_factory.mktemp("planted") / "gated_delta_decode_planted.py"
    with open(gdd.__file__) as f:
        path.write_text(source_without_barriers(f.read(), drop))
    # a module of the same package, so that its relative imports resolve (triton.jit reads its
    # source from the file)
    spec = importlib.util.spec_from_file_location("labkit.ops._gated_delta_decode_planted", path)
    planted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(planted)
    mp = pytest.MonkeyPatch()
    mp.setattr(gdd, "_gdn_decode_kernel", planted._gdn_decode_kernel)
    print(f"\nplanted: gated_delta_decode without barriers {sorted(drop)} ({path})")
    yield sorted(drop)
    mp.undo()


@pytest.mark.parametrize("block_v", [8, 16, 32, 128])
@pytest.mark.parametrize("batch", BATCHES)
def test_repeated_gdn_steps_on_fresh_inputs_match_the_reference(real_model, batch, block_v):
    model = real_model("qwen3.5-0.8b")
    for call in range(CALLS):
        err = ops.gdn_errors(model, batch, block_v, seed=1000 + call)
        assert err["out"] < 1e-2 and err["conv_state"] < 1e-6 and err["state"] < 1e-5, (call, err)


def test_the_plant_drops_each_barrier_once():
    """The planting itself (on the CPU too): each named barrier goes, nothing else changes."""
    from labkit.ops import gated_delta_decode as gdd

    with open(gdd.__file__) as f:
        source = f.read()
    for kind in BARRIERS:
        planted = source_without_barriers(source, {kind})
        assert planted.count("tl.debug_barrier()") == source.count("tl.debug_barrier()") - 1
        assert planted.count("planted: barrier dropped") == 1
    assert source_without_barriers(source, set(BARRIERS)).count("tl.debug_barrier()") == 0
