"""The "fused" decode backend against "reference", step by step, on the tiny presets.

Both decoders get the same prompt and then the same tokens (the reference's greedy choices), so
every step compares like with like. float32: logits within 1e-4 and identical greedy tokens.
bfloat16: the two differ by rounding (the fused kernels round less often), so the fused logits
must be about as close to a float32 run of the same weights as the bfloat16 reference is, and its
greedy token must be a (near-)maximum of the reference logits; the logit-free greedy step must pick
the reference's argmax, unless the reference's top two are within bfloat16 rounding.
"""

import copy
import re

import pytest
import torch

import labkit
from conftest import rel_err
from labkit.decode.registry import make_decoder

CASES = [
    ("tiny-lfm2", torch.float32, 3),
    ("tiny-lfm2", torch.bfloat16, 1),
    ("tiny-qwen3.5", torch.float32, 1),
    ("tiny-qwen3.5", torch.bfloat16, 3),
]


@pytest.mark.parametrize("preset,dtype,batch", CASES)
def test_fused_steps_match_the_reference(preset, dtype, batch, device):
    model = labkit.build(preset, dtype=dtype, device=device, seed=5)
    V = model.cfg.vocab_size
    prompt = torch.randint(0, V, (batch, 6), generator=torch.Generator().manual_seed(batch)).to(device)
    ref = make_decoder("reference", model, model.new_cache(batch, max_len=19))
    fused = make_decoder("fused", model, model.new_cache(batch, max_len=19))
    truth = None
    if dtype != torch.float32:
        m32 = copy.deepcopy(model).float()
        truth = make_decoder("reference", m32, m32.new_cache(batch, max_len=19))
        truth.prefill(prompt)
    # poison the step's buffers: anything a kernel fails to write turns the logits into NaN
    for buf in fused.plan.activations():
        buf.fill_(float("nan"))
    logits_ref = ref.prefill(prompt)
    logits = fused.prefill(prompt)  # the fused prefill (tests/test_fused_prefill.py checks it closely)
    if truth is None:
        assert rel_err(logits, logits_ref) < 1e-5
    else:
        assert rel_err(logits, logits_ref) < 5e-2
    token = logits_ref.argmax(-1)
    for step in range(10):
        if step < 8:
            logits_ref = ref.step(token)
            logits = fused.step(token)
            if truth is None:
                assert rel_err(logits, logits_ref) < 1e-4, step
                assert torch.equal(logits.argmax(-1), logits_ref.argmax(-1)), step
            else:
                logits_32 = truth.step(token)
                assert rel_err(logits, logits_32) < 1.5 * rel_err(logits_ref, logits_32) + 5e-3, step
                assert rel_err(logits, logits_ref) < 5e-2, step
                chosen = logits_ref.float().gather(1, logits.argmax(-1)[:, None])[:, 0]
                assert bool((chosen >= logits_ref.float().max(-1).values - 0.05).all()), step
        else:  # the greedy path: no logits, the same token as the reference's argmax
            logits_ref = ref.step(token)
            if truth is not None:
                truth.step(token)
            got = fused.step_greedy(token)
            assert got.shape == (batch,) and got.dtype == torch.long
            want = logits_ref.argmax(-1)
            if dtype == torch.float32:
                assert torch.equal(got, want), step
            else:  # another token only where the bf16 reference cannot order the two: within 2 ulps
                ref32 = logits_ref.float()
                top = ref32.max(-1).values
                ulp = torch.exp2(torch.floor(torch.log2(top.abs())) - 7)  # bf16 keeps 8 significant bits
                chosen = ref32.gather(1, got[:, None])[:, 0]
                assert bool(((got == want) | (chosen >= top - 2 * ulp)).all()), (step, got, want)
        token = logits_ref.argmax(-1)
    assert fused.cache.host_lengths == ref.cache.host_lengths == (16,) * batch
    assert fused.cache.lengths.tolist() == [16] * batch
    for i in fused.cache.keys:
        assert rel_err(fused.cache.keys[i].float(), ref.cache.keys[i].float()) < (1e-5 if truth is None else 2e-2)


def test_generate_with_the_fused_backend_equals_reference(device):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device=device, seed=2)
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0)).to(device)
    want = labkit.generate(model, prompt, max_new_tokens=5).tokens
    cache = model.new_cache(2, max_len=10)
    got = labkit.generate(model, prompt, max_new_tokens=5, backend="fused", cache=cache).tokens
    assert torch.equal(got, want)
    # the decoder (and on a GPU its graphs) is kept with the cache and reused after cache.reset()
    again = labkit.generate(model, prompt, max_new_tokens=5, backend="fused", cache=cache).tokens
    assert torch.equal(again, want)
    assert sum(1 for k in cache.attachments if k[0] == "labkit.decode.fused") == 1


def test_fused_decoder_refuses_a_full_cache(device):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device=device, seed=0)
    cache = model.new_cache(1, max_len=4)
    decoder = make_decoder("fused", model, cache)
    decoder.prefill(torch.zeros(1, 4, dtype=torch.long, device=device))
    with pytest.raises(labkit.CacheFullError):
        decoder.step(torch.zeros(1, dtype=torch.long, device=device))
    assert cache.host_lengths == (4,)
    with pytest.raises(ValueError, match="one per sequence"):
        decoder.step(torch.zeros(2, dtype=torch.long, device=device))


@pytest.mark.parametrize("preset,kind,path,change", [
    ("tiny-qwen3.5", "gdn", "mixer.A_log", "delete"),
    ("tiny-qwen3.5", "attention", "mixer.q_norm.weight", "rename"),
    ("tiny-lfm2", "conv", "mixer.conv_weight", "rename"),
    ("tiny-lfm2", "attention", "mlp.down", "delete"),
])
def test_a_missing_parameter_fails_the_plan_naming_layer_and_attribute(preset, kind, path, change, device):
    """At construction, and at the next prefill of a decoder made before the change."""
    model = labkit.build(preset, dtype=torch.float32, device=device, seed=0)
    i = model.cfg.layer_types.index(kind)
    owner_path, name = path.rsplit(".", 1)
    owner = model.layers[i].get_submodule(owner_path)
    made_before = make_decoder("fused", model, model.new_cache(1, max_len=8))
    if change == "rename":
        setattr(owner, name + "_renamed", getattr(owner, name))
    delattr(owner, name)
    message = rf"model\.layers\[{i}\] \({kind} block\): the fused backend reads `{re.escape(path)}`, which is missing"
    with pytest.raises(ValueError, match=message):
        make_decoder("fused", model, model.new_cache(1, max_len=8))
    with pytest.raises(ValueError, match=message):
        made_before.prefill(torch.zeros(1, 3, dtype=torch.long, device=device))
    with pytest.raises(RuntimeError, match="no valid plan"):  # nothing stale is stepped either
        made_before.step(torch.zeros(1, dtype=torch.long, device=device))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error message")
@pytest.mark.parametrize("backend", ["fused+graph", "fused+graph+pdl"])
def test_graph_backends_need_a_gpu(backend):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="CUDA graph.*needs a CUDA GPU"):
        make_decoder(backend, model, model.new_cache(1, max_len=8))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error message")
def test_fused_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    from labkit.ops import launch

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        make_decoder("fused", model, model.new_cache(1, max_len=8))


def test_missing_triton_is_a_clear_import_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    with pytest.raises(ImportError, match="need Triton"):
        make_decoder("fused", model, model.new_cache(1, max_len=8))


def test_backends_are_registered():
    for name in ("fused", "fused+graph", "fused+graph+pdl"):
        assert name in labkit.BACKENDS


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_graph_backend_equals_eager_fused_on_gpu(preset):
    model = labkit.build(preset, dtype=torch.float32, device="cuda", seed=1)
    prompt = torch.randint(0, model.cfg.vocab_size, (3, 5), device="cuda")
    eager = labkit.generate(model, prompt, max_new_tokens=12, backend="fused").tokens
    graph = labkit.generate(model, prompt, max_new_tokens=12, backend="fused+graph").tokens
    ref = labkit.generate(model, prompt, max_new_tokens=12).tokens
    assert torch.equal(graph, eager) and torch.equal(graph, ref)


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_projections_dispatched_to_torch_compute_the_same_steps(monkeypatch, preset):
    """Where the tuning file says a key runs unfused (labkit.tuning.linear_impl: "torch"), the fused
    backend's step still matches the reference: conv state shift, residual, SwiGLU included; the
    LM head never leaves the Triton kernel."""
    from labkit import tuning

    asked = []

    def impl(m, n, k, *, row_blocks=1, device=None, directory=None):
        asked.append((n, k))
        return "torch"

    monkeypatch.setattr(tuning, "linear_impl", impl)
    model = labkit.build(preset, dtype=torch.float32, device="cpu", seed=5)
    prompt = torch.randint(0, model.cfg.vocab_size, (3, 5), generator=torch.Generator().manual_seed(0))
    ref = make_decoder("reference", model, model.new_cache(3, max_len=12))
    fused = make_decoder("fused", model, model.new_cache(3, max_len=12))
    assert fused.plan.head.impl == "triton" and fused.plan.greedy.impl == "triton"
    assert all(p.impl == "torch" for x in fused.plan.layers for p in (x.in_proj, x.out_proj, x.mlp.gate_up, x.mlp.down))
    assert (model.cfg.vocab_size, model.cfg.hidden_size) not in asked
    for buf in fused.plan.activations():
        buf.fill_(float("nan"))
    ref.prefill(prompt)
    fused.prefill(prompt)
    token = prompt[:, -1]
    for step in range(3):
        logits_ref, logits = ref.step(token), fused.step(token)
        assert rel_err(logits, logits_ref) < 1e-4, step
        token = logits_ref.argmax(-1)
