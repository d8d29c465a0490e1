"""Every backend's decode against the reference backend at the real shapes of both presets (random
weights): bf16 logits at batch 1, 3 and 16; float32 greedy tokens at the grid of :data:`FLOAT32_GREEDY`.

bf16, teacher-forced (every decoder gets the reference's greedy token): random weights give nearly
flat logits, where two bf16 implementations differ by a few percent (Qwen3.5's bf16 reference is
~9e-2 from float32), so each fused backend must be as close to the float32 truth as the bf16
reference is, within a factor 2 (a wrong kernel lands far outside); the graph replays must equal
the eager launches bit for bit.

float32, free-running greedy: every backend (through ``labkit.generate``, so the fused ones use
their greedy head) must produce the reference's tokens. Where the reference's top two logits are a
genuine tie (closer than 1e-3 of the logits' spread) either token is right, and that sequence is
compared no further: after it, the two continue from different tokens.

Why the float32 grid is smaller: each (preset, batch) compiles every decode kernel again in float32
(and Qwen3.5's chunked delta rule, whose float32 products are FMA loops ptxas is slow on): 128 s for
Qwen3.5 at batch 1 on the H200 machine (batch 3 had not ended 150 s later), against 1-2 s for each bf16 case
once its kernels are built. The bf16 test above already runs every backend at every batch of both
presets against the float32 truth, and graph == eager bit for bit. What the float32 test adds is the
free-running greedy path through ``labkit.generate`` (the fused greedy head, ``step_greedy``) of
every backend: LFM2 at batch 1 (the GEMV loop) and 3 (the tl.dot loop with masked rows), Qwen3.5
at batch 1 (the Gated DeltaNet step, the float32 chunk kernel of its prefill). Batch 16 (cuBLAS
dispatch where the tuning file chose it) is in the bf16 test.
"""

import pytest
import torch

import labkit
from labkit.decode.registry import make_decoder
from labkit.bench.ops import rel_err

from .conftest import BATCHES, REAL_PRESETS

STEPS = 32
PROMPT = 17


def fused_backends() -> list[str]:
    from labkit.decode.registry import backends_for

    return [b for b in ("fused", "fused+graph", "fused+graph+pdl") if b in backends_for("cuda")]  # +pdl: sm_90+


def _prompt(model, batch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(0, model.cfg.vocab_size, (batch, PROMPT), generator=gen).to("cuda")


@pytest.mark.heavy(seconds=25)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("preset", REAL_PRESETS)
def test_bf16_logits_of_every_backend(real_model, preset, batch):
    model, truth_model = real_model(preset), real_model(preset, torch.float32)
    prompt, max_len = _prompt(model, batch), PROMPT + STEPS + 1
    names = ["reference", *fused_backends()]
    decoders = {name: make_decoder(name, model, model.new_cache(batch, max_len)) for name in names}
    truth = make_decoder("reference", truth_model, truth_model.new_cache(batch, max_len))
    truth.prefill(prompt)
    token = {name: d.prefill(prompt) for name, d in decoders.items()}["reference"].argmax(-1)
    worst = dict.fromkeys(names, 0.0)
    for step in range(STEPS):
        logits = {name: d.step(token).clone() for name, d in decoders.items()}
        exact = truth.step(token)
        for name in names:
            worst[name] = max(worst[name], rel_err(logits[name], exact))
        assert torch.equal(logits["fused+graph"], logits["fused"]), f"step {step}: graph replay != eager launches"
        if "fused+graph+pdl" in logits:
            assert torch.equal(logits["fused+graph+pdl"], logits["fused+graph"]), f"step {step}: PDL changed the result"
        token = logits["reference"].argmax(-1)
    for name in names[1:]:
        assert worst[name] <= 2 * worst["reference"] + 1e-3, (name, worst)


# (preset, batch), with the H200 machine's cold-cache cost for the scheduler (tests/gpu/conftest.py)
FLOAT32_GREEDY = [
    pytest.param("lfm2-350m", 1, marks=pytest.mark.heavy(seconds=20)),
    pytest.param("lfm2-350m", 3, marks=pytest.mark.heavy(seconds=20)),
    pytest.param("qwen3.5-0.8b", 1, marks=pytest.mark.heavy(seconds=130)),
]


@pytest.mark.parametrize("preset, batch", FLOAT32_GREEDY)
def test_float32_greedy_tokens_of_every_backend(real_model, preset, batch):
    model = real_model(preset, torch.float32)
    prompt = _prompt(model, batch)
    ref = make_decoder("reference", model, model.new_cache(batch, PROMPT + STEPS))
    logits = ref.prefill(prompt)
    ref_logits, ref_tokens = [], []
    for _ in range(STEPS):
        ref_logits.append(logits.clone())
        ref_tokens.append(logits.argmax(-1))
        logits = ref.step(ref_tokens[-1])
    ref_tokens = torch.stack(ref_tokens, 1)
    for backend in fused_backends():
        got = labkit.generate(model, prompt, STEPS, backend=backend, progress=False).tokens
        for b in range(batch):
            diff = (got[b] != ref_tokens[b]).nonzero()
            if len(diff) == 0:
                continue
            t = int(diff[0])
            row = ref_logits[t][b]
            margin = float(row[ref_tokens[b, t]] - row[got[b, t]])
            assert margin <= 1e-3 * float(row.std()), (
                f"{backend}, sequence {b}, step {t}: token {int(got[b, t])} instead of {int(ref_tokens[b, t])}, "
                f"whose logit is higher by {margin:.3g} (spread {float(row.std()):.3g})")
