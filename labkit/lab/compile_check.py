"""Compile every Triton kernel variant of the fused decode step for a GPU, on a machine without one.

    python -m labkit compile-check                      # sm_90 (H100/H200), both real presets
    python -m labkit compile-check --arch 100 --batches 1 8
    python -m labkit compile-check --gpu "NVIDIA H200"  # with that GPU's tuned blockings (data/tuning)
    python -m labkit compile-check --arch 80            # an A100: the variants without PDL or bulk prefetch

The CPU interpreter runs the kernels' Python; it does not run Triton's compiler, so a kernel can
pass every CPU test and still fail to compile (types, layouts, shared memory). This script runs
one decode step of the "fused" backend (with and without PDL), and one of the "persistent" backend
(its one kernel, greedy), on CPU tensors of the real presets,
but with Triton's driver replaced by a stand-in that reports a GPU target and launches nothing:
every launch is compiled down to a cubin with the ptxas that ships with Triton, and nothing
executes. The CPU stands in for the target (:func:`labkit.ops.features.stand_in`), so that what
depends on the GPU's features is what that GPU would run: for a target older than sm_90 the step
is compiled without PDL and the persistent kernel without its bulk prefetch. It then reports, per
kernel variant: registers, stack (spills), shared memory, and how many
16-byte load instructions (ld.global.v4 or cp.async of 16 bytes) its PTX has. A variant that needs
more shared memory than the target has fails here, as its load would on the GPU (a compile alone
does not check it).

It leans on Triton 3.6 internals (``triton.runtime.driver.set_active``, ``JITFunction.run``'s
``warmup``); on another version it may need adjusting. Results say nothing about speed. It
replaces Triton's driver for the whole process: run it as its own command, not from a session that
goes on to launch kernels.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

# What the stand-in driver tells Triton about the target: a nominal Hopper-class part (nothing
# launches, so these only steer compile-time choices such as shared-memory limits).
NOMINAL_TARGET = {"max_shared_mem": 232448, "max_num_regs": 65536, "warpSize": 32}


class _Utils:
    def __init__(self, sms: int) -> None:
        self.sms = sms

    def get_device_properties(self, device):
        return {**NOMINAL_TARGET, "multiprocessor_count": self.sms}


class _CompileOnlyDriver:
    """Enough of a CUDA driver for Triton to pick a target and compile; it launches nothing."""

    def __init__(self, arch: int, sms: int) -> None:
        self.arch = arch
        self.utils = _Utils(sms)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.arch, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


COMPILED: dict[str, tuple[str, object]] = {}


def _compile_only(original, refuse_too_large: bool):
    def run(self, *args, grid, warmup, **kwargs):
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        COMPILED.setdefault(kernel.hash, (self.fn.__name__, kernel))
        # what a GPU refuses when it loads the kernel (Triton's OutOfResources), which a compile
        # alone never checks: a float32 variant of a bf16-sized pipeline fails only there
        if refuse_too_large and kernel.metadata.shared > NOMINAL_TARGET["max_shared_mem"]:
            raise RuntimeError(f"{self.fn.__name__} needs {kernel.metadata.shared} bytes of shared memory; "
                               f"the target has {NOMINAL_TARGET['max_shared_mem']}")
        return kernel

    return run


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, spill bytes and static shared memory from cuobjdump (bundled with Triton)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"labkit_compile_check_{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        text = subprocess.run([str(tool), "--dump-resource-usage", str(path)], capture_output=True, text=True).stdout
    finally:
        path.unlink(missing_ok=True)
    usage = {}
    for key, pattern in (("regs", r"REG:(\d+)"), ("stack", r"STACK:(\d+)"), ("shared", r"SHARED:(\d+)")):
        m = re.search(pattern, text)
        usage[key] = int(m.group(1)) if m else -1
    return usage


def compile_only(arch: int, refuse_too_large: bool = True) -> bool:
    """Make every Triton launch in this process compile for ``arch`` and stop there (nothing runs);
    with ``refuse_too_large``, a launch whose kernel needs more shared memory than the target has
    raises, as loading it on the GPU would (the pitfalls lab compiles such a kernel on purpose).

    False, with the reason printed, when this process already runs Triton's interpreter.
    """
    if "triton" not in sys.modules:
        os.environ.pop("TRITON_INTERPRET", None)  # the real compiler, not the interpreter
    import triton
    from triton.runtime import driver
    from triton.runtime import jit as triton_jit

    if triton.knobs.runtime.interpret:
        print("compile-check needs Triton's compiler, but this process runs its interpreter "
              "(TRITON_INTERPRET=1 before triton was imported): run it in a fresh process")
        return False
    from labkit.ops.launch import NOMINAL_SMS

    driver.set_active(_CompileOnlyDriver(arch, NOMINAL_SMS))
    triton_jit.JITFunction.run = _compile_only(triton_jit.JITFunction.run, refuse_too_large)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit compile-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    parser.add_argument("--presets", nargs="*", default=["lfm2-350m", "qwen3.5-0.8b"])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--gpu", help="compile the blockings tuned for this GPU (its data/tuning file), "
                                      "e.g. 'NVIDIA H200'; default: the heuristic's")
    args = parser.parse_args(argv)

    if not compile_only(args.arch):
        return 2
    from labkit.ops.features import stand_in

    with stand_in(f"compile-only sm_{args.arch}", divmod(args.arch, 10)) as target:
        return _compile_all(args, target)


def _compile_all(args: argparse.Namespace, target) -> int:
    import labkit
    from labkit import tuning
    from labkit.decode.fused import FusedDecoder
    from labkit.decode.persistent import PersistentDecoder
    from labkit.ops import attention_decode, gated_delta_decode, greedy_head, launch, linear, persistent_decode, short_conv

    # the persistent step's table and tiles for the grid it would get on a GPU of NOMINAL_SMS SMs
    PersistentDecoder._grid = lambda self: persistent_decode.resident_programs(self.settings["programs_per_sm"])

    if args.gpu:  # the CPU stands in for that GPU when the fused backend looks up its blockings
        table = tuning.linear_table(tuning.tuning_path(args.gpu))
        tuning.device_table = lambda device=None, directory=None: table

    # CPU tensors stand in for CUDA ones: skip the device checks (and nothing runs anyway)
    for mod in (linear, short_conv, gated_delta_decode, attention_decode, greedy_head):
        mod.check_devices = lambda **tensors: torch.device("cpu")
    launch.interpreting = lambda: True  # lets FusedDecoder accept a CPU model; kernels keep GPU flags

    failures = 0
    t0 = time.time()
    for preset in args.presets:
        model = labkit.build(preset, dtype=torch.bfloat16, device="cpu", seed=0)
        for batch in args.batches:
            for pdl in (False, True) if target.pdl else (False,):
                for greedy in (False, True):
                    what = f"{preset} B={batch} pdl={pdl} greedy={greedy}"
                    try:
                        decoder = FusedDecoder(model, model.new_cache(batch, max_len=4096))
                        decoder.pdl = pdl
                        decoder._forward(decoder.plan, greedy)
                        # the standalone short conv kernel (the backend fuses it into in_proj)
                        if "conv" in model.cfg.layer_types:
                            H = model.cfg.hidden_size
                            short_conv.short_conv_decode(
                                torch.empty(batch, 3 * H, dtype=torch.bfloat16),
                                torch.empty(batch, model.cfg.conv_kernel - 1, H, dtype=torch.bfloat16),
                                torch.empty(H, model.cfg.conv_kernel, dtype=torch.bfloat16), pdl=pdl,
                            )
                        print(f"ok   {what}: {len(COMPILED)} variants so far ({time.time() - t0:.0f} s)")
                    except Exception as e:  # noqa: BLE001
                        failures += 1
                        print(f"FAIL {what}: {e!r}")
            what = f"{preset} B={batch} persistent step"
            try:
                decoder = PersistentDecoder(model, model.new_cache(batch, max_len=4096))
                decoder._forward(decoder.plan, True)
                print(f"ok   {what}: {len(COMPILED)} variants so far ({time.time() - t0:.0f} s)")
            except Exception as e:  # noqa: BLE001
                failures += 1
                print(f"FAIL {what}: {e!r}")
        del model

    print(f"\n{'kernel':28s} {'warps':>5s} {'stages':>6s} {'regs':>5s} {'stack':>6s} {'smem':>7s} {'16B ld':>6s}  constexprs")
    for name, kernel in sorted(COMPILED.values(), key=lambda nk: nk[0]):
        usage = resource_usage(kernel.asm["cubin"])
        ptx = kernel.asm["ptx"]
        v4 = len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)) + len(re.findall(r"cp\.async\.\w+\.shared\.global[^;]*, 0x10", ptx))
        consts = {k: v for k, v in kernel.src.constants.items()} if hasattr(kernel, "src") else {}
        names = kernel.src.fn.arg_names if hasattr(kernel, "src") else []
        shown = ", ".join(f"{names[k[0]]}={v}" for k, v in consts.items()
                          if names and names[k[0]].isupper() and names[k[0]] not in ("DOT_F32", "EMULATE_RTNE"))
        meta = kernel.metadata
        print(f"{name:28s} {meta.num_warps:5d} {meta.num_stages:6d} {usage['regs']:5d} {usage['stack']:6d} "
              f"{meta.shared:7d} {v4:6d}  {shown}")
        if usage["stack"] > 0 and "st.local" in ptx:
            print(f"  ^ {usage['stack']} bytes of local memory in the PTX itself (a local array, e.g. libdevice's slow trig path)")
        elif usage["stack"] > 0:
            print(f"  ^ ptxas spilled registers ({usage['stack']} bytes of stack)")
    print(f"\n{len(COMPILED)} kernel variants compiled for sm_{args.arch} in {time.time() - t0:.0f} s; {failures} failures")
    return 1 if failures else 0
