"""The profiler report: op families on a CPU run, and kernel attribution from synthetic GPU events."""

import os
from types import SimpleNamespace as NS

import torch

import labkit
from labkit.lab.profile import StepProfile, _attribute_kernels, _without_kineto_markers, profile_decode

CPU, GPU = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


def test_cpu_profile_covers_every_mixer_family(capfd):
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32)
    p = profile_decode(model, batch=2, context=9, steps=2, warmup=1)
    assert "profiler_st" not in capfd.readouterr().err  # kineto's USDT start/stop markers
    assert p.step_ms > 0 and p.kernels_per_step is None
    assert {"gdn", "attention", "norm", "mlp", "projections", "lm_head"} <= set(p.family_ms)
    assert abs(sum(share for _, _, share in p.table()) - 1) < 1e-9


def test_only_kineto_markers_are_dropped_from_stderr(capfd):
    with _without_kineto_markers():
        os.write(2, b"USDT:2026-11-30 23:26:25 9986:9986 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"ERROR:2026-11-30 23:26:25 9986:9986 CuptiActivityApi.cpp:90] a real problem\n")
    assert capfd.readouterr().err == "ERROR:2026-11-30 23:26:25 9986:9986 CuptiActivityApi.cpp:90] a real problem\n"


def _op(name, parent=None, kernels=()):
    return NS(name=name, cpu_parent=parent, device_type=CPU, kernels=list(kernels))


def _kernel(name, start, dur):
    return NS(name=name, device_type=GPU, time_range=NS(start=start, end=start + dur))


def test_gpu_kernels_are_attributed_through_their_launching_ops():
    step = _op("labkit::step")
    gdn = _op("labkit::gdn", step)
    proj = _op("aten::linear", gdn, [NS(name="sm90_xmma_gemm_bf16", duration=4.0)])
    core = _op("aten::mul", gdn, [NS(name="elementwise_kernel", duration=1.0)])
    head = _op("aten::linear", step, [NS(name="gemv2T_kernel", duration=3.0)])
    device = [_kernel("sm90_xmma_gemm_bf16", 10.0, 4.0), _kernel("elementwise_kernel", 20.0, 1.0),
              _kernel("gemv2T_kernel", 30.0, 3.0)]
    step.time_range = NS(start=0.0, end=40.0)
    # kineto's GPU-timeline copy of the step's record_function range: not a kernel, not busy time
    annotation = NS(name="labkit::step", device_type=GPU, time_range=NS(start=5.0, end=45.0), is_user_annotation=True)
    events = [step, gdn, proj, core, head, annotation, *device]
    fams = dict.fromkeys(["projections", "gdn", "lm_head", "other"], 0.0)
    result = StepProfile("m", "reference", 1, 0, "cuda", step_ms=0.04, kernels_per_step=None, busy_ms=None)
    _attribute_kernels(events, 1, fams, result)
    assert fams == {"projections": 0.004, "gdn": 0.001, "lm_head": 0.003, "other": 0.0}
    assert result.kernels_per_step == 3
    assert abs(result.busy_ms - 0.008) < 1e-12
    assert result.tensor_core_share == 0.5  # the gemm, not the gemv
    assert [s.family for s in result.timeline] == ["projections", "gdn", "lm_head"]
    assert result.timeline[0].start_us == 0.0


def test_kernels_launched_outside_aten_are_counted_and_named():
    # the fused backends launch Triton kernels directly: no aten op carries them
    embed = _op("aten::embedding", None, [NS(name="indexSelectSmallIndex", duration=1.0)])
    device = [_kernel("indexSelectSmallIndex", 0.0, 1.0), _kernel("_linear_kernel", 2.0, 5.0),
              _kernel("_gdn_decode_kernel", 8.0, 2.0), _kernel("_linear_kernel", 11.0, 3.0)]
    fams = dict.fromkeys(["projections", "gdn", "other", "embedding"], 0.0)
    result = StepProfile("m", "fused", 1, 0, "cuda", step_ms=0.02, kernels_per_step=None, busy_ms=None)
    _attribute_kernels([embed, *device], 1, fams, result)
    assert result.kernels_per_step == 4
    assert fams["projections"] == 0.008 and fams["gdn"] == 0.002 and fams["other"] == 0.001
    assert abs(result.busy_ms - 0.011) < 1e-12 and abs(result.idle_ms - 0.009) < 1e-12
