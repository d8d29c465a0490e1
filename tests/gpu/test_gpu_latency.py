"""The pointer chase of ``labkit bench latency`` on a GPU: both loading styles reach the row the
Python walk reaches on a large table, and the latencies step up with the memory level (an L1-sized
table, an L2-sized one, one many times the L2). Marked ``gpu`` by tests/gpu/conftest.py.

The steps are timed inside the kernel (the global timer), so they are only as clean as the GPU is
quiet: another process's kernels evict the L2 and take time slices in the middle of a chase (with
8 workers the L2 step failed). That test is ``serial``: it runs alone (tests/gpu/conftest.py)."""

import pytest
import torch

from labkit.bench import latency as lat


def test_the_chase_is_right_on_the_gpu():
    for pattern in lat.PATTERNS:
        table = lat.chain_table((1 << 20) + 128 * 5, pattern, "cuda", seed=5)  # an odd row count
        for style in lat.STYLES:
            assert int(lat.chase(table, 11, 1000, style).item()) == lat.chase_ref(table, 11, 1000), (pattern, style)


@pytest.mark.serial
def test_latency_steps_up_with_the_memory_level():
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = {size: lat.measure_latency(size, "random", "pointer", steps=2048, repeats=3)
            for size in (16 << 10, max(1 << 20, l2 // 16 // 128 * 128), 8 * l2 // (1 << 20) * (1 << 20))}
    assert all(r.error is None for r in rows.values()), [r.error for r in rows.values()]
    ns = [r.ns_per_load for r in rows.values()]
    assert ns[0] < ns[1] < ns[2], ns
    stride = lat.measure_latency(8 * l2 // (1 << 20) * (1 << 20) + 128, "stride", "descriptor", steps=2048, repeats=3)
    assert stride.error is None and stride.ns_per_load > ns[1], (stride.error, stride.ns_per_load, ns)
