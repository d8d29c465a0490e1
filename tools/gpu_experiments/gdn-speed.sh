# expected run time ~80 s (hard cap 97 s): GDN prefill walk/output/merged-prepare options checked then timed beside fla (T=4k, 16k)
# Round B of gdn-speed (issue #12). lab and fla run side by side and take turns on the GPU through flag
# files in $RES (fla autotunes while lab compiles and checks; then fla times; then lab times): see
# tools/gpu_experiments/gdn_speed.py. Every step writes under $RES even when it fails.
set +e
RES=${RES:-/tmp/gdn-speed-res}
mkdir -p "$RES"
rm -f "$RES/lab.checked" "$RES/fla.timed"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$RES/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$RES/gpu.txt" 2>&1
# Triton cache compiled for sm_90 on the CPU machine (python3 tools/gpu_experiments/gdn_speed.py precompile):
# a hit skips labkit's compiles; a miss (another Triton build) only costs the compile.
if [ -d tools/gpu_experiments/gdn-speed-cache ]; then
  rm -rf /tmp/gdn-speed-cache && cp -r tools/gpu_experiments/gdn-speed-cache /tmp/gdn-speed-cache
  # its group files name the cubins by the absolute paths they were written at
  sed -i "s#/work/wt/gdn-speed/tools/gpu_experiments/gdn-speed-cache#/tmp/gdn-speed-cache#g" /tmp/gdn-speed-cache/*/__grp__*.json
  export TRITON_CACHE_DIR=/tmp/gdn-speed-cache
fi
PYTHONPATH="$PYTHONPATH:/tmp/fla" timeout -k 2 80 python3 tools/gpu_experiments/gdn_speed.py fla "$RES" > "$RES/fla.log" 2>&1 &
FLA=$!
timeout -k 2 92 python3 tools/gpu_experiments/gdn_speed.py lab "$RES" > "$RES/lab.log" 2>&1
echo "lab rc=$?" >> "$RES/steps.txt"
wait $FLA
echo "fla rc=$?" >> "$RES/steps.txt"
ls "$TRITON_CACHE_DIR" 2>/dev/null | wc -l > "$RES/cache_entries.txt"
tail -n 30 "$RES/lab.log" "$RES/fla.log"
exit 0
