"""A prefix-cache hit's tail at the real shapes on a GPU: its attention (labkit.ops.tail_attention)
after 4,096 cached tokens and its MLP gate|up with SwiGLU in one skinny GEMM
(labkit.ops.prefill_fusions.gate_up_swiglu), both dtypes, against their references; every buffer
the ops allocate poisoned with NaN. Bounds: bf16 1e-2, float32 1e-5."""

import pytest
import torch
import torch.nn.functional as F

from conftest import poison_empty
from labkit.bench.ops import rel_err
from labkit.config import PRESETS
from labkit.ops import linear as lin
from labkit.ops import prefill_fusions as pf
from labkit.ops import tail_attention as ta
from labkit.ops.mixers import attend_ref, swiglu_ref

BOUND = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
DTYPES = pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
PRESET = pytest.mark.parametrize("preset", ["qwen3.5-0.8b", "lfm2-350m"])


@DTYPES
@PRESET
@pytest.mark.parametrize("T,start", [(64, 4096), (37, 4001)])
def test_tail_attention(preset, dtype, T, start, monkeypatch):
    poison_empty(monkeypatch, ta)
    cfg = PRESETS[preset]
    nh, nkv, D, L = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 4224
    gen = torch.Generator(device="cuda").manual_seed(T)
    q = torch.randn(1, T, nh, D, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    keys, values = (torch.randn(1, nkv, L, D, device="cuda", generator=gen).to(dtype) for _ in range(2))
    positions = (start + torch.arange(T, device="cuda"))[None]
    key_positions = torch.arange(L, device="cuda")[None]
    want = attend_ref(q.float(), keys.float(), values.float(), positions, key_positions)
    got = ta.attend_tail(q, keys, values, positions, key_positions, start=start)
    assert rel_err(got.float(), want) < BOUND[dtype]


@DTYPES
@PRESET
@pytest.mark.parametrize("rows", [64, 17, 1])
def test_gate_up_swiglu(preset, dtype, rows, monkeypatch):
    poison_empty(monkeypatch, lin)
    cfg = PRESETS[preset]
    K, W = cfg.hidden_size, cfg.intermediate_size
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, K, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(2 * W, K, device="cuda", generator=gen) * K**-0.5).to(dtype)
    want = swiglu_ref(F.linear(x, w))
    got = pf.gate_up_swiglu(x, w)
    assert rel_err(got.float(), want.float()) < BOUND[dtype]
