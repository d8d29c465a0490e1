"""`python -m labkit compile-check`: the fused step's kernels and the persistent step go through Triton's real compiler
(and ptxas) for sm_90 (H100/H200) and sm_100 (B200) on a machine without a GPU, which the CPU interpreter never
exercises; and for sm_80 (A100) the variants an older GPU runs: without PDL, the persistent step without its
bulk prefetch (ptxas would refuse either there)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("arch", [80, 90, 100])
def test_the_decode_kernels_compile_without_a_gpu(arch):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "labkit", "compile-check", "--arch", str(arch), "--presets", "tiny-qwen3.5",
         "--batches", "1"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"compiled for sm_{arch} " in run.stdout and "; 0 failures" in run.stdout
    for kernel in ("_linear_kernel", "_gdn_decode_kernel", "_attention_decode_kernel", "_argmax_reduce_kernel",
                   "_persistent_step_kernel"):
        assert kernel in run.stdout
    hopper = arch >= 90
    assert ("USE_PDL=True" in run.stdout) == hopper and ("PREFETCH=0" in run.stdout) != hopper


def test_a_process_running_the_interpreter_is_refused(capsys):
    from labkit.lab import compile_check
    from labkit.ops.launch import interpreting

    if not interpreting():
        pytest.skip("this process runs Triton's compiler")
    assert compile_check.main(["--presets", "tiny-lfm2"]) == 2
    assert "fresh process" in capsys.readouterr().out
