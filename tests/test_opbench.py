"""labkit.opbench: the fused projections and the Gated DeltaNet step checked at model shapes
(tiny presets here), and its timers refuse a device they cannot time on."""

import pytest
import torch

import labkit
from labkit import opbench


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_every_linear_case_matches_its_reference(preset, device):
    model = labkit.build(preset, dtype=torch.float32, device=device, seed=1)
    cases = opbench.linear_cases(model)
    names = [c.name for c in cases]
    assert "mlp.gate_up+norm+swiglu" in names and "lm_head+norm" in names
    assert ("conv.in_proj+norm+short_conv" in names) == (preset == "tiny-lfm2")
    for case in cases:
        for batch in (1, 3):
            assert opbench.check_linear(model, case, batch) < 1e-4, (case.name, batch)


def test_case_shapes_and_the_no_norm_twin():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    case = next(c for c in opbench.linear_cases(model) if c.swiglu)
    assert case.row_blocks == 2 and case.outputs * 2 == case.weight.shape[0]
    bare = case.without_norm()
    assert bare.norm_weight is None and bare.swiglu and "(no norm)" in bare.name and "+norm" not in bare.name


def test_gdn_step_matches_its_reference_for_every_block_v(device):
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device=device, seed=2)
    whole_head = 1 << (model.cfg.gdn_v_head_dim - 1).bit_length()  # one program per head
    for block_v in (None, 8, whole_head):
        assert opbench.check_gdn(model, 3, block_v) < 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_timers_need_a_gpu():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="CUDA"):
        opbench.time_linear(model, opbench.linear_cases(model)[0], 1)
    with pytest.raises(RuntimeError, match="CUDA"):
        opbench.time_gdn(model, 1)
    with pytest.raises(ValueError, match="no Gated DeltaNet"):
        opbench.check_gdn(labkit.build("tiny-lfm2", dtype=torch.float32, seed=0), 1)
