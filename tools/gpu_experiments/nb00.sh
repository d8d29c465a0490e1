# nb00 (notebook 00): expected ~30 s on one H200 (budget 45 s): builds the two presets with random weights, measures copy
# bandwidth, a copy sweep and the three mixers' one-layer steps (batch 1/16/64), writes data/bench/nvidia-h200/hw.json.
set +e
RES="${RES:?set RES}"
mkdir -p "$RES"
t0=$(date +%s)
timeout -k 5 60 python3 -m labkit notebooks --only 00 --out "$RES/nb" -p SAVE_RESULTS=True > "$RES/notebook.log" 2>&1
echo "notebook rc=$? seconds=$(( $(date +%s) - t0 ))" | tee "$RES/summary.txt"
cp data/bench/nvidia-h200/hw.json "$RES/" 2>/dev/null && echo "hw.json written" | tee -a "$RES/summary.txt"
tail -n 5 "$RES/notebook.log"
