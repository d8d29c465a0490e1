"""dtype and device moves (issue 24 item 4): the rotary frequencies stay float32 through
``model.to(...)`` / ``.half()`` / ``.bfloat16()``, so a moved model is the model built (or loaded) in
that dtype: the same weights, the same reference logits, and the fused rung runs on it."""

import pytest
import torch

import labkit
from labkit.decode.registry import make_decoder
from labkit.model import Attention

MOVES = {
    "to(bfloat16)": (lambda m: m.to(torch.bfloat16), torch.bfloat16),
    "bfloat16()": (lambda m: m.bfloat16(), torch.bfloat16),
    "half()": (lambda m: m.half(), torch.float16),
    "to(cpu, float16)": (lambda m: m.to("cpu", torch.float16), torch.float16),
}


def _inv_freqs(model):
    return [b.mixer.inv_freq for b in model.layers if isinstance(b.mixer, Attention)]


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
@pytest.mark.parametrize("move", list(MOVES))
def test_a_moved_model_is_the_model_built_in_that_dtype(preset, move):
    convert, dtype = MOVES[move]
    moved = convert(labkit.build(preset, dtype=torch.float32, seed=3))
    fresh = labkit.build(preset, dtype=dtype, seed=3)
    for got, want in zip(_inv_freqs(moved), _inv_freqs(fresh)):
        assert got.dtype == torch.float32 and torch.equal(got, want)
    for (name, p), q in zip(moved.named_parameters(), fresh.parameters()):
        assert p.dtype == dtype and torch.equal(p, q), name
    T = 601 if move == "to(bfloat16)" else 64  # 601: where bf16 frequencies drifted by 0.25
    ids = torch.randint(0, moved.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    assert torch.equal(moved(ids), fresh(ids))


@pytest.mark.parametrize("preset", ["tiny-lfm2", "tiny-qwen3.5"])
def test_the_fused_rung_runs_on_a_moved_model(preset, tmp_path):
    moved = labkit.build(preset, dtype=torch.float32, seed=4).to(torch.bfloat16)
    labkit.save(labkit.build(preset, dtype=torch.float32, seed=4), tmp_path)
    loaded = labkit.load(tmp_path, dtype=torch.bfloat16)
    ids = torch.randint(0, moved.cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    outs = []
    for model in (moved, loaded):  # the interpreter is slow: a short prompt and one step say enough
        fused = make_decoder("fused", model, model.new_cache(1, max_len=8))
        first = fused.prefill(ids)
        outs.append(torch.stack([first, fused.step(first.argmax(-1))]))
    assert torch.equal(outs[0], outs[1])


def test_a_dtype_change_keeps_the_very_same_frequencies():
    """A captured graph reads the buffer's address: a dtype change of the weights must not replace it."""
    model = labkit.build("tiny-lfm2", dtype=torch.bfloat16, seed=3)
    before = _inv_freqs(model)
    model.to(torch.float16).float().bfloat16()
    assert all(a is b for a, b in zip(_inv_freqs(model), before))


def test_a_device_move_makes_float32_frequencies_there():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=3).to("meta", torch.bfloat16)
    assert all(f.dtype == torch.float32 and f.is_meta for f in _inv_freqs(model))
    assert model.dtype == torch.bfloat16
