"""Compile the chunked delta-rule prefill kernels (labkit.ops.chunk_delta_rule) for a GPU, on a
machine without one, and report registers, spills and shared memory per kernel variant.

    python -m labkit.lab.compile_check_prefill                 # sm_90 (H100/H200), Qwen3.5 shapes
    python -m labkit.lab.compile_check_prefill --block-v 32 64 --num-warps 4 8 --num-stages 1 2 3
    python -m labkit.lab.compile_check_prefill --sequences 8 --walk-programs-per-sm 1 2 4 --wide-warps 4 8
    python -m labkit.lab.compile_check_prefill --fusions --no-chunk --gdn-block-t 16 32 64 --gdn-num-warps 4 8

``--fusions``: also the prefill's element-wise kernels (labkit.ops.prefill_fusions) at both real
presets' shapes, gdn_inputs at every combination of the ``--gdn-*`` settings given (default: the
launcher's), a 64-token tail's gate|up (the skinny GEMM with SwiGLU) and attention
(labkit.ops.tail_attention) in bf16 and float32, and a prompt's gate|up GEMM (labkit.ops.gemm_swiglu);
``--no-chunk`` leaves the delta rule out. A variant that needs more shared memory than the target
has fails (:mod:`labkit.lab.compile_check`), as its load would on the GPU.

The stand-in driver of ``python -m labkit compile-check`` (:mod:`labkit.lab.compile_check`: nothing
runs; Triton compiles each launch down to a cubin with its bundled ptxas), driven through the
prefill launcher at H = 16, K = V = 128, bf16, packed sequences with checkpoints (the four kernels
of the chunk path), and the single-chunk kernel (sequences of <= 64 tokens), at the launch
settings given (each a list: every combination is compiled; default: the launcher's). Like compile-check,
it replaces Triton's driver: run it as its own process.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch

SHOWN = ("BLOCK_V", "HAS_INIT", "CHECKPOINTS", "BLOCKS_FIRST", "TOGETHER")
# chunk_delta_rule's launch settings of the chunk path, each an option of this command (the flags
# among them as 0 or 1)
CHUNK_SETTINGS = ("block_v", "num_warps", "num_stages", "prepare_warps", "products_warps", "output_block_v",
                  "output_warps", "walk_programs_per_sm", "wide_warps", "wide_stages", "products_together")
FLAGS = ("products_together",)
# packed sequences of each call: 2 (a walk of 2 x 16 heads x 8 blocks of 16 columns = 256 programs
# keeps its narrow blocks) and 8 (1,024 narrow programs: the walk widens, labkit.ops.chunk_delta_rule.walk_block_v)
SEQUENCES = (2, 8)
GDN_SETTINGS = ("block_t", "num_warps", "heads_first")  # labkit.ops.prefill_fusions.gdn_inputs' (heads_first: 0 or 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.lab.compile_check_prefill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability x10 (90: H100/H200)")
    for name in CHUNK_SETTINGS:
        parser.add_argument("--" + name.replace("_", "-"), nargs="*", type=int, default=[None],
                            help="default: the launcher's")
    parser.add_argument("--walk-blocks-first", nargs="*", type=int, choices=(0, 1), default=[0, 1],
                        help="the walk's grid order (0: sequences first, 1: value blocks first)")
    parser.add_argument("--sequences", nargs="*", type=int, default=list(SEQUENCES),
                        help="packed sequences of each call (the walk widens its blocks for many)")
    parser.add_argument("--single-block-v", nargs="*", type=int, default=[None],
                        help="the single-chunk kernel's value columns (default: the launcher's choice)")
    parser.add_argument("--single-warps", nargs="*", type=int, default=[None], help="the single-chunk kernel's warps")
    parser.add_argument("--fusions", action="store_true", help="also the prefill's element-wise kernels")
    parser.add_argument("--no-chunk", action="store_true", help="leave out the chunked delta rule's kernels")
    for name in GDN_SETTINGS:
        parser.add_argument("--gdn-" + name.replace("_", "-"), nargs="*", type=int, default=[None],
                            help="gdn_inputs' " + name + " (default: the launcher's)")
    args = parser.parse_args(argv)

    from . import compile_check as cc

    if not cc.compile_only(args.arch):
        return 2
    from ..ops.features import stand_in

    t0 = time.time()
    with stand_in(f"compile-only sm_{args.arch}", divmod(args.arch, 10)):  # what that GPU would take (TMA)
        failures = _compile_fusions(args, t0) if args.fusions else 0
        if not args.no_chunk:
            failures += _compile_chunk(args, t0)
    report(cc.COMPILED, SHOWN + ("BLOCK_T", "HEADS_FIRST", "KW", "ROTATED_ONLY", "D"))
    print(f"\n{len(cc.COMPILED)} variants for sm_{args.arch} in {time.time() - t0:.0f} s; {failures} failures")
    return 1 if failures else 0


def _attempt(what: str, call, t0: float) -> int:
    """Compile what ``call`` launches; 1 if it failed (printed), else 0."""
    from . import compile_check as cc

    try:
        call()
        print(f"ok   {what}: {len(cc.COMPILED)} variants so far ({time.time() - t0:.0f} s)")
        return 0
    except Exception as e:  # noqa: BLE001
        print(f"FAIL {what}: {e!r}")
        return 1


def _compile_fusions(args: argparse.Namespace, t0: float) -> int:
    """Every kernel of labkit.ops.prefill_fusions at the shapes of a 4,096-token prefill of both presets."""
    from ..config import PRESETS
    from ..model import attention_dims, gdn_dims
    from ..ops import gemm_swiglu as gs
    from ..ops import linear
    from ..ops import prefill_fusions as pf
    from ..ops import tail_attention as ta

    for mod in (pf, linear, ta, gs):  # CPU tensors stand in; nothing runs
        mod.check_devices = lambda **tensors: torch.device("cpu")
    bf, T, failures = torch.bfloat16, 4096, 0
    for preset in ("qwen3.5-0.8b", "lfm2-350m"):
        cfg = PRESETS[preset]
        Hd, W = cfg.hidden_size, cfg.intermediate_size
        attn = attention_dims(cfg)
        proj = torch.empty(1, T, attn.proj_dim, dtype=bf)
        q = proj[..., :attn.num_heads * attn.head_dim].reshape(1, T, attn.num_heads, attn.head_dim)
        inv = torch.empty(cfg.rotary_dim // 2)
        q_end, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        kv_parts = (slice(q_end, q_end + kv), slice(q_end + kv, q_end + 2 * kv))
        kv_cache = torch.empty(2, 1, attn.num_kv_heads, T, attn.head_dim, dtype=bf)
        calls = {
            "rms_norm_rows": lambda: pf.rms_norm_rows(torch.empty(1, T, Hd, dtype=bf), torch.empty(Hd, dtype=bf), 1e-6),
            "swiglu_rows": lambda: pf.swiglu_rows(torch.empty(1, T, 2 * W, dtype=bf)),
            "norm_rope_rows": lambda: pf.norm_rope_rows(q, torch.empty(attn.head_dim, dtype=bf),
                                                        torch.empty(1, T, dtype=torch.long), inv, 1e-6),
            "attention_inputs": lambda: pf.attention_inputs(
                q, *(proj[..., s].reshape(1, T, attn.num_kv_heads, attn.head_dim) for s in kv_parts),
                torch.empty(attn.head_dim, dtype=bf), torch.empty(attn.head_dim, dtype=bf),
                torch.empty(1, T, dtype=torch.long), inv, 1e-6, False, *kv_cache,
                key_positions=torch.empty(1, T, dtype=torch.long)),
        }
        # a prefix-cache hit's tail of 64 tokens after 4,096 (the float32 models of the GPU suite too)
        for dt in (bf, torch.float32):
            name = str(dt).split(".")[-1]
            calls[f"gate_up_swiglu 64 rows {name}"] = (
                lambda dt=dt: pf.gate_up_swiglu(torch.empty(64, Hd, dtype=dt), torch.empty(2 * W, Hd, dtype=dt)))
            calls[f"attend_tail 64 tokens {name}"] = lambda dt=dt: ta.attend_tail(
                torch.empty(1, 64, attn.num_heads, attn.head_dim, dtype=dt).transpose(1, 2),
                *(torch.empty(1, attn.num_kv_heads, T + 64, attn.head_dim, dtype=dt) for _ in range(2)),
                torch.empty(1, 64, dtype=torch.long), torch.empty(1, T + 64, dtype=torch.long), start=T)
        for name, config in (("gemm_swiglu", gs.GemmConfig(128, 128, 32, 8, 8, 6)),
                             ("gemm_swiglu persistent", gs.GemmConfig(128, 128, 64, 8, 8, 3, persistent=True)),
                             ("gemm_swiglu persistent split store",
                              gs.GemmConfig(128, 128, 64, 8, 8, 4, persistent=True, split_store=True))):
            calls[name] = lambda config=config: gs.gemm_swiglu(torch.empty(T, Hd, dtype=bf),
                                                               torch.empty(2 * W, Hd, dtype=bf), config)
        if attn.output_gate:
            o = torch.empty(1, attn.num_heads, T, attn.head_dim, dtype=bf).transpose(1, 2)
            calls["sigmoid_gate_rows"] = lambda: pf.sigmoid_gate_rows(o, q)
        if "conv" in cfg.layer_types:
            calls["short_conv_prefill"] = lambda: pf.short_conv_prefill(
                torch.empty(1, T, 3 * Hd, dtype=bf), torch.empty(1, cfg.conv_kernel - 1, Hd, dtype=bf),
                torch.empty(Hd, cfg.conv_kernel, dtype=bf), update_state=True)
        if "gdn" in cfg.layer_types:
            dims = gdn_dims(cfg)
            gproj = torch.empty(1, T, dims.proj_dim, dtype=bf)
            z = gproj[..., :dims.value_dim].reshape(1, T, dims.num_v_heads, dims.v_head_dim)
            calls["gated_rms_norm_rows"] = lambda: pf.gated_rms_norm_rows(
                torch.empty(z.shape, dtype=bf), z, torch.empty(dims.v_head_dim, dtype=bf), 1e-6)
            gdn_args = (gproj, torch.empty(1, cfg.gdn_conv_kernel - 1, dims.conv_dim, dtype=bf),
                        torch.empty(dims.conv_dim, cfg.gdn_conv_kernel, dtype=bf), torch.empty(dims.num_v_heads),
                        torch.empty(dims.num_v_heads), dims)
            for values in itertools.product(*(getattr(args, "gdn_" + name) for name in GDN_SETTINGS)):
                settings = {n: (bool(v) if n == "heads_first" else v) for n, v in zip(GDN_SETTINGS, values) if v is not None}
                calls[f"gdn_inputs {settings or 'defaults'}"] = (
                    lambda settings=settings: pf.gdn_inputs(*gdn_args, update_state=True, **settings))
        for what, call in calls.items():
            failures += _attempt(f"{preset} {what}", call, t0)
    return failures


def _compile_chunk(args: argparse.Namespace, t0: float) -> int:
    """The chunk path's four kernels and the single-chunk kernel at H = 16, K = V = 128, bf16."""
    from ..ops import chunk_delta_rule as cdr

    cdr.check_devices = lambda **tensors: torch.device("cpu")  # CPU tensors stand in; nothing runs
    H, K, V, bf = 16, 128, 128, torch.bfloat16
    failures = 0
    for sequences, first, *values in itertools.product(args.sequences, args.walk_blocks_first,
                                                       *(getattr(args, name) for name in CHUNK_SETTINGS)):
        lengths = [100, 156] * (sequences // 2) + [100] * (sequences % 2)
        cdr._host_lengths = lambda cu_seqlens, tokens, lengths=lengths: lengths  # no read-back of a stand-in
        T = sum(lengths)
        q, k, v = (torch.empty(1, T, H, d, dtype=bf) for d in (K, K, V))
        g, beta = torch.empty(1, T, H), torch.empty(1, T, H, dtype=bf)
        state = torch.empty(len(lengths), H, K, V)
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        ckpt = torch.empty(cdr.num_checkpoints(lengths, 64), H, K, V)
        settings = {name: bool(value) if name in FLAGS else value
                    for name, value in zip(CHUNK_SETTINGS, values) if value is not None}
        settings["walk_blocks_first"] = bool(first)
        what = f"sequences={sequences} " + " ".join(f"{name}={value}" for name, value in settings.items())
        failures += _attempt(what, lambda: cdr.chunk_delta_rule(q, k, v, g, beta, state, cu_seqlens=cu, checkpoints=ckpt,
                                                                checkpoint_every=64, **settings), t0)
    # the single-chunk kernel (every sequence <= 64 tokens: a prefix-cache hit's tail), with and
    # without a start state, with checkpoints
    short = [64, 17]
    cdr._host_lengths = lambda cu_seqlens, tokens: short
    Ts = sum(short)
    qs, ks, vs = (torch.empty(1, Ts, H, d, dtype=bf) for d in (K, K, V))
    gs, betas = torch.empty(1, Ts, H), torch.empty(1, Ts, H, dtype=bf)
    cus = torch.tensor([0, short[0], Ts], dtype=torch.int32)
    ckpts = torch.empty(cdr.num_checkpoints(short, 64), H, K, V)
    for block_v, warps, init in itertools.product(args.single_block_v, args.single_warps, (True, False)):
        what = f"single_chunk block_v={block_v} warps={warps} initial_state={init}"
        settings = {name: value for name, value in (("single_block_v", block_v), ("single_warps", warps))
                    if value is not None}
        failures += _attempt(what, lambda: cdr.chunk_delta_rule(
            qs, ks, vs, gs, betas, state[:2] if init else None, cu_seqlens=cus, checkpoints=ckpts,
            checkpoint_every=64, single_chunk=True, **settings), t0)
    return failures


def report(compiled: dict, shown: tuple[str, ...]) -> None:
    """Warps, stages, registers, stack (spills), shared memory and the ``shown`` constexprs of every
    compiled variant."""
    from . import compile_check as cc

    print(f"\n{'kernel':26s} {'warps':>5s} {'stages':>6s} {'regs':>5s} {'stack':>6s} {'smem':>7s}  constexprs")
    for name, kernel in sorted(compiled.values(), key=lambda nk: nk[0]):
        usage = cc.resource_usage(kernel.asm["cubin"])
        names = kernel.src.fn.arg_names
        consts = ", ".join(f"{names[i[0]]}={val}" for i, val in kernel.src.constants.items() if names[i[0]] in shown)
        meta = kernel.metadata
        print(f"{name:26s} {meta.num_warps:5d} {meta.num_stages:6d} {usage['regs']:5d} {usage['stack']:6d} "
              f"{meta.shared:7d}  {consts}")
        if usage["stack"] > 0:
            print(f"  ^ {usage['stack']} bytes of stack: spills (or a local array)")


if __name__ == "__main__":
    sys.exit(main())
