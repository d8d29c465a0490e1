"""Notebook 02's evidence on the GPU: the compiled Gated DeltaNet kernel is found per block_v and
reports its registers, and the host-cost and timeline parts return consistent numbers.

These time things but assert no time against a bound: positive times, registers and residency read
from the compiled kernel, sums that hold by construction, and the profiler seeing this process's own
kernels. Sharing the GPU and the CPU with other workers moves the numbers, not those facts, so they
run beside the other tests (not ``serial``)."""

from labkit.bench import fusion_evidence as fe


def test_block_v_rows_read_the_compiled_kernel(real_model):
    model = real_model("qwen3.5-0.8b")
    rows = fe.gdn_block_v_rows(model, (1,), (16, 128))
    by_bv = {r["block_v"]: r for r in rows}
    heads = model.cfg.gdn_num_v_heads
    assert by_bv[128]["programs"] == heads and by_bv[16]["programs"] == heads * model.cfg.gdn_v_head_dim // 16
    for r in rows:
        assert r["n_regs"] > 0 and r["n_spills"] >= 0 and r["num_warps"] >= 4 and r["us"] > 0
        assert r["resident_per_sm"] >= 1, f"block_v={r['block_v']}: a program that fits no SM cannot have run"


def test_host_costs_add_up(real_model):
    h = fe.host_costs(real_model("lfm2-350m"), calls=200, steps=3)
    assert h["bare_triton_us"] > 0 and h["labkit_checks_us"] > 0
    assert abs(h["linear_us"] - h["labkit_checks_us"] - h["triton_launch_us"]) < 1e-9
    step = h["step"]
    assert step["kernels"] > 10 and abs(sum(step["groups_us"].values()) - step["step_us"]) < 1e-6 * step["step_us"]


def test_pdl_timelines_see_every_kernel(real_model):
    out = fe.pdl_timelines(real_model("lfm2-350m"), 1)
    for backend, run in out.items():
        assert run["spans"], f"{backend}: the profiler saw no kernels of the graph"
        assert run["summary"]["kernels"] == len(run["spans"])
