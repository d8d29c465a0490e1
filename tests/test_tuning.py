"""Tuned kernel settings as data (labkit.tuning, labkit.bench.tune): the file is chosen by the GPU's
name, a GPU without one gets the heuristic and one warning, a bad file is a clear error, entries
round-trip, the fused backend uses them, and the tune command writes and merges files (keeping the
file's other sections). The launch settings and the TMA section: tests/test_tuning_settings.py. CPU only:
the device name is monkeypatched, and the sweep's timer is a stand-in (its checks run for real)."""

import json
import warnings

import pytest
import torch

import labkit
from labkit import tuning
from labkit.bench import tune
from labkit.ops import linear as linear_mod
from labkit.decode.fused import FusedDecoder
from labkit.ops.linear import LinearConfig, TuningKey, tuning_key

H200_FILE = tuning.TUNING_DIR / "nvidia-h200.json"


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def _doc(*entries):
    return {"format": tuning.FORMAT, "gpu": "Test GPU", "linear": list(entries)}


ENTRY = {"key": {"m_bucket": 1, "n": 96, "k": 160, "row_blocks": 1, "argmax": False},
         "config": {"block_m": 1, "block_n": 4, "block_k": 64, "split_k": 1, "num_warps": 2, "num_stages": 1}}


def test_a_gpu_with_a_file_gets_its_entries(gpu_named):
    gpu_named("NVIDIA H200")
    table = tuning.device_table(torch.device("cuda", 0))
    assert table == tuning.linear_table(H200_FILE) and len(table) == len(json.loads(H200_FILE.read_text())["linear"]) >= 10
    key, config = next(iter(table.items()))
    got = tuning.linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks, device="cuda:0")
    assert got == config


def test_a_gpu_without_a_file_gets_the_heuristic_and_one_warning(gpu_named):
    gpu_named("NVIDIA GeForce RTX 4090")
    with pytest.warns(tuning.UntunedGPUWarning, match=r"RTX 4090.*nvidia-geforce-rtx-4090\.json.*python -m labkit tune"):
        assert tuning.device_table("cuda:0") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning in this process would raise here
        got = tuning.linear_config(1, 1024, 1024, row_blocks=3, device="cuda:0")
        assert tuning.device_table("cuda:0") is None
    assert got == linear_mod.linear_config(1, 1024, 1024, row_blocks=3)  # the heuristic's (no table)


def test_the_cpu_gets_its_configuration_silently(gpu_named):
    gpu_named("NVIDIA H200")  # not asked: a CPU tensor's configuration never depends on a GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.device_table("cpu") is None
        assert tuning.linear_config(1, 1024, 1024, row_blocks=3, device="cpu") == linear_mod.linear_config(
            1, 1024, 1024, row_blocks=3)


BAD = [
    ("{not json", "not valid JSON"),
    (json.dumps({"format": "something/2", "linear": []}), "expected format 'labkit-tuning/2'"),
    (json.dumps({"format": "labkit-tuning/1", "linear": []}), "predate the merged format"),
    (json.dumps({"format": tuning.FORMAT, "linear": {}}), "'linear' must be a list"),
    (json.dumps(_doc({"key": ENTRY["key"]})), r"linear\[0\]: each entry needs a 'key' and a 'config'"),
    (json.dumps(_doc({**ENTRY, "key": {**ENTRY["key"], "argmax": 0}})), r"linear\[0\]: key.argmax must be a boolean"),
    (json.dumps(_doc({**ENTRY, "key": {"m_bucket": 1, "n": 96, "k": 160}})), "key must be an object with exactly"),
    (json.dumps(_doc({**ENTRY, "key": {**ENTRY["key"], "m_bucket": 3}})), "a batch bucket"),
    (json.dumps(_doc({**ENTRY, "config": {**ENTRY["config"], "block_n": 24}})), "block_n must be a power of two"),
    (json.dumps(_doc({**ENTRY, "config": {**ENTRY["config"], "warps": 4}})), "config must be an object with fields"),
    (json.dumps(_doc({**ENTRY, "config": {**ENTRY["config"], "block_m": 16, "block_n": 16}})), "does not match key.m_bucket"),
    (json.dumps(_doc(ENTRY, ENTRY)), r"linear\[1\]: a second entry for key"),
    (json.dumps(_doc({**ENTRY, "impl": "cuda"})), "impl must be one of"),
    (json.dumps(_doc({**ENTRY, "impl": "torch"})), "batch >= 16 projections"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_a_malformed_file_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "test-gpu.json"
    path.write_text(text)
    with pytest.raises(tuning.TuningFileError, match=message) as e:
        tuning.linear_table(path)
    assert str(path) in str(e.value)


def test_a_malformed_file_for_this_gpu_is_not_skipped(tmp_path, gpu_named):
    gpu_named("Test GPU")
    (tmp_path / "test-gpu.json").write_text("{}")
    with pytest.raises(tuning.TuningFileError, match="test-gpu.json"):
        tuning.device_table("cuda:0", directory=tmp_path)


def test_keys_and_configs_round_trip(tmp_path):
    key = tuning_key(3, 1024, 4608, row_blocks=2, argmax=False)
    assert key == TuningKey(16, 1024, 4608, 2, False)
    assert tuning.key_from_dict(json.loads(json.dumps(tuning.key_to_dict(key))), "here") == key
    config = LinearConfig(16, 32, 256, split_k=2, num_warps=8, num_stages=3)
    assert tuning.config_from_dict(json.loads(json.dumps(tuning.config_to_dict(config))), "here") == config
    doc = _doc({"key": tuning.key_to_dict(key), "config": tuning.config_to_dict(config), "us": {"tuned": 1.0}}, ENTRY)
    path = tuning.write_tuning_file(tmp_path / "sub" / "t.json", doc)
    assert json.loads(path.read_text()) == doc
    assert tuning.linear_table(path) == {key: config, tuning.key_from_dict(ENTRY["key"], ""): LinearConfig(1, 4, 64, 1, 2, 1)}
    with pytest.raises(tuning.TuningFileError):  # a bad document is refused before it replaces a good file
        tuning.write_tuning_file(path, _doc(ENTRY, ENTRY))
    assert json.loads(path.read_text()) == doc and not list(path.parent.glob("*.tmp"))


def test_the_dispatch_table_names_the_keys_that_run_unfused(tmp_path, gpu_named):
    b16 = {"key": {**ENTRY["key"], "m_bucket": 16},
           "config": {"block_m": 16, "block_n": 16, "block_k": 64, "split_k": 1, "num_warps": 4, "num_stages": 3}}
    path = _write(tmp_path / "test-gpu.json", _doc(ENTRY, {**b16, "impl": "torch"}))
    assert tuning.impl_table(path) == {TuningKey(16, 96, 160, 1, False): "torch"}
    gpu_named("Test GPU")
    assert tuning.linear_impl(16, 96, 160, device="cuda:0", directory=tmp_path) == "torch"
    assert tuning.linear_impl(1, 96, 160, device="cuda:0", directory=tmp_path) == "triton"
    assert tuning.linear_impl(16, 96, 160, device="cpu", directory=tmp_path) == "triton"


def test_the_fused_backend_launches_the_tables_configs(monkeypatch):
    model = labkit.build("tiny-lfm2", dtype=torch.float32, seed=0)
    H, I = model.cfg.hidden_size, model.cfg.intermediate_size
    down = LinearConfig(1, 2, 32, split_k=5, num_warps=2, num_stages=1)
    table = {tuning_key(1, H, I): down}
    monkeypatch.setattr(tuning, "device_table", lambda device=None, directory=None: table)
    decoder = FusedDecoder(model, model.new_cache(1, 8))
    assert all(layer.mlp.down.config is down for layer in decoder.plan.layers)
    assert decoder.plan.layers[0].mlp.gate_up.config == linear_mod.linear_config(1, I, H, row_blocks=2)


def test_candidates_are_valid_blockings_at_real_shapes():
    for m, n, k, blocks in [(1, 1024, 4608, 1), (1, 1024, 1024, 3), (1, 3584, 1024, 2), (16, 8224, 1024, 1),
                            (16, 1024, 3584, 1)]:
        found = tune.candidates(m, n, k, blocks, sms=132)
        assert found and len(set(found)) == len(found)
        for c in found:
            assert c.block_m == linear_mod.m_bucket(m)
            iters = -(-k // c.block_k)
            assert iters % c.split_k == 0, c  # whole K blocks per split
        if m == 1:
            assert any(-(-n // c.block_n) * c.split_k >= 4 * 132 for c in found)  # some fill the GPU


def test_tune_writes_checked_winners_and_merges_with_the_previous_file(tmp_path):
    def fake_us(model, case, batch, config):  # prefers the narrowest tile: not the heuristic's choice
        return float(config.block_n)

    others = {"settings": {"attention_decode": {"values": {"release_early": False}, "source": "by hand"}},
              "tma": {"date": "d", "entries": [{"m_bucket": 1, "n": 8, "k": 64, "config": {"block_n": 16, "block_k": 128}}]}}
    tuning.write_tuning_file(tmp_path / "test-gpu.json", {"format": tuning.FORMAT, "gpu": "Test GPU", **others})

    path, entries, left = tune.run(["tiny-lfm2"], [1], out_dir=tmp_path, max_candidates=2, device="cpu",
                                   gpu_name="Test GPU", timer=fake_us, log=lambda s: None)
    assert path == tmp_path / "test-gpu.json" and left == 0
    doc = json.loads(path.read_text())
    assert doc["gpu"] == "Test GPU" and doc["command"] and doc["versions"]["torch"] and doc["date"]
    # conv.out_proj and attention.wo of tiny-lfm2 share their shape: one entry serves both
    shared = [e for e in doc["linear"] if len(e["ops"]) == 2]
    assert len(shared) == 1 and {op.split()[1] for op in shared[0]["ops"]} == {"conv.out_proj+residual",
                                                                                "attention.wo+residual"}
    for e in doc["linear"]:
        assert e["us"]["tuned"] == e["config"]["block_n"] <= e["us"]["heuristic"] == e["heuristic"]["block_n"]
        assert e["candidates"] <= 2 and "rejected" not in e
    first = tuning.linear_table(path)

    path, entries, left = tune.run(["tiny-lfm2"], [3], out_dir=tmp_path, max_candidates=1, device="cpu",
                                   gpu_name="Test GPU", timer=fake_us, log=lambda s: None)
    merged = tuning.linear_table(path)
    assert {k: v for k, v in merged.items() if k.m_bucket == 1} == first  # batch 1 kept
    assert {k.m_bucket for k in merged} == {1, 16} and len(entries) == len(first)
    assert "kept from the previous file" in " ".join(json.loads(path.read_text())["notes"])

    path, entries, left = tune.run(["tiny-lfm2"], [1], out_dir=tmp_path, time_limit_s=0, device="cpu",
                                   gpu_name="Test GPU", timer=fake_us, log=lambda s: None)
    assert not entries and left == len(first) and tuning.linear_table(path) == merged
    doc = json.loads(path.read_text())
    assert {k: doc[k] for k in others} == others  # the sections the linear tuning does not write are kept


def _names_by_index(monkeypatch, names: dict[int, str], current: int = 0) -> None:
    """torch.cuda.get_device_name answering per device index, as on a machine with mixed GPUs."""

    def name(device=None):
        if device is None or isinstance(device, int):
            index = current if device is None else device
        else:
            index = torch.device(device).index
        return names[current if index is None else index]

    monkeypatch.setattr(torch.cuda, "get_device_name", name)


def test_the_given_device_is_looked_up_not_the_current_one(monkeypatch):
    """cuda:1 is an H200 and the current device (0) a 4090 without a file: a lookup for cuda:1
    reads the H200's file (item 9 of issue 23: the table was read for the current device)."""
    tuning.forget()
    _names_by_index(monkeypatch, {0: "NVIDIA GeForce RTX 4090", 1: "NVIDIA H200"})
    h200 = tuning.linear_table(H200_FILE)
    key, config = next((k, c) for k, c in h200.items() if c != linear_mod.linear_config(
        k.m_bucket, k.n, k.k, row_blocks=k.row_blocks, argmax=k.argmax))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # cuda:1 has its file: no warning
            for device in ("cuda:1", torch.device("cuda", 1), 1):
                assert tuning.device_table(device) == h200
                assert tuning.linear_config(key.m_bucket, key.n, key.k, row_blocks=key.row_blocks, argmax=key.argmax,
                                            device=device) == config
                assert tuning.linear_impl(16, 1024, 1024, row_blocks=3, device=device) == "torch"
        with pytest.warns(tuning.UntunedGPUWarning, match="RTX 4090"):
            assert tuning.device_table("cuda:0") is None
        assert tuning.device_table("cuda") is None  # no index: the current device
    finally:
        tuning.forget()


def test_no_warning_where_the_gpu_has_a_file(gpu_named, tmp_path):
    """A GPU with a file is tuned: no UntunedGPUWarning from any lookup, however many (item 9: it
    was raised where a file exists)."""
    gpu_named("NVIDIA H200")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            assert tuning.device_table("cuda:0")
            tuning.linear_config(1, 1024, 1024, row_blocks=3, device="cuda:0")
            tuning.linear_impl(16, 1024, 1024, device="cuda:0")
            for kernel in tuning.KERNELS:
                tuning.settings(kernel, "cuda:0")
    gpu_named("Test GPU")  # a file without a linear section is a file too
    tuning.write_tuning_file(tmp_path / "test-gpu.json", {"format": tuning.FORMAT, "gpu": "Test GPU"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.device_table("cuda:0", directory=tmp_path) == {}
        assert tuning.settings("linear", "cuda:0", directory=tmp_path) == tuning.HEURISTICS["linear"]
