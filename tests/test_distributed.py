"""labkit.distributed on CPUs: torchrun jobs of two gloo processes on the tiny presets, failures that
end the job on every rank, bad input refused before any process starts, and NVLink multicast kept
off in every environment labkit makes. (The NCCL paths, CUDA graphs included, run on the GPU
machine through notebook 07.)"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labkit
from labkit.distributed import (
    MULTICAST_OFF,
    allreduces_per_token,
    check_multicast_off,
    make_requests,
    message_bytes,
    multicast_off_env,
    shard,
    tensor_parallel_step_us,
)
from labkit.distributed.cli import build_parser, launch_env, rank_argv, run_job, torchrun_command
from labkit.distributed.cli import main as launcher
from labkit.distributed.serve import check_replicas, fingerprint

ROOT = Path(__file__).resolve().parent.parent
JOB_TIMEOUT_S = 300  # a hung job fails the test instead of stalling it


def test_replicas_give_the_tokens_of_a_single_process_run(tmp_path):
    """Two gloo replicas, each family, two batch sizes, 3 batches split 2 + 1: every request's tokens
    equal labkit.generate in this process; rows carry world_size and speedup; --save writes them."""
    args = ["--nproc", "2", "--device", "cpu", "--models", "tiny-lfm2", "tiny-qwen3.5", "--batch", "1", "3",
            "--num-batches", "3", "--prompt-min", "3", "--prompt-max", "9", "--new-tokens", "5", "--repeats", "1",
            "--compare-single", "--save", "--data-dir", str(tmp_path / "bench")]
    doc = run_job("serve-batch", args, tmp_path / "serve.json", timeout_s=JOB_TIMEOUT_S, echo=False)
    assert doc["kind"] == "serve" and doc["world_size"] == 2 and doc["process_group"] == "gloo"
    assert doc["command"].startswith("python -m labkit serve-batch --nproc 2")

    for name in ("tiny-lfm2", "tiny-qwen3.5"):
        model = labkit.build(name, dtype=torch.float32, seed=0)  # what every replica built
        for batch in (1, 3):
            want = []
            for b in make_requests(model.cfg.vocab_size, batch, 3, 3, 9, seed=0):
                want += labkit.generate(model, b.prompt, 5).tokens.tolist()
            for world in (1, 2):
                (req,) = [r for r in doc["requests"] if (r["model"], r["batch"], r["world_size"]) == (name, batch, world)]
                assert [r["request"] for r in req["records"]] == list(range(3 * batch))
                assert [r["tokens"] for r in req["records"]] == want, f"{name} B={batch} on {world} replica(s)"
                # round robin: batch g on rank g % world
                assert all(r["rank"] == r["batch_index"] % world for r in req["records"])
            rows = {r["world_size"]: r for r in doc["results"] if (r["model"], r["batch"]) == (name, batch)}
            assert rows[1]["speedup"] == 1.0 and rows[2]["identical_to_single"] is True
            assert rows[2]["speedup"] == pytest.approx(rows[2]["tokens_per_s"] / rows[1]["tokens_per_s"])
            assert rows[2]["tokens_sha256"] == rows[1]["tokens_sha256"] and rows[2]["requests"] == 3 * batch

    saved = json.loads((tmp_path / "bench" / "cpu" / "serve-batch.json").read_text())
    assert saved["kind"] == "serve" and len(saved["results"]) == 8
    assert {(r["world_size"], r["speedup"] is not None) for r in saved["results"]} == {(1, True), (2, True)}


def test_allreduce_job_measures_every_size_and_writes_only_its_out_file(tmp_path):
    args = ["--nproc", "2", "--device", "cpu", "--hidden", "8", "24", "--batch", "1", "3", "--iters", "5",
            "--repeats", "2", "--data-dir", str(tmp_path / "bench")]
    doc = run_job("allreduce", args, tmp_path / "ar.json", timeout_s=JOB_TIMEOUT_S, echo=False)
    rows = doc["results"]
    assert [(r["hidden"], r["batch"], r["bytes"]) for r in rows] == [(8, 1, 32), (8, 3, 96), (24, 1, 96), (24, 3, 288)]
    for r in rows:
        assert r["world_size"] == 2 and r["process_group"] == "gloo" and r["dtype"] == "float32"
        assert 0 < r["eager_us"] < 1e6 and len(r["runs_eager_us"]) == 2
        assert r["graph_us"] is None and "gloo" in r["graph_note"]
    assert not (tmp_path / "bench").exists(), "results go under data/ only with --save"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_missing_its_checkpoint_ends_the_job_on_every_rank(tmp_path):
    """Two machines, one without the checkpoint: ranks started by hand with their own
    LABKIT_CHECKPOINTS (as two nodes' filesystems would differ). Both stop, naming rank 1's error."""
    shipped, empty = tmp_path / "shipped", tmp_path / "empty"
    labkit.save(labkit.build("tiny-lfm2", dtype=torch.float32, seed=1), shipped / "byte-lfm2-6m")
    empty.mkdir()
    port = _free_port()
    procs = []
    for rank, ck in enumerate((shipped, empty)):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LABKIT_CHECKPOINTS=str(ck),
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "labkit.distributed", "serve-batch", "--device=cpu", "--models", "byte-lfm2-6m",
             "--batch", "1", "--num-batches", "2", "--prompt-min", "3", "--prompt-max", "5", "--new-tokens", "2",
             f"--out={tmp_path / 'never.json'}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=JOB_TIMEOUT_S)[0])
    finally:
        for p in procs:
            p.kill()
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode != 0, f"rank {rank} should fail with its peer"
        assert "failed on 1 of 2 ranks: rank 1" in text and f"is not at {empty / 'byte-lfm2-6m'}" in text, text[-2000:]
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--nproc", "4", "--num-batches", "3"], "more ranks (4) than batches of requests (3)"),
    (["--nproc", "2", "--nnodes", "2", "--num-batches", "3"], "more ranks (4) than batches"),
    (["--models", "no-such-model"], "'no-such-model' is not a preset"),
    (["--prompt-min", "9", "--prompt-max", "3"], "--prompt-min <= --prompt-max"),
    (["--nproc", "0"], "--nproc must be >= 1"),
    (["--batch", "0"], "batch sizes must be >= 1"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank < --nnodes"),
])
def test_bad_input_is_refused_before_any_process_starts(args, message):
    with pytest.raises(SystemExit) as exc:
        launcher(["serve-batch", "--device", "cpu", "--models", "tiny-lfm2", *args])
    assert message in str(exc.value)


def test_a_missing_shipped_checkpoint_is_refused_by_the_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CHECKPOINTS", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        launcher(["serve-batch", "--device", "cpu", "--models", "byte-qwen3.5-6m"])
    assert "is not at" in str(exc.value)


def test_the_request_set_does_not_depend_on_the_ranks():
    a = make_requests(263, 3, 5, 4, 11, seed=7)
    b = make_requests(263, 3, 5, 4, 11, seed=7)
    assert all(torch.equal(x.prompt, y.prompt) for x, y in zip(a, b))
    assert len({x.prompt_len for x in a}) > 1 and all(4 <= x.prompt_len <= 11 for x in a)
    assert [x.request_ids for x in a] == [tuple(range(3 * g, 3 * g + 3)) for g in range(5)]
    for world in (1, 2, 5):
        shares = [shard(a, r, world) for r in range(world)]
        assert sorted(b.index for s in shares for b in s) == list(range(5))
    with pytest.raises(ValueError, match=r"more ranks \(6\) than batches of requests \(5\)"):
        shard(a, 0, 6)
    with pytest.raises(ValueError, match="outside a world"):
        shard(a, 2, 2)
    with pytest.raises(ValueError, match="min <= max"):
        make_requests(263, 1, 2, 5, 4)


def test_nvlink_multicast_stays_off_in_every_environment_labkit_makes(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # a user's setting is overridden, not trusted
    env = launch_env("cuda")
    assert all(env[k] == v for k, v in MULTICAST_OFF.items())
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert multicast_off_env({"A": "b"}) == {"A": "b", **MULTICAST_OFF}
    check_multicast_off(env)
    with pytest.raises(RuntimeError, match="NCCL_NVLS_ENABLE='1'"):
        check_multicast_off(dict(env, NCCL_NVLS_ENABLE="1"))
    unset = {k: v for k, v in env.items() if k != "NVSHMEM_DISABLE_NVLS"}
    with pytest.raises(RuntimeError, match="NVSHMEM_DISABLE_NVLS=None"):
        check_multicast_off(unset)


def test_a_rank_started_without_torchrun_says_how_to_launch(monkeypatch):
    from labkit.distributed import runtime

    for var in runtime.RANK_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="python -m labkit serve-batch --nproc N"):
        runtime.start("cpu")


def test_torchrun_command_and_rank_arguments():
    parser = build_parser("serve-batch")
    args = parser.parse_args(["--nproc", "8", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                              "--batch", "1", "16", "--compare-single", "--models", "tiny-lfm2"])
    ranks = rank_argv(parser, args)
    assert not any(a.startswith(("--nproc", "--nnodes", "--node-rank", "--master")) for a in ranks)
    again = parser.parse_args(ranks)
    assert (again.batch, again.compare_single, again.models) == ([1, 16], True, ["tiny-lfm2"])
    cmd = torchrun_command("serve-batch", ranks, args)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=8"]
    assert {"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500"} <= set(cmd)
    assert "--standalone" not in cmd and cmd[cmd.index("-m", 2):][:3] == ["-m", "labkit.distributed", "serve-batch"]
    single = build_parser("serve-batch").parse_args(["--nproc", "2"])
    assert "--standalone" in torchrun_command("serve-batch", [], single)


def test_replicas_must_hold_the_same_weights():
    a, b = labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=0), labkit.build("tiny-qwen3.5", dtype=torch.float32, seed=1)
    check_replicas([fingerprint(a), fingerprint(a)], "tiny-qwen3.5")
    with pytest.raises(RuntimeError, match="rank 1 holds different weights"):
        check_replicas([fingerprint(a), fingerprint(b)], "tiny-qwen3.5")


def test_tensor_parallel_arithmetic():
    cfg = labkit.PRESETS["lfm2-350m"]
    assert allreduces_per_token(cfg) == 32  # 16 blocks, a mixer and an MLP each
    assert message_bytes(1, cfg.hidden_size, torch.bfloat16) == 2048  # the 2 KB at batch 1
    assert message_bytes(16, cfg.hidden_size, torch.float32) == 65536
    assert tensor_parallel_step_us(cfg, 450.0, 1, 10.0) == 450.0  # one GPU: no all-reduce
    assert tensor_parallel_step_us(cfg, 450.0, 2, 10.0) == 225.0 + 320.0
    with pytest.raises(ValueError):
        tensor_parallel_step_us(cfg, 450.0, 0, 10.0)
