# expected run time: about 100 s (limit 110 s): notebook 02 end to end on the H200 with SAVE_RESULTS=True.
# Writes $RES/02_fusion.ipynb (executed, injected-parameters cell already dropped) and copies of the
# results files it writes: data/bench/nvidia-h200/{fused-ladder,fused-ops,fusion-evidence}.json.
set +e
RES=${RES:-/tmp/nb02-final}
mkdir -p "$RES"
export PYTHONPATH="$PYTHONPATH:/tmp/fla"
START=$(date +%s)
timeout -k 5 110 python3 -m labkit notebooks --only 02 --out "$RES" -p SAVE_RESULTS=True > "$RES/notebook.log" 2>&1
echo "notebook rc=$? after $(( $(date +%s) - START )) s" >> "$RES/notebook.log"
cat "$RES/notebook.log"
for f in fused-ladder fused-ops fusion-evidence; do cp "data/bench/nvidia-h200/$f.json" "$RES/" 2>/dev/null; done
ls -la "$RES"
