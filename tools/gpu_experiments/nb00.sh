# nb00 (notebook 00): expected ~60 s on one H200 (two models built, a copy sweep, three mixer kernels checked and timed at batch 1/16/64, fused+graph decode at batch 1/16).
# 1) notebook 00 on the GPU with SAVE_RESULTS=True: it measures and writes data/bench/nvidia-h200/hw.json
# 2) only if that failed: python -m labkit.bench.hardware --save (the same rows, without the notebook)
set +e
RES="${RES:?set RES}"
mkdir -p "$RES"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$RES/gpu.txt" 2>&1
rm -f data/bench/nvidia-h200/hw.json
t0=$(date +%s)
timeout 240 python3 -m labkit notebooks --only 00 --out "$RES/nb" -p SAVE_RESULTS=True > "$RES/notebook.log" 2>&1
echo "notebook rc=$? seconds=$(( $(date +%s) - t0 ))" | tee -a "$RES/summary.txt"
if [ ! -f data/bench/nvidia-h200/hw.json ]; then
  t0=$(date +%s)
  timeout 150 python3 -m labkit.bench.hardware --save > "$RES/hardware.log" 2>&1
  echo "hardware module rc=$? seconds=$(( $(date +%s) - t0 ))" | tee -a "$RES/summary.txt"
fi
cp data/bench/nvidia-h200/hw.json "$RES/" 2>/dev/null && echo "hw.json copied" | tee -a "$RES/summary.txt"
tail -n 5 "$RES/notebook.log"
# the notebook's text outputs, to read without Jupyter
python3 - "$RES/nb/00_model_and_roofline.ipynb" > "$RES/notebook_text.txt" 2>&1 <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
for i, c in enumerate(nb["cells"]):
    for o in c.get("outputs", []):
        if o.get("output_type") == "stream":
            print(f"[{i}] {o['name']}: " + "".join(o["text"]))
        elif o.get("output_type") == "error":
            print(f"[{i}] ERROR {o['ename']}: {o['evalue']}")
        elif "text/markdown" in o.get("data", {}):
            print(f"[{i}] md: " + "".join(o["data"]["text/markdown"]))
PY
cat "$RES/summary.txt"
