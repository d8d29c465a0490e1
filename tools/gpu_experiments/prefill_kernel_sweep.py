"""Round A, prefill branch: the chunked delta-rule kernel's variants at real shapes (B=1, H=16,
K=V=128, bf16), each checked against fla's output and the step-by-step recurrence (T=1024),
then timed in a CUDA graph beside fla at T=4096 and 16384. Writes $RES/kernel_sweep.json as it
goes (a row per variant), so a timeout still leaves every finished row.

    python3 tools/gpu_experiments/prefill_kernel_sweep.py $RES/kernel_sweep.json [budget_s]
"""

import json
import sys
import time

import torch

from labkit.bench.gdn_prefill import _inputs
from labkit.bench.ops import rel_err
from labkit.ops.chunk_delta_rule import chunk_delta_rule
from labkit.ops.delta_rule import delta_rule_recurrent_ref
from labkit.timing import measure

OUT = sys.argv[1]
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 80.0
T0 = time.time()
rows = []


def save():
    with open(OUT, "w") as f:
        json.dump(rows, f, indent=1)


try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
except Exception as e:  # noqa: BLE001
    print("no fla:", e)
    fla = None

# variants: prepare form/warps x walk (defer, block_v, warps, split); the default first
VARIANTS = [
    dict(),
    dict(prepare="split", prepare_warps=8),
    dict(prepare="split", prepare_warps=4),
    dict(defer_outputs=True),
    dict(prepare="split", prepare_warps=8, defer_outputs=True),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=16),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=16, num_warps=4),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=32, num_warps=4),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=64),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, output_block_v=64),
    dict(prepare="split", prepare_warps=8, block_v=16),
    dict(prepare="split", prepare_warps=8, block_v=16, num_warps=4),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, split=0),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=16, split=0),
    dict(prepare="split", prepare_warps=8, split=0),
    dict(split=0),
]

# correctness at T = 1024 against the recurrence (float32 truth) and fla
x = _inputs(1, 1024, 16, 128)
truth_o, truth_s = delta_rule_recurrent_ref(x["q"].float(), x["k"].float(), x["v"].float(), x["g"],
                                            x["beta"].float(), x["initial_state"])
fla_o = fla_s = None
if fla is not None:
    fla_o, fla_s = fla(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True)
    rows.append(dict(kind="check", impl="fla", T=1024, o_vs_truth=rel_err(fla_o.float(), truth_o),
                     s_vs_truth=rel_err(fla_s, truth_s)))
for var in VARIANTS:
    try:
        o, s = chunk_delta_rule(**x, **var)
        torch.cuda.synchronize()
        row = dict(kind="check", impl="labkit", T=1024, variant=var, o_vs_truth=rel_err(o.float(), truth_o),
                   s_vs_truth=rel_err(s, truth_s), nan=bool(torch.isnan(o).any() or torch.isnan(s).any()))
        if fla_o is not None:
            row["o_vs_fla"] = rel_err(o.float(), fla_o.float())
    except Exception as e:  # noqa: BLE001
        row = dict(kind="check", impl="labkit", T=1024, variant=var, error=repr(e)[:300])
    rows.append(row)
    print(row, flush=True)
save()
del x, truth_o, truth_s

for T in (4096, 16384):
    x = _inputs(1, T, 16, 128)
    if fla is not None:
        try:
            ms = measure(lambda: fla(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                     output_final_state=True), device="cuda", graph=True, repeats=15).ms
            rows.append(dict(kind="time", impl="fla", T=T, ms=ms))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(kind="time", impl="fla", T=T, error=repr(e)[:300]))
        print(rows[-1], flush=True)
    for var in VARIANTS:
        if time.time() - T0 > BUDGET:
            print("budget spent; stopping the sweep", flush=True)
            break
        try:
            ms = measure(lambda: chunk_delta_rule(**x, **var), device="cuda", graph=True, repeats=15).ms
            row = dict(kind="time", impl="labkit", T=T, variant=var, ms=ms)
        except Exception as e:  # noqa: BLE001
            row = dict(kind="time", impl="labkit", T=T, variant=var, error=repr(e)[:300])
        rows.append(row)
        print(row, flush=True)
        save()
    del x
    torch.cuda.empty_cache()
save()
print(f"sweep done in {time.time() - T0:.0f} s")
