# expected run time: at most 118 s (evidence up to 112 s incl. model builds and Triton compiles; ncu only in what is left). Notebook 02's evidence at the real shapes.
# Writes $RES/fusion-evidence.json (block_v registers/spills, fit points, PDL timelines and chains,
# host costs, norm prologue, batch-16 configs), logs, a readable summary, and ncu's view of the GDN
# kernel at block_v 16 and 128 (batch 1).
set +e
RES=${RES:-/tmp/nb02-res}
mkdir -p "$RES"
export PYTHONPATH="$PYTHONPATH:/tmp/fla"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$RES/gpu.txt" 2>&1
# every part in one process (models built once); the file is rewritten as each part finishes
START=$(date +%s)
timeout 112 python3 -m labkit.bench.fusion_evidence --out "$RES/fusion-evidence.json" > "$RES/evidence.log" 2>&1
echo "evidence rc=$?" >> "$RES/evidence.log"
tail -20 "$RES/evidence.log"
python3 - "$RES/fusion-evidence.json" > "$RES/summary.txt" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in d.items():
    if k in ("device", "versions"):
        continue
    if isinstance(v, list):
        print(f"== {k}: {len(v)} rows")
        for r in v:
            print("  ", {a: (round(b, 3) if isinstance(b, float) else b) for a, b in r.items()})
    elif isinstance(v, dict):
        print(f"== {k}")
        for a, b in v.items():
            if isinstance(b, dict):
                b = {x: (y if not isinstance(y, dict) else {p: (q if p != "spans" else f"{len(q)} spans") for p, q in y.items()})
                     for x, y in b.items()}
            print("  ", a, json.dumps(b, default=str)[:2500])
    else:
        print(k, v)
PY
head -200 "$RES/summary.txt"
cat > /tmp/nb02_gdn_ncu.py <<'PY'
import torch, labkit
from labkit.bench import ops as opbench
from labkit.ops.gated_delta_decode import gdn_decode
m = labkit.build("qwen3.5-0.8b", dtype=torch.bfloat16, device="cuda", seed=0)
dims, proj, conv_state, state, w = opbench._gdn_operands(m, 1)
for bv in (16, 128, 16, 128):
    gdn_decode(proj, conv_state, *w, state, dims, m.cfg.norm_eps, block_v=bv)
torch.cuda.synchronize()
PY
LEFT=$(( 118 - ($(date +%s) - START) ))
echo "seconds left for ncu: $LEFT"
[ "$LEFT" -ge 12 ] && timeout "$LEFT" ncu --clock-control none -k regex:_gdn_decode_kernel --launch-skip 2 --launch-count 2 \
    --section LaunchStats --section Occupancy --section SpeedOfLight python3 /tmp/nb02_gdn_ncu.py > "$RES/ncu-gdn-block-v.txt" 2>&1
echo "ncu rc=$?" >> "$RES/ncu-gdn-block-v.txt"
grep -E "Block Size|Grid Size|Registers|Theoretical Occupancy|Achieved Occupancy|Duration|Memory Throughput|Block Limit Reg|Waves" "$RES/ncu-gdn-block-v.txt" | head -40
