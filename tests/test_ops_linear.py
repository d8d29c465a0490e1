"""The skinny-GEMM kernel (labkit.ops.linear) against the reference norm + F.linear, on irregular shapes.

Bounds: float32 1e-5 (only the summation order differs); bfloat16 1e-2 (the reference also
rounds the projection before the residual add / SwiGLU, which the kernel does in float32).
"""

import math

import pytest
import torch

from conftest import rel_err
from labkit import PRESETS
from labkit.ops import linear as linear_mod
from labkit.ops.linear import LinearConfig, LinearWorkspace, linear, linear_config, linear_ref

BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2}

# (rows, config): the GEMV loop with K masks (block_k 32 does not divide 72 or 80) and an uneven
# split-K, with the whole row in one K tile (block_k 128 > K: the norm's statistics come from the
# peeled first tile), and over three rows of one program each; the tl.dot loop with one and two
# splits, and with two row tiles (M = 17).
CASES = [
    (1, LinearConfig(1, 64, 32)),
    (1, LinearConfig(1, 16, 128)),
    (3, LinearConfig(1, 32, 32)),
    (1, LinearConfig(1, 16, 16, split_k=3)),
    (3, LinearConfig(16, 64, 32)),
    (3, LinearConfig(16, 32, 16, split_k=2)),
    (17, LinearConfig(16, 64, 64)),
]


def _data(m, n, k, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    norm = 1.0 + 0.2 * torch.randn(k, generator=g)
    res = torch.randn(m, n // 2 if n % 2 == 0 else n, generator=g)
    return [t.to(dtype=dtype, device=device) for t in (x, w, norm, res)]


def _nan(*shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,config", CASES)
@pytest.mark.parametrize("n,k", [(37, 72), (96, 80)])
def test_norm_prologue_both_conventions(m, config, n, k, dtype, device):
    x, w, norm, _ = _data(m, n, k, dtype, device)
    for unit in (False, True):
        out = _nan(m, n, dtype=dtype, device=device)
        linear(x, w, out=out, norm_weight=norm, norm_eps=1e-5, norm_unit_offset=unit, config=config)
        ref = linear_ref(x, w, norm_weight=norm, norm_eps=1e-5, norm_unit_offset=unit)
        assert rel_err(out, ref) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,config", CASES)
def test_swiglu_epilogue(m, config, dtype, device):
    x, w, _, _ = _data(m, 2 * 45, 72, dtype, device, seed=1)  # I = 45
    out = _nan(m, 45, dtype=dtype, device=device)
    linear(x, w, out=out, swiglu=True, config=config)
    assert rel_err(out, linear_ref(x, w, swiglu=True)) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,config", CASES)
def test_residual_epilogue_in_place(m, config, dtype, device):
    x, w, norm, res = _data(m, 96, 80, dtype, device, seed=2)
    res = res[:, :48].contiguous()
    w = w[:48].contiguous()
    expect = linear_ref(x, w, residual=res, norm_weight=norm, norm_eps=1e-6, norm_unit_offset=True)
    h = res.clone()
    got = linear(x, w, residual=h, norm_weight=norm, norm_eps=1e-6, norm_unit_offset=True, config=config)
    assert got.data_ptr() == h.data_ptr()
    assert rel_err(h, expect) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,config", CASES)
def test_short_conv_epilogue(m, config, dtype, device):
    """LFM2's in_proj with the gated short conv fused after it: output and shifted state."""
    from labkit.ops.short_conv import short_conv_decode_ref

    x, w, norm, _ = _data(m, 3 * 40, 72, dtype, device, seed=4)  # H = 40 channels
    taps = 3 if m == 1 else 4
    state = torch.randn(m, taps - 1, 40, generator=torch.Generator().manual_seed(5)).to(dtype=dtype, device=device)
    conv_w = torch.randn(40, taps, generator=torch.Generator().manual_seed(6)).to(dtype=dtype, device=device)
    proj = linear_ref(x, w, norm_weight=norm, norm_eps=1e-5)
    y_ref, state_ref = short_conv_decode_ref(proj, state, conv_w)
    out = torch.full((m, 40), float("nan"), dtype=dtype, device=device)
    linear(x, w, out=out, norm_weight=norm, norm_eps=1e-5, short_conv=(state, conv_w), config=config)
    assert rel_err(out, y_ref) < BOUND[dtype]
    assert rel_err(state, state_ref) < BOUND[dtype] / 10


def test_split_k_counters_reset_and_results_repeat(device):
    x, w, _, _ = _data(3, 37, 72, torch.float32, device, seed=3)
    cfg = LinearConfig(16, 16, 16, split_k=4)
    need_p, need_c = LinearWorkspace.needed(3, 37, cfg)
    ws = LinearWorkspace.allocate(need_p, need_c + 5, device)
    a = linear(x, w, config=cfg, workspace=ws)
    assert int(ws.counters.abs().sum()) == 0
    b = linear(x, w, config=cfg, workspace=ws)
    assert torch.equal(a, b)  # deterministic: partials are summed in a fixed order


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_k_over_several_row_tiles(dtype, device, scrambled_grid):
    """The tl.dot loop in its default mode with K split three ways over three row tiles (M = 37 in
    tiles of 16, the last partial): each row tile keeps its own partials and arrival counters, so
    the last of *its* splits sums them, whatever order the programs run in."""
    x, w, norm, _ = _data(37, 48, 72, dtype, device, seed=7)
    cfg = LinearConfig(16, 32, 16, split_k=3)
    out = _nan(37, 48, dtype=dtype, device=device)
    linear(x, w, out=out, norm_weight=norm, norm_eps=1e-5, config=cfg)
    assert rel_err(out, linear_ref(x, w, norm_weight=norm, norm_eps=1e-5)) < BOUND[dtype]
    h = torch.randn(37, 48, generator=torch.Generator().manual_seed(8)).to(dtype=dtype, device=device)
    expect = linear_ref(x, w, residual=h, norm_weight=norm, norm_eps=1e-5)
    linear(x, w, residual=h, norm_weight=norm, norm_eps=1e-5, config=cfg)
    assert rel_err(h, expect) < BOUND[dtype]


def test_gpu_heuristic_fills_the_gpu_at_real_shapes(monkeypatch):
    """The non-interpreter heuristic (no measured table given): valid configs, no K masks, and
    enough programs for 132 SMs."""
    monkeypatch.setattr(linear_mod, "interpreting", lambda: False)
    monkeypatch.setattr(linear_mod, "num_sms", lambda: 132)
    shapes = set()
    for name in ("lfm2-350m", "qwen3.5-0.8b"):
        c = PRESETS[name]
        H, I = c.hidden_size, c.intermediate_size
        shapes |= {(3 * H, H, False), (c.q_size + 2 * c.kv_size + (c.q_size if c.attn_output_gate else 0), H, False),
                   (H, c.q_size, False), (I, H, True), (H, I, False), (c.vocab_size, H, False)}
        if c.gdn_num_v_heads:
            shapes |= {(c.gdn_conv_dim + c.gdn_value_dim + 2 * c.gdn_num_v_heads, H, False), (H, c.gdn_value_dim, False)}
    for m in (1, 16, 64):
        for n, k, swiglu in sorted(shapes):
            cfg = linear_config(m, n, k, row_blocks=2 if swiglu else 1)
            if n == 3 * H:  # LFM2's in_proj also runs with the short conv as its epilogue
                conv_cfg = linear_config(m, H, k, row_blocks=3)
                programs = math.ceil(H / conv_cfg.block_n) * conv_cfg.split_k * math.ceil(m / conv_cfg.block_m)
                assert k % conv_cfg.block_k == 0 and programs >= 128, (m, H, k, conv_cfg)
            k_split = math.ceil(math.ceil(k / cfg.split_k) / cfg.block_k) * cfg.block_k
            assert k % cfg.block_k == 0 and k_split * cfg.split_k == k, (m, n, k, cfg)
            programs = math.ceil(n / cfg.block_n) * cfg.split_k * math.ceil(m / cfg.block_m)
            assert programs >= 128, (m, n, k, cfg, programs)
            assert (cfg.block_m == 1) == (m == 1)


def test_bad_inputs_are_refused(device):
    x, w, norm, _ = _data(2, 37, 72, torch.float32, device)
    with pytest.raises(TypeError, match="x must have dtype"):
        linear(x.double(), w)
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 72\]"):
        linear(x[:, :70].contiguous(), w)
    with pytest.raises(ValueError, match="contiguous"):
        linear(x, torch.randn(72, 37, device=device).t())
    with pytest.raises(ValueError, match="16-byte aligned"):
        linear(torch.empty(2 * 72 + 1, device=device)[1:].view(2, 72), w)
    with pytest.raises(ValueError, match="divisible by 2"):
        linear(x, w, swiglu=True)
    with pytest.raises(ValueError, match="cannot be combined"):
        linear(x, w[:36], swiglu=True, residual=torch.zeros(2, 18, device=device))
    with pytest.raises(ValueError, match="divisible by 3"):
        linear(x, w[:35], short_conv=(torch.zeros(2, 2, 12, device=device), torch.zeros(12, 3, device=device)))
    with pytest.raises(ValueError, match="conv_state must have shape"):
        linear(x, w[:36], short_conv=(torch.zeros(2, 3, 12, device=device), torch.zeros(12, 3, device=device)))
    with pytest.raises(ValueError, match="norm_weight must have shape"):
        linear(x, w, norm_weight=norm[:71])
    with pytest.raises(ValueError, match="norm_eps"):
        linear(x, w, norm_weight=norm, norm_eps=0.0)
    with pytest.raises(ValueError, match="one device"):
        linear(x, w, norm_weight=torch.empty(72, device="meta"))
    buf = torch.zeros(2 * 72 + 2 * 37, device=device)
    with pytest.raises(ValueError, match="overlap"):
        linear(buf[:144].view(2, 72), w, out=buf[128 : 128 + 74].view(2, 37))
    with pytest.raises(ValueError, match="workspace too small"):
        linear(x, w, config=LinearConfig(16, 16, 16, split_k=2), workspace=LinearWorkspace.allocate(1, 1, device))
    with pytest.raises(ValueError, match="power of two"):
        LinearConfig(1, 24, 64)
    with pytest.raises(ValueError, match="block_m"):
        LinearConfig(8, 16, 64)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    from labkit.ops import launch

    monkeypatch.setattr(launch, "INTERPRET", False)
    x, w, _, _ = _data(1, 37, 72, torch.float32, "cpu")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        linear(x, w)


def test_tuned_table_is_used_and_consistent(monkeypatch):
    """Entries measured on a GPU (the H200's file) replace the heuristic for their shapes; each is a
    valid blocking of its own key (a K tail is allowed: the kernel masks it, and the GPU tests cover
    it). Shapes without an entry get the heuristic; an LM head's greedy key has the same entry as its
    logits key, or none."""
    from labkit.tuning import TUNING_DIR, linear_table

    monkeypatch.setattr(linear_mod, "interpreting", lambda: False)
    table = linear_table(TUNING_DIR / "nvidia-h200.json")
    assert table, "the file holds the H200 sweep's winners"
    for key, cfg in table.items():
        assert linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks, argmax=key.argmax, table=table) is cfg
        other = key._replace(argmax=not key.argmax)
        if other in table:  # an LM head's logits and greedy keys: one blocking, so both sum in the same order
            assert table[other] == cfg
        else:
            assert linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks, argmax=not key.argmax,
                                 table=table) == linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks,
                                                               argmax=not key.argmax)
        assert cfg.block_m == key.m_bucket and linear_mod.m_bucket(key.m_bucket) == key.m_bucket
        assert cfg.block_k <= triton_next_pow2(key.k) and math.ceil(key.k / cfg.block_k) % cfg.split_k == 0, cfg
    some = next(iter(table))
    assert linear_config(some.m_bucket, some.n + 1, some.k, row_blocks=some.row_blocks, table=table) == linear_config(
        some.m_bucket, some.n + 1, some.k, row_blocks=some.row_blocks)


def triton_next_pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_unfused_matches_the_reference(dtype, device):
    """linear_unfused (one-kernel norm, cuBLAS, one-kernel epilogue): every epilogue against
    linear_ref on odd shapes (3 rows, 37 or 40 outputs, K = 72), outputs poisoned, the residual
    in place, the conv state shifted as the fused kernel shifts it."""
    from labkit.ops.linear import linear_unfused
    from labkit.ops.short_conv import short_conv_decode_ref

    x, w, norm, _ = _data(3, 3 * 40, 72, dtype, device, seed=10)
    res = torch.randn(3, 3 * 40, generator=torch.Generator().manual_seed(11)).to(dtype=dtype, device=device)
    for unit in (False, True):
        kw = dict(norm_weight=norm, norm_eps=1e-5, norm_unit_offset=unit)
        out = _nan(3, 3 * 40, dtype=dtype, device=device)
        linear_unfused(x, w, out=out, **kw)
        assert rel_err(out, linear_ref(x, w, **kw)) < BOUND[dtype]
        in_place = res.clone()
        assert linear_unfused(x, w, residual=in_place, **kw).data_ptr() == in_place.data_ptr()
        assert rel_err(in_place, linear_ref(x, w, residual=res, **kw)) < BOUND[dtype]
        out = _nan(3, 3 * 40, dtype=dtype, device=device)
        linear_unfused(x, w, out=out, residual=res, **kw)
        assert rel_err(out, linear_ref(x, w, residual=res, **kw)) < BOUND[dtype]
        out = _nan(3, 60, dtype=dtype, device=device)
        linear_unfused(x, w, out=out, swiglu=True, **kw)
        assert rel_err(out, linear_ref(x, w, swiglu=True, **kw)) < BOUND[dtype]
    state = torch.randn(3, 2, 40, generator=torch.Generator().manual_seed(12)).to(dtype=dtype, device=device)
    conv_w = torch.randn(40, 3, generator=torch.Generator().manual_seed(13)).to(dtype=dtype, device=device)
    y_ref, state_ref = short_conv_decode_ref(linear_ref(x, w, norm_weight=norm), state, conv_w)
    out = _nan(3, 40, dtype=dtype, device=device)
    linear_unfused(x, w, out=out, norm_weight=norm, short_conv=(state, conv_w))
    assert rel_err(out, y_ref) < BOUND[dtype]
    assert rel_err(state, state_ref) < BOUND[dtype] / 10
    with pytest.raises(ValueError, match="cannot be combined"):
        linear_unfused(x, w, swiglu=True, short_conv=(state, conv_w))


def test_batches_past_64_take_row_tiles_of_64(device):
    # bucket 64's tiles serve any batch past 64: several row tiles, each row written exactly once
    assert [linear_mod.m_bucket(m) for m in (1, 2, 16, 17, 64, 65, 256)] == [1, 16, 16, 32, 64, 64, 64]
    m, n, k = 70, 48, 40
    x, w, norm, _ = _data(m, n, k, torch.float32, device, seed=5)
    config = linear_config(m, n, k)
    assert config.block_m == 64
    out = torch.full((m, n), float("nan"), device=device)
    linear(x, w, out=out, norm_weight=norm, config=config)
    assert rel_err(out, linear_ref(x, w, norm_weight=norm)) < BOUND[torch.float32]
