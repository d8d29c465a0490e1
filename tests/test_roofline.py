"""labkit.lab.roofline's byte counts against the real cache, the copy-time fit, and the state-vs-KV crossing
(the numbers notebook 00 teaches with)."""

import pytest
import torch

import labkit
from labkit.bench.hardware import HwRow, copy_sweep, fit_fixed_cost
from labkit.lab.plots import byte_parts, crossing_context
from labkit.lab.roofline import cache_buffer_bytes, layer_costs


@pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-qwen3.5", "lfm2-350m", "qwen3.5-0.8b"])
def test_fixed_state_bytes_are_the_cache_read_and_written(name):
    cfg = labkit.PRESETS[name]
    context = 37
    costs = {c.kind: c for c in layer_costs(cfg, context)}
    cache = cache_buffer_bytes(cfg, context + 1)
    fixed = sum(costs[k].state_bytes_per_seq for k in ("conv", "gdn") if k in costs)
    assert fixed == 2 * (cache["conv"] + cache["gdn"]) > 0
    assert costs["attention"].state_bytes_per_seq == cache["kv"]  # L positions read, one written


@pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-qwen3.5", "qwen3.5-0.8b"])
def test_crossing_context_is_the_first_context_where_kv_reaches_the_state(name):
    cfg = labkit.PRESETS[name]
    cross = crossing_context(cfg)
    state = byte_parts(cfg, 0)[2]
    assert byte_parts(cfg, cross)[1] >= state
    assert cross == 0 or byte_parts(cfg, cross - 1)[1] < state


def test_fit_fixed_cost_recovers_a_line_and_refuses_noise():
    rows = [HwRow("copy", b, 0, 2.0 + b / 4e12 * 1e6) for b in (1 << 20, 1 << 24, 1 << 28, 1 << 30)]
    t0, bw = fit_fixed_cost(rows)
    assert t0 == pytest.approx(2.0, rel=1e-6) and bw == pytest.approx(4e12, rel=1e-6)
    with pytest.raises(ValueError):
        fit_fixed_cost(rows[:1])
    with pytest.raises(ValueError):
        fit_fixed_cost([HwRow("copy", 1 << 20, 0, 5.0), HwRow("copy", 1 << 24, 0, 1.0)])


def test_copy_sweep_on_cpu_counts_bytes_read_and_written():
    (row,) = copy_sweep((1,), "cpu")
    assert row.bytes == 2 << 20 and row.us > 0 and torch.isfinite(torch.tensor(row.bytes_per_s))


def test_committed_hardware_gives_a_fit_and_checked_state_steps():
    from labkit.bench.hardware import committed_hardware

    got = committed_hardware()
    assert got["doc"]["device"]["copy_bytes_per_s"] > 1e12 and len(got["fit_rows"]) >= 2
    t0, bw = fit_fixed_cost([HwRow("kernel", r["bytes"], 0, r["us"]) for r in got["fit_rows"]])
    assert t0 > 0 and 1e11 < bw < 2e13
    kinds = {r["what"] for r in got["state_rows"]}
    assert {"gated deltanet step", "attention step", "short conv step"} <= kinds
    assert all(r["rel_err"] is not None and r["rel_err"] < 2e-2 for r in got["state_rows"])
