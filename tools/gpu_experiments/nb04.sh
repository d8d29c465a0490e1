# Expected run time: about 98 s (latency bench <= 20 s, notebook 04 on the GPU <= 60 s, chain --timeline smoke <= 15 s,
# the GPU latency test <= 12 s, then the cuda-tma GEMV in the chain with whatever time is left, if labkit.cuda's build is cached there).
# Round B of branch nb04 (issue 14, item 5: notebook 04_tma_and_async). Every step under its own timeout;
# everything lands in $RES even when a step fails.
#  1. python -m labkit bench latency: pointer-chase latency per memory level, plain loads vs TMA descriptors
#     (checked against the Python walk first) -> $RES/bench/<gpu>/load-latency.json (committed as data)
#  2. notebook 04 through papermill on the GPU (MEASURE=auto: latency, 3 streaming rates, a PDL timeline here)
#  3. bench chain --timeline 3 (the new option) on the plain GEMV, LFM2 batch 1: the results files it writes
set +e
RES=${RES:-/tmp/nb04-res}
mkdir -p "$RES/bench" "$RES/nb"
exec > >(tee "$RES/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
T0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }

stamp "latency bench"
timeout -k 3 20 python3 -m labkit bench latency --name load-latency --data-dir "$RES/bench"
stamp "notebook 04 on the GPU"
timeout -k 3 60 python3 -m labkit notebooks --out "$RES/nb" --only 04
python3 - "$RES/nb/04_tma_and_async.ipynb" <<'PY'
import json, sys
try:
    nb = json.load(open(sys.argv[1]))
except Exception as e:
    print("no executed notebook:", e); sys.exit(0)
for i, c in enumerate(nb["cells"]):
    for o in c.get("outputs", []):
        if o["output_type"] == "error":
            print(f"cell {i}: {o['ename']}: {o['evalue'][:800]}")
        elif o["output_type"] == "stream":
            print(f"cell {i} {o['name']}: {''.join(o['text'])[-600:]}")
        elif "text/markdown" in o.get("data", {}) and i > 2:
            print(f"cell {i} md: {''.join(o['data']['text/markdown'])[:1500]}")
    d = c.get("metadata", {}).get("papermill", {}).get("duration")
    if d and d > 2:
        print(f"cell {i}: {d:.1f} s")
PY
stamp "chain --timeline smoke"
timeout -k 3 15 python3 -m labkit bench chain --models lfm2-350m --batch 1 --gemvs plain plain+pdl --no-groups \
    --timeline 3 --repeats 5 --name chain-smoke --data-dir "$RES/bench"
stamp "tests/gpu/test_gpu_latency.py"
timeout -k 2 12 python3 -m pytest -q -x tests/gpu/test_gpu_latency.py 2>&1 | tail -n 5
LEFT=$(( 96 - ($(date +%s) - T0) ))
stamp "cuda-tma GEMV in the chain ($LEFT s left)"
[ "$LEFT" -gt 5 ] && timeout -k 2 $LEFT python3 -m labkit bench chain --models lfm2-350m --batch 1 --gemvs cuda-tma+pdl \
    --no-groups --repeats 5 --name chain-cuda-tma --data-dir "$RES/bench"
stamp "done"
