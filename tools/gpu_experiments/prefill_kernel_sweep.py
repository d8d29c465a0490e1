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
from labkit.lab.timing import measure

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

# variants, most informative first (the budget may stop the list): the default, then the split
# prepare (solve + products), deferred outputs, and walk shapes
VARIANTS = [
    dict(),
    dict(prepare="split", prepare_warps=8, defer_outputs=True),
    dict(prepare="split", prepare_warps=8),
    dict(defer_outputs=True),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=16),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=16, num_warps=4),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=64),
    dict(prepare="split", prepare_warps=4, defer_outputs=True),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, split=0),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, output_block_v=64),
    dict(prepare="split", prepare_warps=8, block_v=16),
    dict(prepare="split", prepare_warps=8, defer_outputs=True, block_v=32, num_warps=4),
    dict(split=0),
]
LENGTHS = (4096, 16384)

check = _inputs(1, 1024, 16, 128)
truth_o, truth_s = delta_rule_recurrent_ref(check["q"].float(), check["k"].float(), check["v"].float(), check["g"],
                                            check["beta"].float(), check["initial_state"])
timed = {T: _inputs(1, T, 16, 128) for T in LENGTHS}
fla_o = None
if fla is not None:
    for T in (1024, *LENGTHS):
        x = check if T == 1024 else timed[T]
        try:
            def call(x=x):
                return fla(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"], output_final_state=True)

            o, s_ = call()
            row = dict(impl="fla", T=T)
            if T == 1024:
                fla_o = o
                row.update(o_vs_truth=rel_err(o.float(), truth_o), s_vs_truth=rel_err(s_, truth_s))
            else:
                row["ms"] = measure(call, device="cuda", graph=True, repeats=15).ms
        except Exception as e:  # noqa: BLE001
            row = dict(impl="fla", T=T, error=repr(e)[:300])
        rows.append(row)
        print(row, flush=True)
    save()

for var in VARIANTS:
    if time.time() - T0 > BUDGET:
        print("budget spent; stopping the sweep", flush=True)
        break
    row = dict(impl="labkit", variant=var)
    try:
        o, s_ = chunk_delta_rule(**check, **var)
        row.update(o_vs_truth=rel_err(o.float(), truth_o), s_vs_truth=rel_err(s_, truth_s),
                   nan=bool(torch.isnan(o).any() or torch.isnan(s_).any()))
        if fla_o is not None:
            row["o_vs_fla"] = rel_err(o.float(), fla_o.float())
        for T in LENGTHS:
            row[f"ms_{T}"] = measure(lambda: chunk_delta_rule(**timed[T], **var), device="cuda", graph=True,
                                     repeats=15).ms
    except Exception as e:  # noqa: BLE001
        row["error"] = repr(e)[:300]
    rows.append(row)
    print(row, flush=True)
    save()
print(f"sweep done in {time.time() - T0:.0f} s")
