"""The persistent rung on a CPU: its instruction list against the model, the Python executor of the
list against the reference, and the one-kernel step (Triton's interpreter, one program walking
every tile) against the reference. Concurrency (many resident programs waiting on counters) is
tests/gpu/test_gpu_persistent.py's."""

import pytest
import torch

import labkit
from conftest import random_prompt, rel_err
from labkit.decode.plan import build_step_plan
from labkit.decode.persistent import PersistentDecoder
from labkit.decode.reference import ReferenceDecoder
from labkit.decode import step_program
from labkit.decode.step_program import block_n, build_step_program, check_waits, execute
from labkit.ops import persistent_decode as pd

PRESETS = ["tiny-lfm2", "tiny-qwen3.5"]


def _prefilled(preset, batch, *, length=7, dtype=torch.float32, seed=1):
    model = labkit.build(preset, dtype=dtype, device="cpu", seed=seed)
    ids = random_prompt(model, batch, length, seed=seed)
    ref = ReferenceDecoder(model, model.new_cache(batch, 40))
    ref.prefill(ids)
    return model, ids, ref


def _program(model, batch, *, greedy, programs=5):
    cache = model.new_cache(batch, 40)
    plan = build_step_plan(model, cache)
    prog, shapes = build_step_program(plan, cache, programs=programs, greedy=greedy)
    return prog, shapes, plan, cache


@pytest.mark.parametrize("preset", PRESETS)
def test_the_program_is_the_model_step_in_order(preset):
    model = labkit.build(preset, dtype=torch.float32, device="cpu", seed=0)
    prog, _, _, _ = _program(model, 3, greedy=True)
    want = ["embed"]
    for i, kind in enumerate(model.cfg.layer_types):
        mixer = {"conv": ["in_proj+conv"], "attention": ["wqkv", "attention"], "gdn": ["in_proj", "gdn"]}[kind]
        want += [f"layers.{i}.{m}" for m in [*mixer, "out_proj", "mlp.gate_up", "mlp.down"]]
    assert prog.names == [*want, "head.argmax"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_weight_of_the_model_is_streamed_once(preset):
    model = labkit.build(preset, dtype=torch.float32, device="cpu", seed=0)
    prog, _, _, _ = _program(model, 1, greedy=True)
    streamed = [t.data_ptr() for ins in prog.instructions for name, t in zip(pd.ARGS[ins.op], ins.args)
                if t is not None and name in ("w", "norm", "conv_w", "q_norm", "k_norm", "A_log", "dt_bias")]
    params = {p.data_ptr() for p in model.parameters()}
    assert set(streamed) == params
    tied = model.cfg.tie_embeddings  # the embedding is read by the embed and, as the LM head, by the head
    assert len(streamed) == len(params) + tied


@pytest.mark.parametrize("preset", PRESETS)
def test_every_read_waits_for_its_writer(preset):
    model = labkit.build(preset, dtype=torch.float32, device="cpu", seed=0)
    prog, _, _, _ = _program(model, 3, greedy=False)
    assert check_waits(prog) == []
    assert all(ins.wait == i - 1 for i, ins in enumerate(prog.instructions))


def test_a_missing_wait_is_found():
    """The check can fail: the MLP's down projection made to wait for the out_proj, skipping gate_up."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    prog, _, _, _ = _program(model, 1, greedy=True)
    down = prog.names.index("layers.0.mlp.down")
    ins = prog.instructions[down]
    prog.instructions[down] = pd.Instruction(ins.op, ins.tiles, down - 2, ins.args, ins.n, ins.k)
    problems = check_waits(prog)
    assert any("layers.0.mlp.down reads act, which layers.0.mlp.gate_up writes" in p for p in problems), problems


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_python_executor_gives_the_reference_step(preset, batch):
    model, ids, ref = _prefilled(preset, batch)
    cache = model.new_cache(batch, 40)
    ReferenceDecoder(model, cache).prefill(ids)
    plan = build_step_plan(model, cache)
    tokens = random_prompt(model, batch, 1, seed=9)[:, 0]
    for greedy in (False, True):
        prog, _ = build_step_program(plan, cache, programs=7, greedy=greedy)
        out = execute(prog, plan, cache, tokens)
        want = ref.step(tokens)
        cache.advance(1)
        if greedy:
            assert out.tolist() == want.argmax(-1).tolist()
        else:
            assert rel_err(out, want) < 1e-6
        tokens = want.argmax(-1)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_persistent_step_matches_the_reference(preset, batch, monkeypatch):
    # narrow tiles, so that one program runs many tiles of each projection (a wide interpreter tile
    # would cover a tiny model's outputs at once)
    monkeypatch.setattr(step_program, "INTERPRETER_BLOCK_N", 16)
    model, ids, ref = _prefilled(preset, batch)
    # the L2 prefetch's addresses are computed also here (two tiles ahead at batch 3), and change no result
    dec = PersistentDecoder(model, model.new_cache(batch, 40), settings={"prefetch_tiles": 1 + (batch == 3)})
    dec.prefill(ids)
    tokens = random_prompt(model, batch, 1, seed=9)[:, 0]
    for step in range(3):
        for buf in dec.plan.activations():
            buf.fill_(float("nan"))  # an element the kernel does not write fails
        want = ref.step(tokens).clone()
        if step % 2:
            got = dec.step_greedy(tokens).clone()
            assert got.tolist() == want.argmax(-1).tolist(), step
        else:
            assert rel_err(dec.step(tokens), want) < 1e-5, step
        tokens = want.argmax(-1)
    assert dec.cache.lengths.tolist() == ref.cache.lengths.tolist()
    assert max(ins.tiles for ins in dec.step_program().instructions if ins.op == "gate_up") > 1


def test_generate_runs_the_persistent_rung_like_the_reference():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device="cpu", seed=3)
    prompt = random_prompt(model, 2, 6, seed=4)
    want = labkit.generate(model, prompt, max_new_tokens=5).tokens
    got = labkit.generate(model, prompt, max_new_tokens=5, backend="persistent").tokens
    assert got.tolist() == want.tolist()


def test_the_persistent_rung_samples_and_stops_like_the_reference():
    """Sampling (the logits program, then the sampler on the same seeded stream) and stop tokens
    (the padded rows go on through the kernel) give the reference's tokens."""
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=4)
    prompt = random_prompt(model, 2, 5, seed=6)
    kw = dict(max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.9, seed=1, progress=False)
    want = labkit.generate(model, prompt, **kw).tokens
    assert torch.equal(labkit.generate(model, prompt, backend="persistent", **kw).tokens, want)
    stop = int(want[1, 2])
    kw.update(stop_tokens=[stop], pad_token_id=0)
    want, got = labkit.generate(model, prompt, **kw), labkit.generate(model, prompt, backend="persistent", **kw)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.finished, want.finished) and bool(got.finished[1])


def test_the_step_program_is_the_decoders():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    dec = PersistentDecoder(model, model.new_cache(1, 16))
    assert dec.step_program().names[-1] == "head.argmax"
    assert dec.step_program(greedy=False).names[-1] == "head.logits"


def test_batches_past_16_are_refused():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    with pytest.raises(ValueError, match="1 to 16 sequences"):
        _program(model, 17, greedy=True)


def test_the_table_refuses_what_the_kernel_cannot_read():
    w = torch.zeros(32, 32)
    x = torch.zeros(1, 32)
    good = pd.Instruction("proj_in", 2, 0, (x, w, None, torch.zeros(1, 32), None, None), n=32, k=32)
    embed = pd.Instruction("embed", 1, -1, (w, x))
    table = pd.encode([embed, good], 4, torch.device("cpu"), torch.float32)
    assert table.shape == (2, pd.FIELDS) and table[1, 2] == 1 and table[1, 4] == 1  # first tile, wait target
    with pytest.raises(ValueError, match="only an earlier one"):
        pd.encode([pd.Instruction("embed", 1, 0, (w, x))], 4, torch.device("cpu"), torch.float32)
    odd = torch.zeros(33)[1:].view(1, 32)  # 4 bytes past an aligned start
    with pytest.raises(ValueError, match="16-byte aligned"):
        pd.encode([embed, pd.Instruction("proj_in", 2, 0, (odd, w, None, x, None, None), n=32, k=32)], 4,
                  torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match="multiples of 16"):
        pd.encode([embed, pd.Instruction("proj_in", 2, 0, (x, w, None, x, None, None), n=32, k=24)], 4,
                  torch.device("cpu"), torch.float32)
    with pytest.raises(TypeError, match="dtype torch.bfloat16"):
        pd.encode([embed], 4, torch.device("cpu"), torch.bfloat16)  # a float32 table in a bf16 step
    with pytest.raises(ValueError, match="takes"):
        pd.Instruction("attention", 1, -1, (x,))


def test_output_tiles_deal_every_program_work():
    assert block_n(1024, 264, batch=1, min_block_n=4, max_block_n=8) == 4  # 256 tiles: the most there can be
    assert block_n(4608, 264, batch=1, min_block_n=4, max_block_n=8) == 8  # 576 tiles
    assert block_n(1024, 264, batch=16, min_block_n=4, max_block_n=32) == 16  # tl.dot needs 16 columns
    assert block_n(248320, 264, batch=1, min_block_n=4, max_block_n=32) == 32


def test_a_replaced_weight_rebuilds_the_program():
    """The table holds the weights' addresses: a refresh after a weight is replaced must rebuild it."""
    model, ids, ref = _prefilled("tiny-lfm2", 1)
    dec = PersistentDecoder(model, model.new_cache(1, 40))
    old = dec.step_program()
    down = model.layers[1].mlp.down
    model.layers[1].mlp.down = torch.nn.Parameter(down.detach() * 1.5)
    dec.prefill(ids)  # every prefill refreshes the plan
    ref = ReferenceDecoder(model, model.new_cache(1, 40))
    ref.prefill(ids)
    token = torch.tensor([3])
    assert dec.step_program() is not old
    assert rel_err(dec.step(token), ref.step(token)) < 1e-5


def test_the_timeline_needs_a_gpu():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    dec = PersistentDecoder(model, model.new_cache(1, 16))
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        dec.timeline(torch.tensor([1]))


def test_projections_the_fused_rung_sends_to_cublas_are_this_kernels_tiles(monkeypatch):
    """At batch 16 the H200's tuning file sends some projections through cuBLAS; the persistent step
    has no such dispatch: it runs its own tiles for every projection."""
    from labkit import tuning

    monkeypatch.setattr(tuning, "linear_impl", lambda *a, **k: "torch")
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    prog, _, plan, _ = _program(model, 3, greedy=True)
    assert plan.layers[0].out_proj.impl == "torch"
    assert [ins.op for ins in prog.instructions].count("residual") == 2 * len(model.layers)
