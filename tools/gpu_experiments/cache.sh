# expected run time: about 90 s (bench cache TTFT ~25 s; notebook 03 on the GPU ~40 s; prefix-cache tests ~25 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 95 bash tools/gpu_experiments/cache.sh
set +e
RES=${RES:-/tmp/cache-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
# 1. TTFT, Qwen3.5-0.8B batch 1: shared 4096-token prefix + 64-token suffix, block 256 (fused and fused+graph);
#    a 512-token prompt below one 544-token block (vLLM's Qwen3.5-0.8B block), and with 64-token blocks
timeout 25 python3 -m labkit bench cache --experiments ttft --repeats 5 --name prefix-cache-ttft \
    --data-dir "$RES/bench" > "$RES/ttft.log" 2>&1; echo "rc=$?" >> "$RES/ttft.log"
# 2. notebook 03 on the GPU (it measures the workloads, LRU vs flops at 8 and 16 snapshots, the TTFT
#    case and bf16 snapshots over 1,000 decode steps itself; its log prints every table)
timeout 40 python3 -m labkit notebooks --out "$RES/nb" --only 03 --log-output -p INTERACTIVE=False -p "MODELS=['qwen3.5-0.8b']" \
    > "$RES/nb.log" 2>&1; echo "rc=$?" >> "$RES/nb.log"
# 3. the prefix-cache tests on the GPU (reference, fused, fused+graph; tiny presets and the checkpoints)
timeout 25 python3 -m pytest -q -x tests/test_prefix_cache.py tests/test_prefix_cache_paths.py > "$RES/pytest.log" 2>&1
echo "rc=$?" >> "$RES/pytest.log"
tail -n 4 "$RES"/*.log
# the executed notebook's text (markdown, prints, errors), readable without Jupyter
python3 - "$RES/nb/03_adaptive_caching.ipynb" > "$RES/nb_text.txt" 2>&1 <<'PY'
import json, sys
for i, cell in enumerate(json.load(open(sys.argv[1]))["cells"]):
    for o in cell.get("outputs", []):
        kind = o.get("output_type")
        if kind == "stream":
            print(f"[{i}] {o['name']}: {''.join(o['text'])}")
        elif kind == "error":
            print(f"[{i}] ERROR {o['ename']}: {o['evalue']}")
        elif "text/markdown" in o.get("data", {}):
            print(f"[{i}] {''.join(o['data']['text/markdown'])}")
PY
