"""The prefill's element-wise kernels (labkit.ops.prefill_fusions) against their references, on
irregular shapes (batch 3, odd widths and lengths, grouped GDN heads, head dims that are not powers
of two). Every tensor the kernels allocate is poisoned with NaN first (torch.empty patched inside
the module), so an element a kernel fails to write fails the comparison."""

import pytest
import torch

from conftest import poison_empty, rel_err
from labkit.ops import prefill_fusions as pf
from labkit.ops.mixers import (GdnDims, attention_inputs_ref, gdn_inputs_ref, norm_rope_ref, output_gate_ref, project_ref,
                               short_conv_ref, swiglu_ref)
from labkit.ops.rope import rope_inv_freq
from labkit.ops.norm import gated_rms_norm_ref, rms_norm_ref

BOUND = {torch.float32: 1e-6, torch.bfloat16: 8e-3}  # bf16: one rounding of the result apart at most
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    poison_empty(monkeypatch, pf)


def _randn(*shape, seed, dtype, device, scale=1.0):
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype=dtype, device=device)


@DTYPES
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_rows(dtype, unit_offset, device):
    x = _randn(3, 5, 40, seed=1, dtype=dtype, device=device)
    w = _randn(40, seed=2, dtype=dtype, device=device)
    got = pf.rms_norm_rows(x[:, 1:], w, 1e-6, unit_offset)  # a strided view: copied contiguous first
    want = rms_norm_ref(x[:, 1:], w, 1e-6, unit_offset)
    assert got.dtype == dtype and got.shape == want.shape
    assert rel_err(got, want) < BOUND[dtype]


@DTYPES
@pytest.mark.parametrize("T", [1, 2, 37])
def test_gdn_inputs(dtype, T, device):
    dims = GdnDims(num_k_heads=2, num_v_heads=4, k_head_dim=12, v_head_dim=20)
    B, KW = 3, 4
    proj = _randn(B, T, dims.proj_dim, seed=T, dtype=dtype, device=device)
    state = _randn(B, KW - 1, dims.conv_dim, seed=5, dtype=dtype, device=device)
    conv_w = _randn(dims.conv_dim, KW, seed=6, dtype=dtype, device=device, scale=0.5)
    A_log = _randn(dims.num_v_heads, seed=7, dtype=torch.float32, device=device)
    dt_bias = _randn(dims.num_v_heads, seed=8, dtype=torch.float32, device=device, scale=10.0)  # softplus's branches
    got = pf.gdn_inputs(proj, state, conv_w, A_log, dt_bias, dims)
    want = gdn_inputs_ref(proj, state, conv_w, A_log, dt_bias, dims)
    names = ["q", "k", "v", "g", "beta", "z", "conv_state"]
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, name
        bound = BOUND[dtype] if name in "qkv" else 1e-6  # q, k, v rounded to the dtype (the delta rule's input)
        assert rel_err(a.float(), b.float()) < bound, name
    assert got[0].dtype == dtype and got[3].dtype == torch.float32
    assert torch.equal(got[6], want[6])
    # no state: zeros before the prompt
    for name, a, b in zip(names, pf.gdn_inputs(proj, None, conv_w, A_log, dt_bias, dims),
                          gdn_inputs_ref(proj, None, conv_w, A_log, dt_bias, dims)):
        assert rel_err(a.float(), b.float()) < BOUND[dtype], name


@DTYPES
def test_gated_rms_norm_rows_reads_z_in_place(dtype, device):
    B, T, H, D = 3, 7, 4, 20
    proj = _randn(B, T, 2 * H * D + 5, seed=11, dtype=dtype, device=device)
    z = proj[..., H * D + 3:2 * H * D + 3].reshape(B, T, H, D)  # a strided, unaligned view
    o = _randn(B, T, H, D, seed=12, dtype=dtype, device=device)
    w = _randn(D, seed=13, dtype=dtype, device=device)
    got = pf.gated_rms_norm_rows(o, z, w, 1e-6)
    assert rel_err(got, gated_rms_norm_ref(o, z, w, 1e-6)) < BOUND[dtype]
    one = pf.gated_rms_norm_rows(o[:, :1].contiguous(), z[:, :1], w, 1e-6)  # T = 1: any token stride
    assert rel_err(one, gated_rms_norm_ref(o[:, :1], z[:, :1], w, 1e-6)) < BOUND[dtype]


@DTYPES
@pytest.mark.parametrize("T", [1, 2, 29])
def test_short_conv_prefill(dtype, T, device):
    B, H, KW = 3, 24, 3
    proj = _randn(B, T, 3 * H, seed=T, dtype=dtype, device=device)
    state = _randn(B, KW - 1, H, seed=21, dtype=dtype, device=device)
    w = _randn(H, KW, seed=22, dtype=dtype, device=device)
    for s in (state, None):
        y, new_state = pf.short_conv_prefill(proj, s, w)
        y_ref, new_ref = short_conv_ref(proj, s, w)
        assert y.dtype == dtype and rel_err(y, y_ref) < BOUND[dtype]
        assert torch.equal(new_state, new_ref)


@DTYPES
def test_swiglu_rows(dtype, device):
    gu = _randn(3, 5, 2 * 37, seed=31, dtype=dtype, device=device, scale=3.0)
    got = pf.swiglu_rows(gu)
    want = swiglu_ref(gu)
    assert got.shape == (3, 5, 37) and got.dtype == dtype
    assert rel_err(got, want) < 1e-6  # the same two roundings as torch's ops on the dtype


@DTYPES
@pytest.mark.parametrize("rotated_only", [False, True], ids=["all-angles", "rotated-only"])
@pytest.mark.parametrize("rotary,unit_offset", [(20, False), (6, True)])  # whole head; a part (Qwen3.5)
def test_norm_rope_rows_reads_heads_in_place(dtype, rotary, unit_offset, rotated_only, device):
    B, T, H, D = 3, 5, 3, 20
    proj = _randn(B, T, H * D + 7, seed=41, dtype=dtype, device=device, scale=2.0)
    x = proj[..., 7:].reshape(B, T, H, D)  # a strided, unaligned view
    w = _randn(D, seed=42, dtype=dtype, device=device, scale=0.3)
    positions = (torch.arange(T)[None] + torch.tensor([[0], [3], [1000]])).to(device)  # sequences differ
    inv = rope_inv_freq(rotary, 10000.0, device=device)
    got = pf.norm_rope_rows(x, w, positions, inv, 1e-6, unit_offset, rotated_only=rotated_only)
    want = norm_rope_ref(x, w, positions, inv, 1e-6, unit_offset)
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    assert rel_err(got, want) < BOUND[dtype]
    if rotated_only:  # the same arithmetic on the same values as the all-angles form: the same bits
        assert torch.equal(got, pf.norm_rope_rows(x, w, positions, inv, 1e-6, unit_offset, rotated_only=False))


@DTYPES
@pytest.mark.parametrize("rotary,unit_offset", [(20, False), (6, True)])  # whole head; a part (Qwen3.5)
def test_attention_inputs_norms_rotates_and_writes_the_cache(dtype, rotary, unit_offset, device):
    """q and k normed and rotated, k and v written at each token's position, every other slot kept."""
    B, T, NH, NKV, D, L = 3, 5, 6, 2, 20, 1013
    proj = _randn(B, T, (NH + 2 * NKV) * D + 3, seed=51, dtype=dtype, device=device, scale=2.0)
    q, k, v = (x.reshape(B, T, -1, D) for x in proj[..., 3:].split([NH * D, NKV * D, NKV * D], dim=-1))
    wq, wk = (_randn(D, seed=s, dtype=dtype, device=device, scale=0.3) for s in (52, 53))
    positions = (torch.arange(T)[None] + torch.tensor([[0], [3], [1000]])).to(device)  # rows differ
    inv = rope_inv_freq(rotary, 10000.0, device=device)
    cache = _randn(2, B, NKV, L + 4, D, seed=54, dtype=dtype, device=device)  # views of a longer buffer
    keys, values = cache[0, :, :, :L], cache[1, :, :, :L]
    want_keys, want_values = keys.clone(), values.clone()
    slots = torch.arange(L + 4, device=device).expand(B, -1)
    got_q, got_pos = pf.attention_inputs(q, k, v, wq, wk, positions, inv, 1e-6, unit_offset, keys, values,
                                         key_positions=slots)
    want_q, want_pos = attention_inputs_ref(q, k, v, wq, wk, positions, inv, 1e-6, unit_offset, want_keys, want_values)
    assert got_q.shape == want_q.shape and got_q.dtype == dtype and got_q.is_contiguous()
    assert rel_err(got_q, want_q) < BOUND[dtype]
    assert torch.equal(got_pos, want_pos)
    assert torch.equal(values, want_values)  # v copied as it is, and nothing else touched
    written = torch.zeros(B, L, dtype=torch.bool, device=device).scatter_(1, positions, True)
    assert torch.equal(keys.transpose(1, 2)[~written], want_keys.transpose(1, 2)[~written])
    assert rel_err(keys.transpose(1, 2)[written], want_keys.transpose(1, 2)[written]) < BOUND[dtype]
    # the arithmetic of norm_rope_rows (its row sums may add in another order: tiles of other heights)
    assert rel_err(got_q, pf.norm_rope_rows(q, wq, positions, inv, 1e-6, unit_offset)) < BOUND[dtype]
    rows = torch.arange(B, device=device)[:, None]
    assert rel_err(keys[rows, :, positions], pf.norm_rope_rows(k, wk, positions, inv, 1e-6, unit_offset)) < BOUND[dtype]
    assert torch.isfinite(keys).all() and torch.isfinite(got_q).all()


def test_attention_inputs_refuses_bad_input(device):
    B, T, D = 1, 3, 16
    q, k, v = (torch.zeros(B, T, h, D, device=device) for h in (2, 1, 1))
    w, pos, inv = torch.ones(D, device=device), torch.zeros(B, T, dtype=torch.long, device=device), torch.ones(4, device=device)
    keys, values = torch.zeros(2, B, 1, 8, D, device=device)
    slots = torch.arange(8, device=device).expand(B, -1)
    with pytest.raises(TypeError, match="keys must have dtype"):
        pf.attention_inputs(q, k, v, w, w, pos, inv, 1e-6, False, keys.half(), values, key_positions=slots)
    with pytest.raises(ValueError, match="k and v must both be"):
        pf.attention_inputs(q, k, torch.zeros(B, T, 2, D, device=device), w, w, pos, inv, 1e-6, False, keys, values,
                            key_positions=slots)
    with pytest.raises(ValueError, match="key_positions has 5 slots"):
        pf.attention_inputs(q, k, v, w, w, pos, inv, 1e-6, False, keys, values, key_positions=slots[:, :5])
    with pytest.raises(ValueError, match="must not overlap"):
        pf.attention_inputs(q, k, v, w, w, pos, inv, 1e-6, False, keys, keys, key_positions=slots)


def test_bad_input_is_refused(device):
    dims = GdnDims(1, 1, 16, 16)
    proj = torch.zeros(1, 4, dims.proj_dim + 1, device=device)
    with pytest.raises(ValueError, match="proj must have shape"):
        pf.gdn_inputs(proj, None, torch.zeros(dims.conv_dim, 4, device=device), torch.zeros(1, device=device),
                      torch.zeros(1, device=device), dims)
    with pytest.raises(ValueError, match=r"\[B, T, 3H\]"):
        pf.short_conv_prefill(torch.zeros(1, 4, 10, device=device), None, torch.zeros(3, 3, device=device))
    with pytest.raises(ValueError, match=r"gate \| up"):
        pf.swiglu_rows(torch.zeros(2, 7, device=device))
    with pytest.raises(ValueError, match="eps must be a positive"):
        pf.rms_norm_rows(torch.zeros(2, 8, device=device), torch.ones(8, device=device), 0.0)
    o = torch.zeros(1, 2, 1, 8, device=device)
    with pytest.raises(ValueError, match="unit stride"):
        pf.gated_rms_norm_rows(o, torch.zeros(1, 2, 1, 16, device=device)[..., ::2], torch.ones(8, device=device), 1e-6)


# -- the conv windows written by the kernels, the launch settings, the output gate, the residual GEMM --
def _gdn_case(T, dtype, device, state_dtype=None):
    dims = GdnDims(num_k_heads=2, num_v_heads=3, k_head_dim=12, v_head_dim=20)
    B, KW = 2, 4
    proj = _randn(B, T, dims.proj_dim, seed=T, dtype=dtype, device=device)
    state = _randn(B, KW - 1, dims.conv_dim, seed=5, dtype=state_dtype or dtype, device=device)
    conv_w = _randn(dims.conv_dim, KW, seed=6, dtype=dtype, device=device, scale=0.5)
    A_log = _randn(dims.num_v_heads, seed=7, dtype=torch.float32, device=device)
    dt_bias = _randn(dims.num_v_heads, seed=8, dtype=torch.float32, device=device)
    return (proj, state, conv_w, A_log, dt_bias, dims)


@pytest.mark.parametrize("T", [2, 11])  # shorter than the window (old rows move up), and several blocks
def test_gdn_inputs_updates_the_window_in_place(T, device, scrambled_grid):
    proj, state, *rest = _gdn_case(T, torch.bfloat16, device, state_dtype=torch.float32)
    want = gdn_inputs_ref(proj, state, *rest)
    cache_state = state.clone()
    got = pf.gdn_inputs(proj, cache_state, *rest, update_state=True, block_t=4)
    assert got[6] is cache_state and torch.equal(cache_state, want[6])
    for a, b in zip(got[:5], want[:5]):
        assert rel_err(a.float(), b.float()) < BOUND[torch.bfloat16]


@pytest.mark.parametrize("settings", [dict(block_t=4, num_warps=2, heads_first=False), dict(block_t=64, heads_first=True)])
def test_gdn_inputs_settings_give_the_same_bits(settings, device):
    case = _gdn_case(19, torch.bfloat16, device)
    base = pf.gdn_inputs(*case)
    assert all(torch.equal(a, b) for a, b in zip(pf.gdn_inputs(*case, **settings), base))


def test_gdn_inputs_refuses_bad_settings(device):
    case = _gdn_case(5, torch.float32, device)
    with pytest.raises(ValueError, match="block_t must be a power of two >= the conv's 3"):
        pf.gdn_inputs(*case, block_t=2)
    with pytest.raises(ValueError, match="block_t must be a power of two"):
        pf.gdn_inputs(*case, block_t=12)
    with pytest.raises(ValueError, match="num_warps"):
        pf.gdn_inputs(*case, num_warps=3)


@pytest.mark.parametrize("T", [1, 29])
def test_short_conv_prefill_updates_the_window_in_place(T, device):
    B, H, KW = 2, 24, 3
    proj = _randn(B, T, 3 * H, seed=T, dtype=torch.bfloat16, device=device)
    state = _randn(B, KW - 1, H, seed=21, dtype=torch.float32, device=device)  # rounded to bf16 on the way, as torch.cat does
    w = _randn(H, KW, seed=22, dtype=torch.bfloat16, device=device)
    y_ref, new_ref = short_conv_ref(proj, state, w)
    cache_state = state.clone()
    y, new_state = pf.short_conv_prefill(proj, cache_state, w, update_state=True)
    assert new_state is cache_state and torch.equal(cache_state, new_ref)
    assert rel_err(y, y_ref) < BOUND[torch.bfloat16]


@DTYPES
def test_sigmoid_gate_rows_reads_strided_inputs(dtype, device):
    B, T, H, D = 3, 7, 2, 20
    o = _randn(B, H, T, D, seed=51, dtype=dtype, device=device).transpose(1, 2)  # the attention core's layout
    proj = _randn(B, T, H * D + 3, seed=52, dtype=dtype, device=device, scale=3.0)
    gate = proj[..., 3:].reshape(B, T, H, D)  # a strided, unaligned view
    got = pf.sigmoid_gate_rows(o, gate)
    want = output_gate_ref(o, gate)
    assert got.shape == (B, T, H, D) and got.dtype == dtype and got.is_contiguous()
    assert rel_err(got, want) < 1e-6  # the same two roundings as torch's ops on the dtype
    spaced = _randn(B, T, H, 2 * D, seed=53, dtype=dtype, device=device)[..., ::2]  # a stride of 2 along D
    assert rel_err(pf.sigmoid_gate_rows(o, spaced), output_gate_ref(o, spaced)) < 1e-6


def test_a_nan_in_the_gate_is_not_hidden(device):
    o = torch.ones(1, 3, 1, 8, device=device)
    gate = torch.zeros(1, 3, 1, 8, device=device)
    gate[0, 1, 0, 5] = float("nan")
    got = pf.sigmoid_gate_rows(o, gate)
    assert got[0, 1, 0, 5].isnan() and rel_err(got, output_gate_ref(o, torch.zeros_like(gate))) == float("inf")


@DTYPES
def test_project_residual_adds_in_the_gemm(dtype, device):
    x = _randn(3, 5, 24, seed=61, dtype=dtype, device=device)
    w = _randn(40, 24, seed=62, dtype=dtype, device=device, scale=0.2)
    h = _randn(3, 5, 40, seed=63, dtype=dtype, device=device)
    want = project_ref(x, w, h)
    got = pf.project_residual(x, w, h)
    assert got is h and rel_err(got, want) < BOUND[dtype]  # the sum rounded once: an ulp at most apart
    assert torch.equal(pf.project_residual(x, w), project_ref(x, w))  # no residual: the projection alone
    with pytest.raises(ValueError, match="does not give residual's shape"):
        pf.project_residual(x, w, h[..., :39].contiguous())


@DTYPES
@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (2, 40)], ids=["21-rows", "1-row", "80-rows-cublas"])
def test_gate_up_swiglu(dtype, shape, device, monkeypatch):
    """The MLP's gate|up with SwiGLU: up to max_rows rows one skinny GEMM with the activation in its
    epilogue (its output poisoned before it runs), more rows cuBLAS and the SwiGLU kernel; both the
    reference's function. Odd widths (K = 40, W = 37): masked tiles."""
    from labkit.ops import linear as lin

    poison_empty(monkeypatch, lin)
    x = _randn(*shape, 40, seed=71, dtype=dtype, device=device)
    w = _randn(2 * 37, 40, seed=72, dtype=dtype, device=device, scale=0.3)
    want = swiglu_ref(torch.nn.functional.linear(x, w))
    got = pf.gate_up_swiglu(x, w, max_rows=64)
    assert got.shape == (*shape, 37) and got.dtype == dtype
    # gate and up rounded to the dtype before silu as the reference; only the sums' order differs
    assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(pf.gate_up_swiglu(x, w, max_rows=0), pf.swiglu_rows(torch.nn.functional.linear(x, w)))


@DTYPES
def test_gate_up_swiglu_of_a_prompt_takes_the_tiled_gemm_from_min_rows(dtype, device, monkeypatch):
    """With the prompt_gate_up settings on, a 16-bit prompt of min_rows rows or more runs
    gemm_swiglu at their blocking (its output poisoned); fewer rows, or a float32 model, do not."""
    from labkit import tuning
    from labkit.ops import gemm_swiglu as gs

    poison_empty(monkeypatch, gs)
    calls = []
    real = gs.gemm_swiglu
    monkeypatch.setattr(pf, "gemm_swiglu", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    prompt = {**tuning.HEURISTICS["prompt_gate_up"], "min_rows": 70, "block_m": 32, "block_n": 16, "block_k": 16,
              "num_warps": 4, "num_stages": 2, "persistent": True}
    w = _randn(2 * 24, 40, seed=73, dtype=dtype, device=device, scale=0.3)
    for rows, fused in ((69, False), (75, dtype != torch.float32)):
        x = _randn(rows, 40, seed=74, dtype=dtype, device=device)
        got = pf.gate_up_swiglu(x, w, max_rows=8, prompt=prompt)
        assert rel_err(got, swiglu_ref(torch.nn.functional.linear(x, w))) < (1e-5 if dtype == torch.float32 else 1e-2)
        assert len(calls) == int(fused)
    if calls:
        assert calls[0] == gs.GemmConfig(32, 16, 16, 8, 4, 2, persistent=True)
