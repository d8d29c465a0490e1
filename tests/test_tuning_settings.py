"""The tuning file's launch settings and TMA section (labkit.tuning): the H200 file holds what the
code held before the settings became data and what was measured there since, nothing unmeasured
(a value named without a sweep would freeze the heuristic of its day), the
ops' defaults are the heuristic, a GPU without a file gets the heuristic with one warning, a bad
section is a TuningFileError naming the file and the entry, files round-trip and merge, and the
fused decoder passes the tuned values to the kernels. CPU only: device names are monkeypatched."""

import inspect
import json
import warnings

import pytest
import torch

import labkit
from labkit import cuda, tuning
from labkit.ops import attention_decode as attn_mod
from labkit.ops import gated_delta_decode as gdn_mod
from labkit.ops import linear as linear_mod
from labkit.ops import prefill_fusions
from labkit.tuning import files

H200_FILE = tuning.TUNING_DIR / "nvidia-h200.json"

# The values the code held as constants and rules at commit 071314a, before they moved into the
# tuning file (labkit/ops/linear.py PDL_PLACEMENT; attention_decode.py PDL_RELEASE_EARLY and
# attention_chunk's 256 / 64; gated_delta_decode.py PDL_RELEASE_EARLY and gdn_block_v's 32 / 16 /
# 2 per SM; prefill_fusions.py NORM_ROPE_ROTATED_ONLY, NORM_ROPE_WARPS; decode/fused.py
# PREFILL_CAPTURE_AT, PREFILL_GRAPHS; chunk_delta_rule.py WALK_BLOCK_V, WALK_WARPS, the walk's
# num_stages 2, PREPARE_WARPS["split"], OUTPUT_BLOCK_V, output_warps 4, SINGLE_BLOCK_V, SINGLE_WARPS);
# and the settings added since (chunk_delta_rule.py WALK_PROGRAMS_PER_SM, WIDE_WARPS, WIDE_STAGES,
# WALK_BLOCKS_FIRST: the walk of many sequences, branch varlen).
BEFORE = {
    "linear": {"pdl_preload": True, "pdl_release": "early"},
    "attention_decode": {"min_chunk": 256, "max_chunks": 64, "release_early": True},
    "gated_delta_decode": {"block_v": 32, "narrow_block_v": 16, "programs_per_sm": 2, "release_early": True},
    "norm_rope": {"rotated_only": True, "num_warps": 4},
    "fused_prefill": {"capture_at": 2, "graphs": 4},
    "chunk_delta_rule": {"block_v": 16, "num_warps": 4, "num_stages": 2, "prepare_warps": 4, "output_block_v": 64,
                         "output_warps": 4, "single_block_v": 128, "single_warps": 4,
                         "walk_programs_per_sm": 2, "wide_warps": 4, "wide_stages": 2, "walk_blocks_first": False},
}

# Heuristics changed since, each on a measurement: the single-chunk delta rule at 32 value columns
# (data/bench/nvidia-h100-80gb-hbm3/gdn-single-sweep.json). The H200 file named 128 without having swept
# it (the tuner wrote every setting's value of the day); it names it no more, so the H200 runs 32 too.
CHANGED_SINCE = {"chunk_delta_rule": {"single_block_v": 32}}


def test_the_h200_file_holds_every_setting_the_code_held(gpu_named):
    doc = tuning.read_tuning_file(H200_FILE)
    held = {k: v["values"] for k, v in doc["settings"].items()}
    # the kernels python -m labkit tune sweeps hold its winners; the others what the code held
    from labkit.bench.tune import SECTIONS

    tuned = {k: held.pop(k) for k in SECTIONS if k in held and k != "linear"}  # ("linear": its blockings, not these)
    assert set(tuned) == {"gated_delta_decode", "attention_decode", "chunk_delta_rule", "persistent_decode"}
    # gdn_inputs: the winner of bench prefill-profile's sweep (the tuner does not sweep it), every setting named
    swept = {"gdn_inputs": held.pop("gdn_inputs")}
    assert set(swept["gdn_inputs"]) == set(tuning.HEURISTICS["gdn_inputs"])
    assert doc["settings"]["gdn_inputs"]["results"] == "data/bench/nvidia-h200/prefill-profile.json"
    assert held == {k: v for k, v in BEFORE.items() if k not in tuned}  # every kernel, every setting: no gaps
    for kernel, values in tuned.items():  # what the tuner swept, and what was measured apart (the varlen walk)
        assert set(values) <= set(tuning.HEURISTICS[kernel])
        assert doc["settings"][kernel]["candidates"]  # what the tuner tried, beside the winner
    assert all(v.get("source") and v.get("measured") for v in doc["settings"].values())  # with provenance
    gpu_named("NVIDIA H200")
    for kernel, values in {**held, **tuned, **swept}.items():
        assert dict(tuning.settings(kernel, "cuda:0")) == {**tuning.HEURISTICS[kernel], **values}
    assert "single_block_v" not in tuned["chunk_delta_rule"]  # never swept on the H200: the heuristic's
    assert tuning.settings("chunk_delta_rule", "cuda:0")["single_block_v"] == 32
    assert tuning.pdl_placement("cuda:0") == linear_mod.PdlPlacement(preload=True, release="early")


def test_the_heuristics_are_the_ops_defaults():
    """A GPU without a file runs what the ops run when not told: the heuristic table and the
    defaults of the parameters that take the settings are one set of values."""
    # the kernels the code held constants for, and the first guesses of the persistent step and of
    # gdn_inputs (its block_t and num_warps as the code held them, its grid order new)
    new = ("persistent_decode", "gdn_inputs", "tail_gate_up", "prompt_gate_up")
    held = {k: {**v, **CHANGED_SINCE.get(k, {})} for k, v in BEFORE.items()}
    assert {k: dict(v) for k, v in tuning.HEURISTICS.items() if k not in new} == held
    assert set(tuning.HEURISTICS) == {*BEFORE, *new}
    h = tuning.HEURISTICS

    def defaults(fn, *names):
        return {n: inspect.signature(fn).parameters[n].default for n in names}

    assert linear_mod.PdlPlacement() == linear_mod.PdlPlacement(h["linear"]["pdl_preload"], h["linear"]["pdl_release"])
    assert set(linear_mod.RELEASES) == {"end", "early", "after_wait"}  # what kernel_settings accepts
    assert defaults(attn_mod.attention_chunk, "min_chunk", "max_chunks") == {
        k: h["attention_decode"][k] for k in ("min_chunk", "max_chunks")}
    assert defaults(attn_mod.attention_decode, "release_early")["release_early"] is h["attention_decode"]["release_early"]
    assert defaults(gdn_mod.gdn_block_v, "block_v", "narrow_block_v", "programs_per_sm") == {
        k: h["gated_delta_decode"][k] for k in ("block_v", "narrow_block_v", "programs_per_sm")}
    assert defaults(gdn_mod.gdn_decode, "release_early")["release_early"] is h["gated_delta_decode"]["release_early"]
    assert defaults(prefill_fusions.norm_rope_rows, "rotated_only")["rotated_only"] is h["norm_rope"]["rotated_only"]
    from labkit.ops.chunk_delta_rule import chunk_delta_rule

    # the block widths default to None (the constant, capped at the head): every other setting as is
    chunk = {k: v for k, v in defaults(chunk_delta_rule, *h["chunk_delta_rule"]).items() if v is not None}
    assert chunk == {k: h["chunk_delta_rule"][k] for k in chunk} and len(chunk) == len(h["chunk_delta_rule"]) - 3
    assert defaults(prefill_fusions.gdn_inputs, *h["gdn_inputs"]) == dict(h["gdn_inputs"])
    assert defaults(prefill_fusions.gate_up_swiglu, *h["tail_gate_up"]) == dict(h["tail_gate_up"])
    # a prompt's GEMM: off (min_rows 0), its blocking GemmConfig's defaults
    from dataclasses import asdict

    from labkit.ops.gemm_swiglu import GemmConfig

    assert dict(h["prompt_gate_up"]) == {"min_rows": 0, **{k: v for k, v in asdict(GemmConfig()).items() if k != "programs"}}


def test_the_gpu_rule_of_gdn_block_v_and_attention_chunk_take_the_settings(monkeypatch):
    monkeypatch.setattr(gdn_mod, "interpreting", lambda: False)
    monkeypatch.setattr(gdn_mod, "num_sms", lambda: 132)
    monkeypatch.setattr(attn_mod, "interpreting", lambda: False)
    qwen = gdn_mod.GdnDims(16, 16, 128, 128)
    assert gdn_mod.gdn_block_v(16, qwen) == 32 and gdn_mod.gdn_block_v(1, qwen) == 16
    assert gdn_mod.gdn_block_v(16, qwen, block_v=64, programs_per_sm=1) == 64
    assert gdn_mod.gdn_block_v(1, qwen, narrow_block_v=128) == 128
    assert attn_mod.attention_chunk(4096, 64) == (256, 64)
    assert attn_mod.attention_chunk(4096, 64, min_chunk=64, max_chunks=16) == (256, 64)
    assert attn_mod.attention_chunk(1000, 64, min_chunk=64) == (64, 64)
    with pytest.raises(ValueError, match="min_chunk"):
        attn_mod.attention_chunk(1000, 64, min_chunk=100)
    with pytest.raises(ValueError, match="narrow_block_v"):
        gdn_mod.gdn_block_v(1, qwen, narrow_block_v=24)


def test_a_gpu_without_a_file_gets_every_heuristic_with_exactly_one_warning(gpu_named):
    gpu_named("NVIDIA A100-SXM4-80GB")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kernel in tuning.KERNELS:
            assert tuning.settings(kernel, "cuda:0") == tuning.HEURISTICS[kernel]
        assert tuning.tma_config(1, 1024, 1024, "cuda:0") == cuda.DEFAULT_TMA_CONFIG
        assert tuning.device_table("cuda:0") is None
        assert tuning.pdl_placement("cuda:0") == linear_mod.PdlPlacement()
    untuned = [w for w in caught if issubclass(w.category, tuning.UntunedGPUWarning)]
    assert len(untuned) == 1 and "python -m labkit tune" in str(untuned[0].message)
    assert "nvidia-a100-sxm4-80gb.json" in str(untuned[0].message)


def test_the_cpu_gets_the_heuristics_silently():
    tuning.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.settings("chunk_delta_rule", "cpu") == tuning.HEURISTICS["chunk_delta_rule"]
        assert tuning.settings("linear", torch.device("cpu"))["pdl_release"] == "early"
    with pytest.raises(ValueError, match="kernel must be one of"):
        tuning.settings("attention", "cpu")
    with pytest.raises(TypeError):
        tuning.settings("linear", "cpu")["pdl_release"] = "end"  # frozen


def test_the_tma_table_is_the_one_file_and_the_linear_bucketing(gpu_named):
    """The TMA entries moved from nvidia-h200-tma.json unchanged; batches bucket as the linear
    table's (1, and 16 for 2..16 rows)."""
    gpu_named("NVIDIA H200")
    entries = tuning.read_tuning_file(H200_FILE)["tma"]["entries"]
    assert len(entries) == 24 and not (tuning.TUNING_DIR / "nvidia-h200-tma.json").exists()
    one = next(e for e in entries if e["m_bucket"] == 1 and e["n"] == 1024 and e["k"] == 1024)
    sixteen = next(e for e in entries if e["m_bucket"] == 16 and e["n"] == 1024 and e["k"] == 1024)
    assert tuning.tma_config(1, 1024, 1024, "cuda:0") == cuda.TmaConfig(32, 128, 4, fill=2) == cuda.TmaConfig(**one["config"])
    for batch in (2, 3, 16):
        assert tuning.tma_config(batch, 1024, 1024, "cuda:0") == cuda.TmaConfig(**sixteen["config"])
        assert tuning.tma.bucket(batch) == linear_mod.m_bucket(batch) == 16
    assert tuning.tma_config(1, 1000, 1024, "cuda:0") == cuda.DEFAULT_TMA_CONFIG  # a shape not swept


def _file(tmp_path, **sections):
    path = tmp_path / "test-gpu.json"
    path.write_text(json.dumps({"format": tuning.FORMAT, "gpu": "Test GPU", **sections}))
    return path


TMA_ENTRY = {"m_bucket": 1, "n": 8, "k": 64, "config": {"block_n": 16, "block_k": 128}}
BAD = [
    ({"settings": []}, "'settings' must be an object"),
    ({"settings": {"attention": {"values": {}}}}, r"settings\.attention: no such kernel"),
    ({"settings": {"linear": {"pdl_release": "early"}}}, r"settings\.linear: each kernel needs a 'values' object"),
    ({"settings": {"linear": {"values": {"release": "early"}}}}, r"settings\.linear\.values\.release: no such setting"),
    ({"settings": {"linear": {"values": {"pdl_release": "soon"}}}}, r"settings\.linear\.values\.pdl_release must be one of"),
    ({"settings": {"norm_rope": {"values": {"rotated_only": 1}}}}, r"norm_rope\.values\.rotated_only must be true or false"),
    ({"settings": {"gated_delta_decode": {"values": {"block_v": 24}}}}, r"block_v must be a power of two"),
    ({"settings": {"fused_prefill": {"values": {"capture_at": 0}}}}, r"capture_at must be a positive integer"),
    ({"settings": {"chunk_delta_rule": {"values": {"num_warps": True}}}}, r"num_warps must be a power of two"),
    ({"tma": []}, "'tma' must be an object with an 'entries' list"),
    ({"tma": {"entries": [{"n": 8}]}}, r"tma\.entries\[0\]: each entry needs"),
    ({"tma": {"entries": [{**TMA_ENTRY, "m_bucket": 3}]}}, r"tma\.entries\[0\]: m_bucket must be one of"),
    ({"tma": {"entries": [{**TMA_ENTRY, "k": 0}]}}, r"tma\.entries\[0\]: k must be a positive integer"),
    ({"tma": {"entries": [{**TMA_ENTRY, "config": {"block_n": 24}}]}}, r"tma\.entries\[0\]: TmaConfig\.block_n"),
    ({"tma": {"entries": [{**TMA_ENTRY, "config": {"warps": 4}}]}}, r"tma\.entries\[0\]: config must be an object"),
    ({"tma": {"entries": [TMA_ENTRY, TMA_ENTRY]}}, r"tma\.entries\[1\]: a second entry"),
]


@pytest.mark.parametrize("sections,message", BAD)
def test_a_malformed_section_names_the_file_and_the_entry(tmp_path, gpu_named, sections, message):
    path = _file(tmp_path, **sections)
    with pytest.raises(tuning.TuningFileError, match=message) as e:
        tuning.read_tuning_file(path)
    assert str(path) in str(e.value)
    gpu_named("Test GPU")  # never skipped at run time either
    with pytest.raises(tuning.TuningFileError, match=message):
        tuning.settings("linear", "cuda:0", directory=tmp_path)


def test_files_round_trip_and_the_h200_file_is_laid_out_as_written(tmp_path):
    doc = tuning.read_tuning_file(H200_FILE)
    assert files.render(doc) == H200_FILE.read_text()  # the committed file is what the writer writes
    path = tuning.write_tuning_file(tmp_path / "sub" / "h.json", doc)
    assert json.loads(path.read_text()) == doc and tuning.read_tuning_file(path) == doc
    with pytest.raises(tuning.TuningFileError, match="about to be written"):  # refused before replacing
        tuning.write_tuning_file(path, {**doc, "settings": {"linear": {"values": {"pdl_preload": "yes"}}}})
    assert tuning.read_tuning_file(path) == doc and not list(path.parent.glob("*.tmp"))


def test_updating_a_file_keeps_what_it_does_not_name(tmp_path):
    path = tmp_path / "test-gpu.json"
    first = {"values": {"release_early": False}, "source": "by hand"}
    tuning.update_tuning_file(path, "Test GPU", settings={"attention_decode": first}, date="d1")
    tuning.update_tuning_file(path, "Test GPU", settings={"norm_rope": {"values": {"num_warps": 8}}},
                              tma={"entries": [TMA_ENTRY], "date": "d2"})
    doc = tuning.read_tuning_file(path)
    assert doc["settings"] == {"attention_decode": first, "norm_rope": {"values": {"num_warps": 8}}}
    assert doc["date"] == "d1" and doc["tma"]["date"] == "d2" and doc["gpu"] == "Test GPU"
    assert tuning.settings("attention_decode", "cpu") == tuning.HEURISTICS["attention_decode"]  # a CPU reads no file
    with pytest.raises(tuning.TuningFileError, match="not of 'Other GPU'"):
        tuning.update_tuning_file(path, "Other GPU", tma={"entries": []})


def test_a_partial_settings_entry_keeps_the_other_heuristics(tmp_path, gpu_named):
    _file(tmp_path, settings={"gated_delta_decode": {"values": {"block_v": 64}}})
    gpu_named("Test GPU")
    got = tuning.settings("gated_delta_decode", "cuda:0", directory=tmp_path)
    assert got == {**tuning.HEURISTICS["gated_delta_decode"], "block_v": 64}


def test_bench_tma_writes_the_tma_section_of_the_one_file(tmp_path):
    from dataclasses import asdict

    from labkit.bench import tma

    fast, slow = cuda.TmaConfig(32, 256, 4, fill=2), cuda.TmaConfig(16, 128, 2)
    rows = [tma.StreamRow(1024, 4608, "w", b, "cuda-tma", repr(c), us, 1, 1.0, 1e-3, None)
            for b, c, us in ((1, slow, 5.0), (1, fast, 4.0), (16, slow, 6.0))]
    sweep = {"gpu": "Test GPU", "device": {}, "versions": {"torch": "x"}, "date": "d", "command": "c",
             "results": [asdict(r) for r in rows]}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    tuning.write_tuning_file(tmp_path / "test-gpu.json", {"format": tuning.FORMAT, "gpu": "Test GPU", "notes": ["kept"],
                                                           "settings": {"norm_rope": {"values": {"num_warps": 8}}}})
    path = tma.write_tuning(tmp_path / "sweep.json", tmp_path)
    doc = tuning.read_tuning_file(path)
    assert path.name == "test-gpu.json" and doc["notes"] == ["kept"] and doc["settings"]["norm_rope"]
    assert tuning.tma.table_of(doc, "") == {(1, 1024, 4608): fast, (16, 1024, 4608): slow}
    assert doc["tma"]["command"] == "c" and doc["tma"]["source"].endswith("sweep.json")


def test_the_fused_decoder_passes_the_tuned_settings(monkeypatch):
    """What tuning.settings gives for the decoder's device is what its plan launches with."""
    tuned = {"linear": {"pdl_preload": False, "pdl_release": "end"},
             "attention_decode": {**tuning.HEURISTICS["attention_decode"], "release_early": False},
             "gated_delta_decode": {**tuning.HEURISTICS["gated_delta_decode"], "release_early": False},
             "norm_rope": {"rotated_only": False, "num_warps": 8},
             "fused_prefill": {"capture_at": 3, "graphs": 1},
             "gdn_inputs": {"block_t": 8, "num_warps": 2, "heads_first": False},
             "tail_gate_up": {"max_rows": 16, "block_n": 32, "block_k": 64, "num_warps": 8, "num_stages": 3},
             "prompt_gate_up": {**tuning.HEURISTICS["prompt_gate_up"], "min_rows": 17, "block_m": 64}}
    asked = []

    def settings(kernel, device=None, directory=None):
        asked.append((kernel, torch.device(device)))
        return tuned[kernel]

    monkeypatch.setattr(tuning, "settings", settings)
    model = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0)
    from labkit.decode.fused import FusedDecoder

    decoder = FusedDecoder(model, model.new_cache(2, 8))
    plan = decoder.plan
    assert plan.placement == linear_mod.PdlPlacement(False, "end")
    assert plan.attn_args["release_early"] is False and plan.gdn_args["release_early"] is False
    assert plan.gdn_args["block_v"] == gdn_mod.gdn_block_v(2, plan.gdn_dims)
    assert plan.attn_args["chunk"] == attn_mod.attention_chunk(8, model.cfg.head_dim)[0]
    assert decoder.prefill_policy == tuned["fused_prefill"]
    assert decoder.prefill_cores().norm_rope.keywords == tuned["norm_rope"]
    assert decoder.prefill_cores().gate_up.keywords == {**tuned["tail_gate_up"], "prompt": tuned["prompt_gate_up"]}
    assert decoder.prefill_cores().gdn_inputs.keywords == {"update_state": True, **tuned["gdn_inputs"]}
    assert {d for _, d in asked} == {model.device}
    tokens = decoder.prefill(torch.randint(0, model.cfg.vocab_size, (2, 3))).argmax(-1)
    decoder.step(tokens)  # runs with them (release and placement change no result: test_ops_pdl_paths)
