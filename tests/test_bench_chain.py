"""The chained-step bench on the CPU: its per-kernel fit on synthetic data, the ops it chains, every
built-in GEMV against its reference (Triton interpreter), and the in-chain tuning flow with a stand-in
timer (CUDA graphs need a GPU; tests/gpu and the GPU runs time it for real)."""

import json

import pytest
import torch

import labkit
from labkit.bench import chain as ch
from labkit.bench import tune as tn
from labkit.ops.linear import LinearConfig, PdlPlacement

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter checks")


def test_fit_recovers_a_known_line():
    nbytes = [1e6, 2.1e6, 8e6, 18.9e6, 134e6]
    us = [1.5 + b / 4.3e12 * 1e6 for b in nbytes]
    f = ch.fit_per_kernel(nbytes, us, weights=[16, 6, 10, 16, 1])
    assert f.t0_us == pytest.approx(1.5, rel=1e-9) and f.bytes_per_s == pytest.approx(4.3e12, rel=1e-9)
    assert f.r2 == pytest.approx(1.0) and f.predict_us(8e6) == pytest.approx(us[2])


def test_fit_weights_pull_towards_heavy_points():
    # two groups on one line, a third off it: weighting the third more pulls the intercept
    light = ch.fit_per_kernel([1e6, 4e6, 8e6], [2.0, 3.0, 6.0], weights=[1, 1, 1])
    heavy = ch.fit_per_kernel([1e6, 4e6, 8e6], [2.0, 3.0, 6.0], weights=[1, 1, 50])
    assert heavy.predict_us(8e6) == pytest.approx(6.0, abs=0.05)
    assert abs(light.predict_us(8e6) - 6.0) > abs(heavy.predict_us(8e6) - 6.0)
    assert 0 < light.r2 < 1


@pytest.mark.parametrize("nbytes,us", [([1e6, 1e6], [2.0, 3.0]), ([1e6], [2.0]), ([1e6, 2e6], [3.0, 2.0])])
def test_fit_refuses_degenerate_data(nbytes, us):
    with pytest.raises(ValueError):
        ch.fit_per_kernel(nbytes, us)


def test_chain_ops_cover_every_projection_in_step_order():
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, device="cpu", seed=0)
    ops = ch.chain_ops(model)
    assert len(ops) == 4 * len(model.layers) + 1 and ops[-1].layer == -1
    kinds = {b.kind for b in model.layers}
    assert {o.case.name.split(".")[0] for o in ops} == kinds | {"mlp", "lm_head+norm"}
    assert [o.layer for o in ops[:-1]] == sorted(o.layer for o in ops[:-1])
    by_key = ch.groups(ops, 1)
    assert sum(len(g) for g in by_key.values()) == len(ops)
    sizes = [sum(o.case.nbytes for o in g) for g in by_key.values()]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("gemv,batch", [("linear", 1), ("linear", 3), ("plain", 1), ("plain-tma", 1), ("cublas", 3),
                                        ("torch", 3), ("step", 3)])
def test_every_gemv_matches_its_reference_in_the_chain(gemv, batch):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    chain = ch.Chain(model, ch.chain_ops(model), batch, gemv, pdl=False)
    errs = chain.check()
    assert len(errs) == len(ch.chain_ops(model)) and max(errs.values()) < 1e-5


def test_batch1_gemvs_refuse_batches_and_unknown_names():
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    with pytest.raises(ValueError, match="one row"):
        ch.Chain(model, ch.chain_ops(model), 2, "plain")
    with pytest.raises(ValueError, match="unknown GEMV"):
        ch.Chain(model, ch.chain_ops(model), 1, "nope")
    with pytest.raises(ValueError, match="registered already"):
        ch.register_gemv("linear", lambda *a, **k: None)


def test_a_wrong_plugged_gemv_is_caught(monkeypatch):
    monkeypatch.setitem(ch.GEMVS, "broken", ch.Gemv(lambda x, w, *, out=None, **_: out.zero_(), fused=False))
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    res = ch.run_chain(model, 1, "broken", per_group=False, log=lambda s: None)
    assert res.error and "wrong results" in res.error


def test_placements_parse_and_reject():
    assert ch.parse_placement("no-preload+after_wait") == PdlPlacement(False, "after_wait")
    assert ch.placement_name(PdlPlacement(True, "early")) == "preload+early"
    for bad in ("preload", "early+preload", "preload+soon"):
        with pytest.raises(ValueError):
            ch.parse_placement(bad)


def test_tuning_inside_the_chain_writes_the_fastest_checked_config(monkeypatch, tmp_path):
    """A stand-in timer that favours block_n == 8: the file gets that config for every key, with
    the in-chain figures, the LM head's greedy key the same as its logits key."""
    fake = {}

    def time_ms(self, repeats=20):
        if self.gemv == "torch":  # the unfused path: faster than any blocking at batch 16 here
            return 0.5 * len(self.bound) / 1e3
        if self.gemv == "cublas":  # the bare matmul, the yardstick past batch 1
            return 0.25 * len(self.bound) / 1e3
        cfg = next(iter(self.configs.values()))
        fake[cfg] = 1.0 if cfg.block_n == 8 else 2.0
        return fake[cfg] * len(self.bound) / 1e3

    from labkit.ops import linear as linear_mod

    for name in ("gdc_wait", "gdc_launch_dependents"):  # no meaning in the interpreter
        monkeypatch.setattr(linear_mod, name, lambda: None)
    monkeypatch.setattr(ch.Chain, "time_ms", time_ms)
    monkeypatch.setattr(ch, "copies_for", lambda nbytes, device: 1)
    monkeypatch.setattr(tn, "candidates", lambda m, n, k, rb, sms: [LinearConfig(1 if m == 1 else 16, 8 if m == 1 else 16, 32),
                                                                    LinearConfig(1 if m == 1 else 16, 2 if m == 1 else 32, 64)])
    monkeypatch.setattr(tn, "head_candidates", lambda m, n, k: tn.candidates(m, n, k, 1, 1))
    monkeypatch.setattr(tn.tuning, "linear_config",
                        lambda m, n, k, row_blocks=1, argmax=False, device=None: LinearConfig(1 if m == 1 else 16,
                                                                                               4 if m == 1 else 64, 32))
    path, entries = tn.run_chain(["tiny-lfm2"], [1, 16], pdl=True, placement=PdlPlacement(True, "early"), out_dir=tmp_path,
                                 device="cpu", gpu_name="Test GPU", command="test", log=lambda s: None)
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "Test GPU" and tn.CHAIN_NOTE in doc["notes"]
    one = [e for e in entries if e["key"]["m_bucket"] == 1]
    assert one and all(e["config"]["block_n"] == 8 and e["method"] == "chain" and "impl" not in e for e in one)
    assert all(e["us"]["previous"] == 2.0 and e["us"]["tuned"] == 1.0 for e in one)
    sixteen = [e for e in entries if e["key"]["m_bucket"] == 16]
    assert sixteen and all(e.get("impl") == "torch" and e["us"]["torch"] == 0.5 for e in sixteen if not e["key"]["argmax"]
                           and "lm_head+norm" not in " ".join(e["ops"]))
    assert all("impl" not in e for e in sixteen if "lm_head+norm" in " ".join(e["ops"]))
    assert all(e["us"]["cublas"] == 0.25 for e in sixteen) and all("cublas" not in e["us"] for e in one)
    heads = [e for e in one if "lm_head+norm" in " ".join(e["ops"])]
    assert {e["key"]["argmax"] for e in heads} == {False, True}
    assert entries[0]["pdl"] == "preload+early"


def test_the_cli_says_it_needs_a_gpu(capsys):
    from labkit.bench.cli import main

    assert main(["chain", "--models", "tiny-lfm2"]) == 2
    assert "CUDA" in capsys.readouterr().out


def test_timeline_rows_go_to_a_results_file(monkeypatch, tmp_path):
    """--timeline: the stamped kernels of the first layers, PDL off and on, as a results file (the
    stamps themselves need a GPU: a stand-in returns what timeline() returns)."""
    from labkit.bench.results import write_results
    from labkit.lab.hw import device_facts

    seen = []

    def fake_timeline(model, ops, *, pdl, replays=5):
        seen.append((pdl, [o.name for o in ops]))
        return [{"op": o.name, "bytes": o.case.nbytes, "programs": 3, "first_start_us": 1.0 * i,
                 "last_start_us": 1.5 * i, "first_past_wait_us": 2.0 * i, "last_end_us": 3.0 * i}
                for i, o in enumerate(ops)]

    monkeypatch.setattr(ch, "timeline", fake_timeline)
    model = labkit.build("tiny-lfm2", dtype=torch.float32, device="cpu", seed=0)
    rows = ch.timeline_rows(model, 2)
    assert [p for p, _ in seen] == [False, True]
    assert all(name.startswith(("L0 ", "L1 ")) for _, names in seen for name in names) and len(seen[0][1]) == 8
    path = write_results("chain-timeline", "chain-timeline", rows, device_facts("cpu", measure=False),
                         command="test", data_dir=tmp_path)
    doc = json.loads(path.read_text())
    assert doc["kind"] == "chain-timeline" and len(doc["results"]) == 16
    assert {r["pdl"] for r in doc["results"]} == {False, True} and doc["results"][0]["model"] == "tiny-lfm2"


def test_the_cuda_tma_gemv_is_registered_and_refuses_a_cpu():
    assert "cuda-tma" in ch.GEMVS and not ch.GEMVS["cuda-tma"].fused
    model = labkit.build("tiny-lfm2", dtype=torch.bfloat16, device="cpu", seed=0)
    res = ch.run_chain(model, 1, "cuda-tma", per_group=False, log=lambda s: None)
    assert res.error and "CUDA GPU" in res.error
