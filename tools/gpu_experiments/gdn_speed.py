"""Round B of gdn-speed (issue #12): the chunked gated-delta-rule prefill's forms and launch options,
each checked against its reference at the real shape, then timed in CUDA graphs beside fla in the
same run; and the q/k RMSNorm + RoPE kernel's two forms. Three roles (tools/gpu_experiments/gdn-speed.sh
runs them):

    python3 gdn_speed.py lab RES     # labkit: check every variant, wait for fla's timing, time them
    python3 gdn_speed.py fla RES     # fla: warm up (autotune) while lab checks, then time, then profile
    python3 gdn_speed.py precompile DIR   # on a machine without a GPU: compile every lab launch for
                                          # sm_90 into the Triton cache DIR (the GPU run reuses it)

The two GPU roles take turns through flag files in RES, so that no timing overlaps another
process's GPU work. GDN_SPEED_DRY=1 runs lab's checks on tiny shapes in the interpreter (CPU).
Every row lands in RES/*.json as soon as it exists (a timeout keeps what finished).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

T_START = time.time()
ROLE = sys.argv[1]
RES = Path(sys.argv[2])
DRY = os.environ.get("GDN_SPEED_DRY") == "1"
if ROLE == "precompile":
    from labkit.lab import compile_check as cc

    assert cc.compile_only(90)
elif DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HEADS, DIM = (2, 32) if DRY else (16, 128)
# (sequences, tokens each). The packed batch (8, 2048) was timed in the first run (05:51): each case
# of another program count compiles every kernel again (BLOCK_N), which this run cannot afford.
CASES = [(1, 256), (2, 128)] if DRY else [(1, 4096), (1, 16384)]
CHECK_CASE = CASES[0]  # against the step-by-step recurrence (float32); the others against the first variant
BOUND = 1e-2  # bf16 inputs (tests/test_ops_chunk_delta_rule.py's bound)
REPS = 3 if DRY else 10
CHECK_UNTIL_S = 60  # seconds into the run after which lab checks (and so compiles) no further variant
DEVICE = "cpu" if DRY or ROLE == "precompile" else "cuda"

# (name, chunk_delta_rule options). The old form and this morning's default first; then the new
# solve (row-substitution inverse) and products (X whole), then warps / walk shapes from that base.
BASE = dict(prepare="split", defer_outputs=True, invert="rows", products="full", prepare_warps=4)
VARIANTS = [  # most telling first: compiles take 5-20 s a variant on the GPU host, so only a prefix is checked
    # the first run (05:51, B = rows+full+pw4 against this morning's default and the old form, all three
    # cases) settled the prepare; this one is about the walk (472 of B's 922 us at 16k), the output
    # kernel and P, and the merged prepare
    ("rows+full+pw4", BASE),
    ("B+recompute-p", {**BASE, "recompute_p": True}),
    ("C:B+recompute-p+bv16", {**BASE, "recompute_p": True, "block_v": 16}),
    ("B+walk4", {**BASE, "num_warps": 4}),
    ("B+split-auto", {**BASE, "split": "auto"}),
    ("C:merged8+recompute-p", {**BASE, "prepare": "merged", "prepare_warps": 8, "recompute_p": True}),
    ("C:B+recompute-p+bv16+walk4", {**BASE, "recompute_p": True, "block_v": 16, "num_warps": 4}),
    ("B+stages3", {**BASE, "num_stages": 3}),
    ("B+bv64", {**BASE, "block_v": 64}),
    ("C:B+recompute-p+split-auto", {**BASE, "recompute_p": True, "split": "auto"}),
    ("B+walk-outputs", {**BASE, "defer_outputs": False}),
    ("rows+full+pw8+ppw4", {**BASE, "prepare_warps": 8, "products_warps": 4}),
    ("B+stages1", {**BASE, "num_stages": 1}),
    ("B+recompute-p+ob128", {**BASE, "recompute_p": True, "output_block_v": 128}),
    ("old:fused+walk-outputs", dict(prepare="fused", defer_outputs=False, prepare_warps=8)),
]


def options(kw: dict, sequences: int, length: int) -> dict:
    """chunk_delta_rule's keyword arguments for a variant and case: split 0 unless the variant names
    one ("auto": what prefill_split picks for the case)."""
    from labkit.ops.chunk_delta_rule import prefill_block_v, prefill_split

    kw = dict(kw)
    split = kw.pop("split", 0)
    if split == "auto":
        blocks = -(-DIM // (kw.get("block_v") or prefill_block_v(DIM)))
        split = prefill_split(sequences, HEADS, blocks, sequences * length)
    return {**kw, "split": split}


PROFILED = ["B+recompute-p", "C:B+recompute-p+bv16", "C:merged8+recompute-p", "B+walk4"]


def log(*a):
    print(f"[{time.time() - T_START:5.1f}s]", *a, flush=True)


def inputs(sequences: int, length: int, seed: int = 0) -> dict:
    """labkit.bench.gdn_prefill's inputs (the same generator and order), on DEVICE."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    total = sequences * length

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen)

    q = F.normalize(randn(1, total, HEADS, DIM), dim=-1).bfloat16()
    k = F.normalize(randn(1, total, HEADS, DIM), dim=-1).bfloat16()
    v = randn(1, total, HEADS, DIM).bfloat16()
    g = -F.softplus(randn(1, total, HEADS) - 3)
    beta = torch.sigmoid(randn(1, total, HEADS)).bfloat16()
    state = randn(sequences, HEADS, DIM, DIM) * 0.1
    cu = torch.arange(0, total + 1, length, dtype=torch.int64, device=DEVICE)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=state, cu_seqlens=cu if sequences > 1 else None)


def save(name: str, rows) -> None:
    (RES / name).write_text(json.dumps(rows, indent=1))


def wait_for(flag: str, until_s: float) -> bool:
    while time.time() - T_START < until_s:
        if (RES / flag).exists():
            return True
        time.sleep(0.05)
    return False


def kernel_times(call, calls: int = 3) -> dict[str, float]:
    """Microseconds per call of each CUDA kernel in ``call`` (torch.profiler, eager launches)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            out[e.key[:60]] = round(t / calls, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# -- labkit -------------------------------------------------------------------------------------------
def lab() -> None:
    from labkit.bench.ops import rel_err
    from labkit.ops.chunk_delta_rule import chunk_delta_rule
    from labkit.ops.delta_rule import delta_rule_recurrent_ref

    rows = []
    data = {case: inputs(*case) for case in CASES}

    def run(x, kw):
        out = torch.full_like(x["v"], float("nan"))
        fin = torch.full_like(x["initial_state"], float("nan"))
        return chunk_delta_rule(**x, out=out, final_state=fin, **kw)

    # references: the recurrence at CHECK_CASE (float32, step by step), the old form elsewhere
    x = data[CHECK_CASE]
    truth = delta_rule_recurrent_ref(x["q"].float(), x["k"].float(), x["v"].float(), x["g"], x["beta"].float(),
                                     x["initial_state"])
    log("recurrence reference done")
    refs = {CHECK_CASE: truth}
    ok = []
    for name, kw in VARIANTS:
        row = dict(variant=name, options=kw, checks={})
        t0 = time.time()
        if not DRY and t0 - T_START > CHECK_UNTIL_S:  # compiles ran long (a Triton cache miss): time what passed
            row["error"] = "skipped: the check phase's budget was spent"
            rows.append(row)
            continue
        try:
            for case in CASES:
                o, s = run(data[case], options(kw, *case))
                row.setdefault("split", {})[f"{case}"] = options(kw, *case)["split"]
                if case not in refs:  # the first variant (B, checked against the old form at 05:51) elsewhere
                    refs[case] = (o.float(), s.clone())
                    row["checks"][f"{case}"] = "is the reference"
                    continue
                eo, es = rel_err(o.float(), refs[case][0]), rel_err(s, refs[case][1])
                row["checks"][f"{case}"] = dict(o=eo, state=es)
                if not (eo < BOUND and es < BOUND):
                    raise AssertionError(f"{name} at {case}: rel err o {eo:.2e}, state {es:.2e} > {BOUND}")
            ok.append((name, kw))
        except Exception as exc:  # noqa: BLE001 - a failed variant is a finding; the others go on
            row["error"] = repr(exc)[:400]
            traceback.print_exc()
        row["check_s"] = round(time.time() - t0, 1)
        rows.append(row)
        log(name, row["checks"], row.get("error", ""))
        save("lab.json", rows)
    (RES / "lab.checked").touch()
    if DRY:
        return
    log("checked; waiting for fla's timing")
    log("fla timed:", wait_for("fla.timed", 66.0))

    from labkit.lab.timing import measure

    by_name = {r["variant"]: r for r in rows}
    for case in CASES:
        x = data[case]
        for name, kw in ok:
            row = by_name[name]
            try:
                kwc = options(kw, *case)
                ms = measure(lambda: chunk_delta_rule(**x, **kwc), device="cuda", graph=True, repeats=REPS).ms
                row.setdefault("ms", {})[f"{case}"] = ms
            except Exception as exc:  # noqa: BLE001
                row.setdefault("time_errors", {})[f"{case}"] = repr(exc)[:300]
            save("lab.json", rows)
        line = "  ".join(f"{n}={by_name[n].get('ms', {}).get(str(case), float('nan')):.3f}" for n, _ in ok)
        log(f"{case} ms:", line)
    # (rope() ran in the first run; its forms are settled)
    # per-kernel split of a call at 16k tokens, for the forms that matter
    prof = {}
    for name, kw in ok:
        if name in PROFILED and time.time() - T_START < 84:
            try:
                prof[name] = kernel_times(lambda: chunk_delta_rule(**data[CASES[1]], **options(kw, *CASES[1])))
                log("profile", name, prof[name])
            except Exception as exc:  # noqa: BLE001
                prof[name] = repr(exc)[:300]
    save("lab_profile.json", prof)


# -- q/k RMSNorm + RoPE ------------------------------------------------------------------------------
def rope() -> None:
    """Qwen3.5-0.8B's attention shapes at 4,096 tokens: q 8 heads, k 2 heads, head_dim 256, 64 of
    them rotated; each form checked against norm_rope_ref and the other, then timed (graph)."""
    from labkit.bench.ops import rel_err
    from labkit.ops import prefill_fusions as pf
    from labkit.ops.mixers import norm_rope_ref
    from labkit.lab.timing import measure

    rows = []
    T, D, rotary = (64, 256, 64) if DRY else (4096, 256, 64)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    inv = 1.0 / (10_000_000.0 ** (torch.arange(0, rotary, 2, device=DEVICE, dtype=torch.float32) / rotary))
    w = (0.1 * torch.randn(D, device=DEVICE, generator=gen)).bfloat16()
    pos = torch.arange(T, device=DEVICE)[None]
    for heads in (8, 2):
        proj = torch.randn(1, T, heads * D * 2, device=DEVICE, generator=gen).bfloat16()  # q and gate, interleaved
        x = proj[..., : heads * D].reshape(1, T, heads, D)
        want = norm_rope_ref(x, w, pos, inv, 1e-6, True)
        base = pf.norm_rope_rows(x, w, pos, inv, 1e-6, True, rotated_only=False)
        for rotated_only in (False, True):
            for warps in (4, 8):
                row = dict(heads=heads, tokens=T, head_dim=D, rotary=rotary, rotated_only=rotated_only, warps=warps)
                try:
                    got = pf.norm_rope_rows(x, w, pos, inv, 1e-6, True, rotated_only=rotated_only, num_warps=warps)
                    row["rel_err_vs_ref"] = rel_err(got, want)
                    row["equal_to_all_angles_8w"] = bool(torch.equal(got, base))
                    if row["rel_err_vs_ref"] > 1e-2:
                        raise AssertionError(f"rel err {row['rel_err_vs_ref']:.2e}")
                    if not DRY:
                        row["us"] = 1e3 * measure(lambda: pf.norm_rope_rows(x, w, pos, inv, 1e-6, True,
                                                                            rotated_only=rotated_only, num_warps=warps),
                                                  device="cuda", graph=True, repeats=20).ms
                        row["GB_per_s"] = 2 * x.numel() * 2 / (row["us"] * 1e-6) / 1e9
                except Exception as exc:  # noqa: BLE001
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                log("rope", row)
                save("rope.json", rows)


# -- fla -----------------------------------------------------------------------------------------------
def fla() -> None:
    rows = []
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_call
        import fla as fla_pkg

        rows.append(dict(fla_version=getattr(fla_pkg, "__version__", "?")))
    except Exception as exc:  # noqa: BLE001
        rows.append(dict(error=f"no fla: {exc!r}"[:300]))
        save("fla.json", rows)
        (RES / "fla.timed").touch()
        return
    from labkit.lab.timing import measure

    data = {case: inputs(*case) for case in CASES}

    def call(x):
        return fla_call(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                        output_final_state=True, cu_seqlens=x["cu_seqlens"])

    for case in CASES:  # autotune and compile while lab checks its variants
        try:
            call(data[case])
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(case=str(case), error=repr(exc)[:300]))
    torch.cuda.synchronize()
    log("fla warm")
    log("lab checked:", wait_for("lab.checked", 64.0))
    for case in CASES:
        row = dict(case=str(case))
        try:
            row["ms"] = measure(lambda: call(data[case]), device="cuda", graph=True, repeats=REPS).ms
        except Exception as exc:  # noqa: BLE001
            row["error"] = repr(exc)[:300]
        rows.append(row)
        log("fla", row)
        save("fla.json", rows)
    try:
        rows.append(dict(profile_16k=kernel_times(lambda: call(data[CASES[1]]))))
    except Exception as exc:  # noqa: BLE001
        rows.append(dict(profile_error=repr(exc)[:300]))
    save("fla.json", rows)
    (RES / "fla.timed").touch()


# -- compile-only ----------------------------------------------------------------------------------------
def precompile() -> None:
    """Every lab launch at its real shapes, through the compile-only driver (nothing runs)."""
    from labkit.ops import chunk_delta_rule as cdr
    from labkit.ops import prefill_fusions as pf

    cdr.check_devices = lambda **tensors: torch.device("cpu")
    pf.check_devices = lambda **tensors: torch.device("cpu")
    lengths_of = {}
    cdr._host_lengths = lambda cu, tokens: lengths_of[tokens]
    for sequences, length in CASES:
        total = sequences * length
        lengths_of[total] = [length] * sequences
        bf = torch.bfloat16
        x = dict(q=torch.empty(1, total, HEADS, DIM, dtype=bf), k=torch.empty(1, total, HEADS, DIM, dtype=bf),
                 v=torch.empty(1, total, HEADS, DIM, dtype=bf), g=torch.empty(1, total, HEADS),
                 beta=torch.empty(1, total, HEADS, dtype=bf), initial_state=torch.empty(sequences, HEADS, DIM, DIM),
                 cu_seqlens=torch.zeros(sequences + 1, dtype=torch.int64) if sequences > 1 else None)
        for name, kw in VARIANTS:
            t0 = time.time()
            try:
                cdr.chunk_delta_rule(**x, **options(kw, sequences, length))
                log("compiled", name, (sequences, length), f"{time.time() - t0:.1f}s")
            except Exception as exc:  # noqa: BLE001
                log("FAILED", name, repr(exc)[:300])
    for heads in (8, 2):
        x = torch.empty(1, 4096, heads * 512, dtype=torch.bfloat16)[..., : heads * 256].reshape(1, 4096, heads, 256)
        for rotated_only in (False, True):
            for warps in (4, 8):
                pf.norm_rope_rows(x, torch.empty(256, dtype=torch.bfloat16), torch.zeros(1, 4096, dtype=torch.int64),
                                  torch.empty(32), 1e-6, True, rotated_only=rotated_only, num_warps=warps)
    print(f"\n{'kernel':20s} {'warps':>5s} {'stages':>6s} {'regs':>5s} {'stack':>6s} {'smem':>7s}  constexprs")
    for name, kernel in sorted(cc.COMPILED.values(), key=lambda nk: nk[0]):
        usage = cc.resource_usage(kernel.asm["cubin"])
        names = kernel.src.fn.arg_names
        shown = ", ".join(f"{names[i[0]]}={v}" for i, v in kernel.src.constants.items()
                          if names[i[0]].isupper() and not names[i[0]].startswith(("D", "H", "SUB", "OUT", "EMU")))
        print(f"{name:20s} {kernel.metadata.num_warps:5d} {kernel.metadata.num_stages:6d} {usage['regs']:5d} "
              f"{usage['stack']:6d} {kernel.metadata.shared:7d}  {shown}")


if __name__ == "__main__":
    RES.mkdir(parents=True, exist_ok=True)
    {"lab": lab, "fla": fla, "precompile": precompile, "rope": rope}[ROLE]()
    log("done")
