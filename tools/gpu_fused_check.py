#!/usr/bin/env python
"""Check and time labkit's fused decode kernels on a CUDA GPU (written for an H200).

    python tools/gpu_fused_check.py                  # about 3 minutes (the first run also compiles)
    OUT=/some/dir python tools/gpu_fused_check.py    # also writes $OUT/fused_check.json
    python tools/gpu_fused_check.py --sweep          # also sweeps linear configs (10-20 more minutes)
                                                     # and prints entries for labkit.ops.linear.TUNED

For both presets (lfm2-350m, qwen3.5-0.8b; random bf16 weights from labkit.build):

(a) every op against its plain-torch reference at the real shapes (relative error, and exact
    repeatability of the split-K / arrival-counter paths);
(b) every op timed inside a CUDA graph, rotating over enough copies of its weights (or state, or
    KV cache) that nothing is served from L2, as a real decode step streams them: µs per call and
    GB/s against 4.25 TB/s; cuBLAS (torch.mm) beside each projection, and fla's
    fused_recurrent_gated_delta_rule beside the Gated DeltaNet kernel if fla is importable;
(c) the decode step end to end, tokens/s at batch 1 and 16 for reference / fused / fused+graph /
    fused+graph+pdl, with the fused+graph logits checked against the reference step by step;
(d) a compact table at the end.

Needs only torch and triton (and this repository). Any failure is printed and the script goes on.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

import labkit  # noqa: E402
from labkit import opbench  # noqa: E402
from labkit.backends import make_decoder  # noqa: E402
from labkit.ops.attention_decode import (  # noqa: E402
    AttentionDims, AttentionWorkspace, attention_chunk, attention_decode, attention_decode_ref,
)
from labkit.ops.gated_delta_decode import GdnDims, GdnWorkspace, gdn_decode, gdn_decode_ref  # noqa: E402
from labkit.ops.greedy_head import GreedyHeadBuffers, greedy_head, greedy_head_ref  # noqa: E402
from labkit.ops.linear import LinearConfig, LinearWorkspace, linear, linear_config, linear_ref  # noqa: E402
from labkit.ops.short_conv import short_conv_decode, short_conv_decode_ref  # noqa: E402

HBM_BYTES_PER_S = 4.25e12
DEVICE = "cuda"  # "cpu" (with TRITON_INTERPRET=1) only to dry-run the checks on the tiny presets
PRESETS = ("lfm2-350m", "qwen3.5-0.8b")
BATCHES = (1, 16)
RESULTS: dict = {"checks": [], "ops": [], "decode": [], "sweep": [], "errors": []}


@contextmanager
def guard(what: str):
    """Run one item; on failure print the traceback, record it, and carry on."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - the point is to keep going
        print(f"!! {what} failed: {e!r}")
        traceback.print_exc()
        RESULTS["errors"].append({"what": what, "error": repr(e)})
        if DEVICE == "cuda":
            torch.cuda.synchronize()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(preset: str, batch: int, what: str, err: float, bound: float, **extra) -> None:
    ok = err <= bound
    RESULTS["checks"].append({"preset": preset, "batch": batch, "what": what, "rel_err": err, "bound": bound, "ok": ok, **extra})
    print(f"  [{'ok' if ok else 'FAIL'}] {preset:13s} B={batch:<3d} {what:42s} rel err {err:.2e} (bound {bound:.0e})")


# -- timing: labkit.opbench's graph timer (each op inside a CUDA graph, operands cold in L2) --------
L2_BYTES = 0


def copies_for(nbytes: int, cap: int = 64) -> int:
    return opbench.copies_for(nbytes, DEVICE, cap)


def bench(calls, n_calls: int, reps: int = 15) -> float:
    return opbench.graph_us(calls, n_calls, reps)


def record_op(preset: str, batch: int, op: str, impl: str, us: float, nbytes: int, **extra) -> None:
    gbs = nbytes / (us * 1e-6) / 1e9
    RESULTS["ops"].append({"preset": preset, "batch": batch, "op": op, "impl": impl, "us": us, "bytes": nbytes,
                           "GB/s": gbs, "of_hbm": gbs * 1e9 / HBM_BYTES_PER_S, **extra})
    print(f"  {preset:13s} B={batch:<3d} {op:28s} {impl:10s} {us:8.2f} µs  {gbs:7.0f} GB/s ({gbs * 1e9 / HBM_BYTES_PER_S:5.1%})")


# -- the ops of one preset ---------------------------------------------------------------------------
def run_linear(preset: str, model: labkit.HybridLM, batch: int, do_time: bool) -> None:
    cfg = model.cfg
    gen = torch.Generator(device=DEVICE).manual_seed(batch)
    for case in opbench.linear_cases(model):
        name, w = case.name, case.weight
        with guard(f"{preset} B={batch} linear {name}"):
            rows, k = w.shape
            swiglu, conv_w, blocks, n = case.swiglu, case.conv_weight, case.row_blocks, case.outputs
            x = torch.randn(batch, k, device=DEVICE, dtype=w.dtype, generator=gen)
            res = torch.randn(batch, n, device=DEVICE, dtype=w.dtype, generator=gen) if case.residual else None
            state = None
            if conv_w is not None:
                state = torch.randn(batch, conv_w.shape[1] - 1, n, device=DEVICE, dtype=w.dtype, generator=gen)
            norm = case.norm_weight
            config = linear_config(batch, n, k, row_blocks=blocks)
            ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, n, config, blocks), DEVICE)
            common = dict(norm_weight=norm, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset, swiglu=swiglu)

            def conv(st):
                return None if st is None else (st, conv_w)

            ref = linear_ref(x, w, residual=res, short_conv=conv(state), **common)
            out = torch.full((batch, n), float("nan"), dtype=w.dtype, device=DEVICE)
            s1 = None if state is None else state.clone()
            got = linear(x, w, out=out if res is None else None, residual=res.clone() if res is not None else None,
                         short_conv=conv(s1), config=config, workspace=ws, **common)
            s2 = None if state is None else state.clone()
            again = linear(x, w, residual=res.clone() if res is not None else None, short_conv=conv(s2),
                           config=config, workspace=ws, **common)
            check(preset, batch, f"linear {name}", rel_err(got, ref), 1e-2, config=repr(config))
            check(preset, batch, f"linear {name} repeat is exact", 0.0 if torch.equal(got, again) else 1.0, 0.0)
            if state is not None:
                y_proj = linear_ref(x, w, **common)
                check(preset, batch, f"linear {name} conv state", rel_err(s1, short_conv_decode_ref(y_proj, state, conv_w)[1]), 1e-2)
            if not do_time:
                continue
            nbytes = w.numel() * w.element_size()
            copies = copies_for(nbytes)
            ws_ = [w] + [w.clone() for _ in range(copies - 1)]
            h = res.clone() if res is not None else None
            y = torch.empty(batch, n, dtype=w.dtype, device=DEVICE)

            def ours():
                for wi in ws_:
                    linear(x, wi, out=y if h is None else None, residual=h, short_conv=conv(state), config=config,
                           workspace=ws, **common)

            record_op(preset, batch, name, "triton", bench(ours, copies), nbytes, config=repr(config))
            y_full = torch.empty(batch, rows, dtype=w.dtype, device=DEVICE)

            def cublas():
                for wi in ws_:
                    torch.mm(x, wi.t(), out=y_full)

            record_op(preset, batch, name, "cublas", bench(cublas, copies), nbytes)
            del ws_


def run_greedy_head(preset: str, model: labkit.HybridLM, batch: int, do_time: bool) -> None:
    cfg = model.cfg
    with guard(f"{preset} B={batch} greedy head"):
        w = model.lm_head_weight
        x = torch.randn(batch, cfg.hidden_size, dtype=w.dtype, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(7))
        config = linear_config(batch, cfg.vocab_size, cfg.hidden_size, argmax=True)
        kw = dict(norm_weight=model.final_norm.weight, norm_eps=cfg.norm_eps, norm_unit_offset=cfg.norm_unit_offset)
        bufs = GreedyHeadBuffers.allocate(batch, cfg.vocab_size, config, DEVICE)
        logits = torch.empty(batch, cfg.vocab_size, dtype=w.dtype, device=DEVICE)
        tok = greedy_head(x, w, logits_out=logits, config=config, buffers=bufs, **kw)
        check(preset, batch, "greedy head == argmax(own logits)", 0.0 if torch.equal(tok, logits.argmax(-1)) else 1.0, 0.0)
        agree = (tok == greedy_head_ref(x, w, **kw)).float().mean().item()
        check(preset, batch, "greedy head vs reference argmax (disagree)", 1.0 - agree, 0.2)
        if do_time:
            out = torch.empty(batch, dtype=torch.long, device=DEVICE)
            us = bench(lambda: greedy_head(x, w, tokens_out=out, config=config, buffers=bufs, **kw), 1)
            record_op(preset, batch, "norm+lm_head+argmax", "triton", us, w.numel() * w.element_size())


def run_short_conv(preset: str, model: labkit.HybridLM, batch: int, do_time: bool) -> None:
    cfg = model.cfg
    if "conv" not in cfg.layer_types:
        return
    with guard(f"{preset} B={batch} short conv"):
        layer = model.layers[cfg.layer_types.index("conv")].mixer
        H, dt = cfg.hidden_size, model.dtype
        gen = torch.Generator(device=DEVICE).manual_seed(3)
        proj = torch.randn(batch, 3 * H, dtype=dt, device=DEVICE, generator=gen)
        state = torch.randn(batch, cfg.conv_kernel - 1, H, dtype=dt, device=DEVICE, generator=gen)
        y_ref, state_ref = short_conv_decode_ref(proj, state, layer.conv_weight)
        y = short_conv_decode(proj, state, layer.conv_weight)
        check(preset, batch, "short conv output", rel_err(y, y_ref), 1e-2)
        check(preset, batch, "short conv state", rel_err(state, state_ref), 1e-6)
        if do_time:
            nbytes = proj.numel() * 2 + 2 * state.numel() * 2 + y.numel() * 2 + layer.conv_weight.numel() * 2
            copies = 16
            states = [state.clone() for _ in range(copies)]
            us = bench(lambda: [short_conv_decode(proj, s, layer.conv_weight, out=y) for s in states], copies)
            record_op(preset, batch, "short conv (conv+state+gate)", "triton", us, nbytes)


def run_gdn(preset: str, model: labkit.HybridLM, batch: int, do_time: bool) -> None:
    cfg = model.cfg
    if "gdn" not in cfg.layer_types:
        return
    with guard(f"{preset} B={batch} gated deltanet"):
        layer = model.layers[cfg.layer_types.index("gdn")].mixer
        dims = GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim)
        dt = model.dtype
        gen = torch.Generator(device=DEVICE).manual_seed(4)
        proj = torch.randn(batch, dims.proj_dim, dtype=dt, device=DEVICE, generator=gen)
        conv_state = torch.randn(batch, cfg.gdn_conv_kernel - 1, dims.conv_dim, dtype=dt, device=DEVICE, generator=gen)
        state = 0.1 * torch.randn(batch, dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, device=DEVICE, generator=gen)
        w = (layer.conv_weight, layer.A_log, layer.dt_bias, layer.norm_weight)
        out_ref, conv_ref, state_ref = gdn_decode_ref(proj, conv_state, w[0], w[1], w[2], w[3], state, dims, cfg.norm_eps)
        ws = GdnWorkspace.allocate(batch, dims, DEVICE)
        out = gdn_decode(proj, conv_state, *w, state, dims, cfg.norm_eps, workspace=ws)
        check(preset, batch, "gdn output", rel_err(out, out_ref), 1e-2)
        check(preset, batch, "gdn conv state", rel_err(conv_state, conv_ref), 1e-6)
        check(preset, batch, "gdn recurrent state", rel_err(state, state_ref), 1e-5)
        for block_v in (8, 32, 128):  # the split-head paths too
            c2, s2 = conv_ref.clone(), state_ref.clone()
            o_ref2, _, s_ref2 = gdn_decode_ref(proj, c2, *w, s2, dims, cfg.norm_eps)
            o2 = gdn_decode(proj, c2, *w, s2, dims, cfg.norm_eps, workspace=ws, block_v=block_v)
            check(preset, batch, f"gdn 2nd step, block_v={block_v}", max(rel_err(o2, o_ref2), rel_err(s2, s_ref2)), 1e-2)
        if do_time:
            nbytes = 2 * state.numel() * 4 + proj.numel() * 2 + 2 * conv_state.numel() * 2 + out.numel() * 2
            copies = copies_for(state.numel() * 4)
            states = [state.clone() for _ in range(copies)]
            convs = [conv_state.clone() for _ in range(copies)]
            o = torch.empty_like(out)
            us = bench(lambda: [gdn_decode(proj, c, *w, s, dims, cfg.norm_eps, out=o, workspace=ws) for c, s in zip(convs, states)], copies)
            record_op(preset, batch, "gated deltanet (all fused)", "triton", us, nbytes)
    if do_time:
        run_fla(preset, batch, GdnDims(cfg.gdn_num_k_heads, cfg.gdn_num_v_heads, cfg.gdn_k_head_dim, cfg.gdn_v_head_dim))


def run_fla(preset: str, batch: int, dims: GdnDims) -> None:
    """flash-linear-attention's recurrent step (the delta rule alone, q/k/v/gates given), if installed."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as e:  # noqa: BLE001
        print(f"  (fla not importable: {e!r}; skipping its timing)")
        return
    with guard(f"{preset} B={batch} fla fused_recurrent_gated_delta_rule"):
        H, K, V, dt = dims.num_v_heads, dims.k_head_dim, dims.v_head_dim, torch.bfloat16
        q = torch.randn(batch, 1, H, K, dtype=dt, device=DEVICE)
        k = torch.nn.functional.normalize(torch.randn(batch, 1, H, K, device=DEVICE), dim=-1).to(dt)
        v = torch.randn(batch, 1, H, V, dtype=dt, device=DEVICE)
        g = -torch.rand(batch, 1, H, device=DEVICE)
        beta = torch.rand(batch, 1, H, device=DEVICE).to(dt)
        state_bytes = batch * H * K * V * 4
        copies = copies_for(state_bytes)
        states = [torch.zeros(batch, H, K, V, device=DEVICE) for _ in range(copies)]

        def fla():
            for s in states:
                fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=s, output_final_state=True)

        record_op(preset, batch, "gated deltanet (delta rule only)", "fla", bench(fla, copies), 2 * state_bytes)


def run_attention(preset: str, model: labkit.HybridLM, batch: int, do_time: bool) -> None:
    cfg = model.cfg
    with guard(f"{preset} B={batch} attention"):
        layer = model.layers[cfg.layer_types.index("attention")].mixer
        dims = AttentionDims(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rotary_dim, cfg.attn_output_gate)
        dt, max_len = model.dtype, (4096 if DEVICE == "cuda" else 40)
        gen = torch.Generator(device=DEVICE).manual_seed(5)
        proj = torch.randn(batch, dims.proj_dim, dtype=dt, device=DEVICE, generator=gen)
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        keys = torch.randn(shape, dtype=dt, device=DEVICE, generator=gen)
        values = torch.randn(shape, dtype=dt, device=DEVICE, generator=gen)
        # long contexts (RoPE at large angles, many chunks to merge), a first token, the last slot
        long = max_len - 96 if max_len > 96 else max_len // 2
        lengths = [long] if batch == 1 else ([long, 0, max_len - 1] + [(257 * i) % max_len for i in range(1, batch)])[:batch]
        lengths = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
        args = (layer.q_norm.weight, layer.k_norm.weight, layer.inv_freq)
        out_ref, k_ref, v_ref = attention_decode_ref(proj, *args, keys, values, lengths, dims, cfg.norm_eps, cfg.norm_unit_offset)
        chunk, _ = attention_chunk(max_len, cfg.head_dim)
        ws = AttentionWorkspace.allocate(batch, dims, -(-max_len // chunk), DEVICE)
        out = attention_decode(proj, *args, keys, values, lengths, dims, cfg.norm_eps, cfg.norm_unit_offset, workspace=ws)
        check(preset, batch, "attention output", rel_err(out, out_ref), 1e-2)
        check(preset, batch, "attention new k in cache", rel_err(keys, k_ref), 1e-2)
        check(preset, batch, "attention new v in cache", 0.0 if torch.equal(values, v_ref) else 1.0, 0.0)
        if do_time:
            # bytes actually read: the cached positions of each sequence
            n_pos = int(lengths.sum()) + batch
            nbytes = 2 * n_pos * cfg.num_kv_heads * cfg.head_dim * 2 + proj.numel() * 2
            copies = copies_for(keys.numel() * 4, cap=16)
            kv = [(keys, values)] + [(keys.clone(), values.clone()) for _ in range(copies - 1)]
            o = torch.empty_like(out)
            us = bench(lambda: [attention_decode(proj, *args, kk, vv, lengths, dims, cfg.norm_eps, cfg.norm_unit_offset,
                                                 out=o, workspace=ws) for kk, vv in kv], copies)
            record_op(preset, batch, f"attention (ctx ~{int(lengths.float().mean())})", "triton", us, nbytes)
            del kv


# -- end to end -------------------------------------------------------------------------------------
def run_decode(preset: str, model: labkit.HybridLM, do_time: bool) -> None:
    V = model.cfg.vocab_size
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    names = ["reference", "fused"] + (["fused+graph", "fused+graph+pdl"] if DEVICE == "cuda" else [])
    main = names[min(2, len(names) - 1)]
    for batch in BATCHES:
        prompt = torch.randint(0, V, (batch, 32), device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(0))
        with guard(f"{preset} B={batch} decode logits check"):
            # teacher-forced: the reference's greedy tokens fed to all; graph and eager must agree exactly
            decs = {name: make_decoder(name, model, model.new_cache(batch, 48)) for name in names}
            # float32 weights of the same model: the truth both bf16 implementations approximate
            truth_model = copy.deepcopy(model).float()
            decs["float32"] = make_decoder("reference", truth_model, truth_model.new_cache(batch, 48))
            logits = {name: d.prefill(prompt) for name, d in decs.items()}
            token = logits["reference"].argmax(-1)
            worst, exact_graph, exact_pdl, agree = 0.0, True, True, []
            ours_vs_truth = ref_vs_truth = 0.0
            for _ in range(6):
                logits = {name: d.step(token).clone() for name, d in decs.items()}
                worst = max(worst, rel_err(logits[main], logits["reference"]))
                ours_vs_truth = max(ours_vs_truth, rel_err(logits[main], logits["float32"]))
                ref_vs_truth = max(ref_vs_truth, rel_err(logits["reference"], logits["float32"]))
                if "fused+graph" in logits:
                    exact_graph &= torch.equal(logits["fused+graph"], logits["fused"])
                    exact_pdl &= torch.equal(logits["fused+graph+pdl"], logits["fused+graph"])
                agree.append((logits[main].argmax(-1) == logits["reference"].argmax(-1)).float().mean().item())
                token = logits["reference"].argmax(-1)
            # Random weights give nearly flat logits, so two bf16 implementations can differ by a few
            # percent (Qwen3.5's reference itself is ~9e-2 from float32): the fused step must be as close
            # to the float32 truth as the bf16 reference is, within a factor 2 for rounding at other
            # places (a wrong kernel lands far outside it). The direct distance is info.
            check(preset, batch, f"decode step logits, {main} vs float32 (bound: 2x the bf16 reference's)",
                  ours_vs_truth, 2 * ref_vs_truth + 1e-3)
            check(preset, batch, f"decode step logits, {main} vs bf16 reference (info)", worst, 1.0)
            if "fused+graph" in logits:
                check(preset, batch, "decode step: graph == eager fused, exactly", 0.0 if exact_graph else 1.0, 0.0)
                check(preset, batch, "decode step: pdl == graph, exactly", 0.0 if exact_pdl else 1.0, 0.0)
            # informational: random weights give flat logits, where bf16 noise flips near-ties
            check(preset, batch, "decode greedy token disagreement (info)", 1.0 - statistics.mean(agree), 1.0)
            del decs, logits, truth_model
            gc.collect()
        if not do_time:
            continue
        for backend, new in (("reference", 8), ("fused", 16), ("fused+graph", 128), ("fused+graph+pdl", 128)):
            with guard(f"{preset} B={batch} decode {backend}"):
                cache = model.new_cache(batch, 32 + new)
                labkit.generate(model, prompt, 4, backend=backend, cache=cache)  # compile, capture, warm up
                out = labkit.generate(model, prompt, new, backend=backend, cache=cache)
                tps = out.decode_tokens_per_s
                step_s = out.decode_s / max(out.steps, 1)
                gbs = weight_bytes / step_s / 1e9  # every weight byte is read once per step
                RESULTS["decode"].append({"preset": preset, "batch": batch, "backend": backend, "tokens_per_s": tps,
                                          "steps": out.steps, "ms_per_step": 1e3 * step_s, "weight_GB/s": gbs})
                print(f"  {preset:13s} B={batch:<3d} {backend:16s} {tps:9.1f} tok/s  ({1e3 * step_s:.3f} ms/step, "
                      f"weights at {gbs:.0f} GB/s = {gbs * 1e9 / HBM_BYTES_PER_S:.0%} of HBM)")
                del cache, out
                gc.collect()


# -- sweep ----------------------------------------------------------------------------------------------
def sweep_configs(m: int, n: int, k: int, blocks: int) -> list[LinearConfig]:
    """Candidate blockings; for the GEMV (m == 1) each thread keeps 8..64 float32 accumulators."""
    cands = []
    if m == 1:
        whole = min(4096, triton.next_power_of_2(k))
        for bk in sorted({512, 1024, whole}):
            iters = math.ceil(k / bk)
            for bn in (1, 2, 4, 8):
                for nw in (2, 4, 8):
                    per_thread = bn * bk * blocks / (32 * nw)
                    if not 8 <= per_thread <= 64:
                        continue
                    splits = [d for d in (1, 2, 3, 4, 6, 8, 9) if iters % d == 0]
                    fill = [d for d in splits if math.ceil(n / bn) * d >= 4 * 132]
                    for sk in sorted({1, *(fill[:1] or splits[-1:])}):
                        cands.append(LinearConfig(1, bn, bk, sk, nw, 1))
    else:
        bucket = max(16, triton.next_power_of_2(m))
        cands = [LinearConfig(bucket, bn, bk, sk, nw, 3) for bn in (16, 32, 64) for bk in (128, 256)
                 for sk in (1, 2, 4, 8) for nw in (4, 8)
                 if k % (bk * sk) == 0 and math.ceil(n / bn) * sk >= 64 and bn * bk * blocks <= 16384]
    return cands


def run_sweep(preset: str, model: labkit.HybridLM, batches=None, log=None) -> None:
    """Time every candidate blocking of every projection (and, to see what the RMSNorm prologue
    costs, the normed ones once more without it); print and append each winner to ``log``."""
    cfg = model.cfg
    cases = opbench.linear_cases(model, lm_head=False)  # the head is at 76-87% of HBM already, and slow to sweep
    cases += [c.without_norm() for c in cases if c.norm_weight is not None]
    for batch in batches or BATCHES:
        for case in cases:
            name, w = case.name, case.weight
            with guard(f"sweep {preset} B={batch} {name}"):
                k = w.shape[1]
                swiglu, conv_w, blocks, n = case.swiglu, case.conv_weight, case.row_blocks, case.outputs
                x = torch.randn(batch, k, dtype=w.dtype, device=DEVICE)
                h = torch.randn(batch, n, dtype=w.dtype, device=DEVICE) if case.residual else None
                y = torch.empty(batch, n, dtype=w.dtype, device=DEVICE)
                copies = copies_for(w.numel() * 2)
                ws_ = [w] + [w.clone() for _ in range(copies - 1)]
                short_conv = None
                if conv_w is not None:
                    short_conv = (torch.zeros(batch, conv_w.shape[1] - 1, n, dtype=w.dtype, device=DEVICE), conv_w)
                common = dict(norm_weight=case.norm_weight, norm_eps=cfg.norm_eps,
                              norm_unit_offset=cfg.norm_unit_offset, swiglu=swiglu, short_conv=short_conv)
                default = linear_config(batch, n, k, row_blocks=blocks)
                results = []
                t0 = time.time()
                for c in [default] + [c for c in sweep_configs(batch, n, k, blocks) if c != default]:
                    with guard(f"sweep {preset} B={batch} {name} {c}"):
                        ws = LinearWorkspace.allocate(*LinearWorkspace.needed(batch, n, c, blocks), DEVICE)
                        us = bench(lambda: [linear(x, wi, out=y if h is None else None, residual=h, config=c,
                                                   workspace=ws, **common) for wi in ws_], copies, reps=7)
                        results.append((us, c))
                best_us, best = min(results, key=lambda r: r[0])
                default_us = results[0][0]
                nbytes = w.numel() * w.element_size()
                row = {"preset": preset, "batch": batch, "op": name, "n": n, "k": k, "row_blocks": blocks,
                       "bytes": nbytes, "best": repr(best), "best_us": best_us, "best_of_hbm": nbytes / best_us / 1e-6 / HBM_BYTES_PER_S,
                       "default": repr(default), "default_us": default_us, "candidates": len(results),
                       "all": sorted([(round(u, 3), repr(c)) for u, c in results])[:8]}
                RESULTS["sweep"].append(row)
                if log is not None:
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                print(f"  {preset} B={batch} {name:34s} default {default_us:7.2f} µs  best {best_us:7.2f} µs "
                      f"({row['best_of_hbm']:.0%} HBM, {len(results)} configs, {time.time() - t0:.0f} s)  {best}")
                del ws_


# -- main ----------------------------------------------------------------------------------------------
def print_table() -> None:
    print("\n" + "=" * 100)
    bad = [c for c in RESULTS["checks"] if not c["ok"]]
    print(f"checks: {len(RESULTS['checks']) - len(bad)} ok, {len(bad)} failed")
    for c in bad:
        print(f"  FAIL {c['preset']} B={c['batch']} {c['what']}: {c['rel_err']:.2e} > {c['bound']:.0e}")
    print("\nops (µs per call inside a CUDA graph, weights/state/KV cold in L2):")
    print(f"  {'preset':13s} {'B':>3s} {'op':34s} {'triton µs':>10s} {'GB/s':>7s} {'%HBM':>6s} {'other':>18s}")
    for r in RESULTS["ops"]:
        if r["impl"] != "triton":
            continue
        other = [o for o in RESULTS["ops"] if o["preset"] == r["preset"] and o["batch"] == r["batch"]
                 and o["op"].split(" (")[0] == r["op"].split(" (")[0] and o["impl"] != "triton"]
        o = f"{other[0]['impl']} {other[0]['us']:.2f} µs" if other else ""
        print(f"  {r['preset']:13s} {r['batch']:3d} {r['op']:34s} {r['us']:10.2f} {r['GB/s']:7.0f} {r['of_hbm']:6.1%} {o:>18s}")
    print("\ndecode (tokens/s, all sequences):")
    for preset in PRESETS:
        for batch in BATCHES:
            rows = [d for d in RESULTS["decode"] if d["preset"] == preset and d["batch"] == batch]
            if rows:
                print(f"  {preset:13s} B={batch:<3d} " + "  ".join(f"{d['backend']}: {d['tokens_per_s']:.0f}" for d in rows))
    if RESULTS["sweep"]:
        print("\nsweep winners (paste into labkit.ops.linear.TUNED):")
        for s in RESULTS["sweep"]:
            if s["best"] != s["default"]:
                bucket = 1 if s["batch"] == 1 else max(16, triton.next_power_of_2(s["batch"]))
                print(f"    ({bucket}, {s['n']}, {s['k']}, {s['row_blocks']}): {s['best']},  # {s['default_us']:.2f} -> {s['best_us']:.2f} µs")
    if RESULTS["errors"]:
        print(f"\n{len(RESULTS['errors'])} items failed to run: " + "; ".join(e["what"] for e in RESULTS["errors"]))


def main() -> int:
    global L2_BYTES, DEVICE, BATCHES
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="also sweep linear configs (slow)")
    parser.add_argument("--sweep-only", action="store_true", help="only the sweep (results stream to $OUT/sweep.jsonl)")
    parser.add_argument("--batches", nargs="*", type=int, help="batches to run (default 1 16)")
    parser.add_argument("--no-time", action="store_true", help="correctness only")
    parser.add_argument("--presets", nargs="*", default=list(PRESETS))
    parser.add_argument("--dry-run-cpu", action="store_true",
                        help="run the checks on the CPU interpreter (use tiny presets; needs TRITON_INTERPRET=1)")
    args = parser.parse_args()
    if args.dry_run_cpu:
        DEVICE, BATCHES, args.no_time = "cpu", (1, 3), True
        RESULTS.update(device="cpu (Triton interpreter)")
    elif not torch.cuda.is_available():
        print("this script needs a CUDA GPU (or --dry-run-cpu with TRITON_INTERPRET=1 and tiny presets)")
        return 2
    else:
        props = torch.cuda.get_device_properties(0)
        L2_BYTES = getattr(props, "L2_cache_size", 50 * 2**20) or 50 * 2**20
        RESULTS.update(device=props.name, sms=props.multi_processor_count, l2_bytes=L2_BYTES)
        print(f"{props.name}: {props.multi_processor_count} SMs, L2 {L2_BYTES / 2**20:.0f} MiB")
    if args.batches:
        BATCHES = tuple(args.batches)
    if args.sweep_only:
        out_dir = os.environ.get("OUT", ".")
        with open(Path(out_dir) / "sweep.jsonl", "a") as log:
            for preset in args.presets:
                model = labkit.build(preset, dtype=torch.bfloat16, device=DEVICE, seed=0)
                run_sweep(preset, model, log=log)
                del model
        print_table()
        return 0
    RESULTS.update(torch=torch.__version__, triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                   argv=sys.argv[1:])
    print(f"torch {torch.__version__}, triton {triton.__version__}")
    t0 = time.time()
    for preset in args.presets:
        model = None
        with guard(f"build {preset}"):
            model = labkit.build(preset, dtype=torch.bfloat16, device=DEVICE, seed=0)
        if model is None:
            continue
        for batch in BATCHES:
            print(f"\n== {preset}, batch {batch}: ops (check{'' if args.no_time else ' + time'}) ==")
            for fn in (run_linear, run_greedy_head, run_short_conv, run_gdn, run_attention):
                fn(preset, model, batch, not args.no_time)
        print(f"\n== {preset}: decode step end to end ==")
        run_decode(preset, model, not args.no_time)
        if args.sweep:
            print(f"\n== {preset}: linear config sweep ==")
            run_sweep(preset, model)
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    RESULTS["seconds"] = time.time() - t0
    print_table()
    print(f"\ntotal {RESULTS['seconds']:.0f} s")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "fused_check.json"
        path.write_text(json.dumps(RESULTS, indent=1, default=str))
        print(f"wrote {path}")
    return 1 if any(not c["ok"] for c in RESULTS["checks"]) or RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
