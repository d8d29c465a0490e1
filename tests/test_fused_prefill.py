"""The fused backends' prefill against the reference model, on the tiny presets.

The fused prefill is the model's own forward with two inner cores swapped (labkit.decode.fused_prefill.prefill_cores):
the chunked Triton delta rule, which updates the cache's recurrent state in place, and SDPA's causal
form of attention for prompts that start the sequences. Compared here: the logits (every position
and the last), and the cache it leaves (conv windows, recurrent states, keys and values), on
irregular prompt lengths at batch 3. float32 within 1e-5; bfloat16 about as close to a float32 run
of the same weights as the bfloat16 reference is. The KV cache is poisoned first: positions the
prompt fills must be written, the positions past it must not be.
"""

import copy
import os
import subprocess
import sys

import pytest
import torch

import labkit
from conftest import rel_err
from labkit.decode.registry import make_decoder
from labkit.ops.mixers import attend_causal, attend_continuing, attend_ref, store_kv_ref, store_kv_slice

BATCH = 3


def _prompt(model, length, seed=0, batch=BATCH):
    ids = torch.randint(0, model.cfg.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))
    return ids.to(model.device)


def _close(got, want, truth=None):
    """float32 (no truth): within 1e-5. bf16: about as close to the float32 truth as the bf16 reference."""
    if truth is None:
        return rel_err(got, want) < 1e-5
    return rel_err(got, truth) < 1.5 * rel_err(want, truth) + 5e-3 and rel_err(got, want) < 5e-2


def _poison_kv(cache):
    for buf in [*cache.keys.values(), *cache.values.values()]:
        buf.fill_(float("nan"))


def _states(cache):
    """The cache's conv windows, recurrent states, and keys and values of its filled positions."""
    n = cache.seq_len
    return {
        **{f"conv{i}": s for i, s in cache.conv_states.items()},
        **{f"state{i}": s for i, s in cache.recurrent_states.items()},
        **{f"keys{i}": s[:, :, :n] for i, s in cache.keys.items()},
        **{f"values{i}": s[:, :, :n] for i, s in cache.values.items()},
    }


@pytest.mark.parametrize("length", [1, 63, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_fused_prefill_matches_the_reference(preset, dtype, length, device):
    model = labkit.build(preset, dtype=dtype, device=device, seed=7)
    ids = _prompt(model, length, seed=length)
    max_len = length + 4
    ref_cache = model.new_cache(BATCH, max_len)
    fused = make_decoder("fused", model, model.new_cache(BATCH, max_len))
    _poison_kv(ref_cache)
    _poison_kv(fused.cache)
    want = model(ids, cache=ref_cache)
    got = fused.forward_prefill(ids)
    truth = truth_cache = None
    if dtype != torch.float32:
        m32 = copy.deepcopy(model).float()
        truth_cache = m32.new_cache(BATCH, max_len)
        truth = m32(ids, cache=truth_cache)
    assert got.shape == want.shape == (BATCH, length, model.cfg.vocab_size)
    assert _close(got, want, truth)
    assert _close(got[:, -1], want[:, -1], None if truth is None else truth[:, -1])
    assert fused.cache.host_lengths == (length,) * BATCH and fused.cache.lengths.tolist() == [length] * BATCH
    ref_states, truth_states = _states(ref_cache), truth_cache and _states(truth_cache)
    for name, state in _states(fused.cache).items():
        assert _close(state.float(), ref_states[name].float(), truth_states and truth_states[name]), name
    for buf in [*fused.cache.keys.values(), *fused.cache.values.values()]:
        assert buf[:, :, length:].isnan().all()  # nothing written past the prompt


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_a_prompt_that_continues_the_cache(preset, device):
    """A second prefill starts from the cached states: the delta rule from the recurrent state, the
    attention through the explicit mask (the sequences no longer start at position 0). Its last-token
    logits (the path generate takes) match the reference's."""
    model = labkit.build(preset, dtype=torch.float32, device=device, seed=4)
    first, second = _prompt(model, 5, seed=1), _prompt(model, 40, seed=2)
    ref = make_decoder("reference", model, model.new_cache(BATCH, 50))
    fused = make_decoder("fused", model, model.new_cache(BATCH, 50))
    assert rel_err(fused.prefill(first), ref.prefill(first)) < 1e-5
    got, want = fused.prefill(second), ref.prefill(second)
    assert got.shape == (BATCH, model.cfg.vocab_size) and rel_err(got, want) < 1e-5
    assert fused.cache.host_lengths == (45,) * BATCH
    ref_states = _states(ref.cache)
    for name, state in _states(fused.cache).items():
        assert rel_err(state, ref_states[name]) < 1e-5, name


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_a_prompt_longer_than_the_cache_is_refused_before_anything_is_written(preset, device):
    model = labkit.build(preset, dtype=torch.float32, device=device, seed=0)
    cache = model.new_cache(1, max_len=8)
    decoder = make_decoder("fused", model, cache)
    with pytest.raises(labkit.CacheFullError, match="max_len=8"):
        decoder.prefill(_prompt(model, 9, batch=1))
    assert cache.host_lengths == (0,) and cache.lengths.tolist() == [0]
    assert all(not buf.any() for buf in cache.buffers())  # still the zeros it was made with
    decoder.prefill(_prompt(model, 5, batch=1))
    before = [buf.clone() for buf in cache.buffers()]
    with pytest.raises(labkit.CacheFullError, match="holds 5 of max_len=8"):
        decoder.prefill(_prompt(model, 4, batch=1))
    assert cache.host_lengths == (5,)
    assert all(torch.equal(a, b) for a, b in zip(cache.buffers(), before))


def test_causal_attention_is_the_masked_one_for_prompts_from_position_zero():
    gen = torch.Generator().manual_seed(0)
    B, nh, nkv, T, hd = 3, 6, 2, 37, 16
    q = torch.randn(B, nh, T, hd, generator=gen)
    keys, values = torch.randn(2, B, nkv, T, hd, generator=gen)
    positions = torch.arange(T).expand(B, T)
    out = attend_causal(q, keys, values, positions, positions)
    assert rel_err(out, attend_ref(q, keys, values, positions, positions)) < 1e-6
    with pytest.raises(ValueError, match="exactly the T = 37 new tokens"):
        attend_causal(q, torch.cat([keys, keys], 2), torch.cat([values, values], 2), positions,
                      torch.arange(2 * T).expand(B, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B,nh,nkv,T,start,L", [(3, 6, 2, 37, 29, 80), (1, 8, 2, 5, 1, 6), (2, 3, 3, 1, 100, 133)])
def test_the_continuing_form_is_the_masked_one_after_a_cached_prefix(B, nh, nkv, T, start, L, dtype):
    """Every row holds ``start`` cached tokens in a buffer of L >= start + T; the fast form gets the
    buffer past them poisoned with NaN (stale: it must not read it), the reference a clean one."""
    gen = torch.Generator().manual_seed(T)
    hd = 16
    q = torch.randn(B, nh, T, hd, generator=gen).to(dtype)
    keys, values = torch.randn(2, B, nkv, L, hd, generator=gen).to(dtype)
    positions = (start + torch.arange(T)).expand(B, T)
    key_positions = torch.arange(L).expand(B, L)
    want = attend_ref(q.float(), keys.float(), values.float(), positions, key_positions)
    keys[:, :, start + T:], values[:, :, start + T:] = float("nan"), float("nan")
    got = attend_continuing(q, keys, values, positions, key_positions, start=start)
    assert got.shape == want.shape and not got.isnan().any()
    assert rel_err(got, want) < (1e-6 if dtype == torch.float32 else 1e-2)
    with pytest.raises(ValueError, match="start \\+ T"):
        attend_continuing(q, keys[:, :, : start + T - 1], values, positions, key_positions, start=start)
    with pytest.raises(ValueError, match="start >= 1"):
        attend_continuing(q, keys, values, positions, key_positions, start=0)


def test_the_reference_backend_needs_no_triton():
    """The Triton kernels load only with a fused backend: without triton, labkit imports and the
    reference prefills a Gated DeltaNet model (chunked form included) and decodes."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, labkit\n"
        "m = labkit.build('tiny-qwen3.5', dtype=torch.float32)\n"
        "labkit.generate(m, torch.arange(70)[None] % 200, 2)\n"
        "assert not any('chunk_delta_rule' in name for name in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(labkit.__file__))  # this labkit, wherever it is installed
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.parametrize("start,T,L", [(0, 7, 7), (0, 5, 9), (4, 3, 12)])
def test_the_slice_write_is_the_indexed_one(start, T, L):
    """Every row writes positions start..start+T-1: two slice copies put the same values in the same
    slots as the reference's index_put, and leave every other slot as it was (sentinels here)."""
    gen = torch.Generator().manual_seed(T)
    B, nkv, hd = 3, 2, 8
    k, v = torch.randn(2, B, T, nkv, hd, generator=gen)
    positions = (start + torch.arange(T)).expand(B, T)
    bufs = {name: torch.full((B, nkv, L, hd), 7.0) for name in ("ref_k", "ref_v", "k", "v")}
    want = store_kv_ref(bufs["ref_k"], bufs["ref_v"], k, v, positions)
    slots = torch.arange(L + 5).expand(B, -1)  # made for a longer buffer: the first L are returned
    got = store_kv_slice(bufs["k"], bufs["v"], k, v, positions, start=start, key_positions=slots)
    assert torch.equal(bufs["k"], bufs["ref_k"]) and torch.equal(bufs["v"], bufs["ref_v"])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="start \\+ T"):
        store_kv_slice(bufs["k"], bufs["v"], k, v, positions, start=L - T + 1, key_positions=slots)


def test_the_fast_paths_are_switched_by_their_names(monkeypatch):
    """prefill_cores lends each fast path when it is on, its reference when it is off."""
    from labkit.decode import fused_prefill
    from labkit.ops import prefill_fusions as pf
    from labkit.ops.mixers import REFERENCE_CORES

    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0)
    cache = model.new_cache(2, 16)
    cores = fused_prefill.prefill_cores(REFERENCE_CORES.delta_rule, cache, pf)
    assert cores.project is pf.project_residual and cores.output_gate is pf.sigmoid_gate_rows
    assert cores.store_kv.func is store_kv_slice and cores.store_kv.keywords["start"] == 0
    assert cores.gdn_inputs.keywords["update_state"] and cores.short_conv.keywords["update_state"]
    assert cores.attention_inputs.func is pf.attention_inputs
    for name in fused_prefill.FAST_PATHS:
        monkeypatch.setitem(fused_prefill.FAST_PATHS, name, False)
    cores = fused_prefill.prefill_cores(REFERENCE_CORES.delta_rule, cache, pf)
    assert cores.project is REFERENCE_CORES.project and cores.output_gate is REFERENCE_CORES.output_gate
    assert cores.store_kv is store_kv_ref and cores.attention_inputs is None
    assert not cores.gdn_inputs.keywords["update_state"] and not cores.short_conv.keywords["update_state"]
    cache._host_lengths = [3, 5]  # rows at different lengths: the indexed write, whatever the switch
    monkeypatch.setitem(fused_prefill.FAST_PATHS, "store_kv_slice", True)
    assert fused_prefill.prefill_cores(REFERENCE_CORES.delta_rule, cache, pf).store_kv is store_kv_ref
