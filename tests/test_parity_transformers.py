"""labkit's models against transformers' own Lfm2ForCausalLM / Qwen3_5ForCausalLM, in float32."""

import pytest
import torch

import labkit
from conftest import rel_err
from hf_reference import hf_greedy_logits, make_hf_model

pytest.importorskip("transformers")

# float32 end to end; what is left is summation order (chunked vs stepwise delta rule, fused
# attention vs eager). Measured: about 1e-6.
TOL = 2e-5


@pytest.fixture(scope="module", params=["tiny-lfm2", "tiny-qwen3.5"])
def pair(request, tmp_path_factory):
    cfg = labkit.PRESETS[request.param]
    hf = make_hf_model(cfg, seed=3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, labkit.load(path, dtype=torch.float32), cfg


@pytest.mark.parametrize("batch,prompt", [(1, 9), (3, 13)])
def test_prefill_and_32_decode_steps_match(pair, batch, prompt):
    hf, model, cfg = pair
    steps = 33
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt + steps), generator=torch.Generator().manual_seed(batch))
    expected = hf_greedy_logits(hf, ids, prompt)
    cache = model.new_cache(batch, max_len=prompt + steps + 5)
    got = [model(ids[:, :prompt], cache=cache)]
    got += [model(ids[:, t : t + 1], cache=cache) for t in range(prompt, ids.shape[1])]
    errors = [rel_err(a, b) for a, b in zip(got, expected)]
    print(f"{cfg.name} batch {batch}: max rel err {max(errors):.2e} over {len(errors)} calls")
    assert len(errors) == steps + 1
    assert max(errors) < TOL


def test_full_sequence_without_cache_matches(pair):
    hf, model, cfg = pair
    ids = torch.randint(0, cfg.vocab_size, (2, 70))
    with torch.no_grad():
        expected = hf(input_ids=ids, use_cache=False).logits
    assert rel_err(model(ids), expected) < TOL


def test_saved_checkpoint_loads_in_transformers(pair, tmp_path):
    """labkit.save writes what transformers reads back to the same function."""
    import transformers

    hf, model, cfg = pair
    labkit.save(model, tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 21))
    with torch.no_grad():
        assert rel_err(again(input_ids=ids).logits, hf(input_ids=ids).logits) < 1e-6
