# expected run time: about 80 s (prefix-cache tests on the GPU ~25 s; bench cache TTFT ~25 s; workloads + bf16 snapshots ~30 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/cache.sh
set +e
RES=${RES:-/tmp/cache-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
# 1. TTFT: shared 4096-token prefix + 64-token suffix (and the < 1 block cases), fused and fused+graph
timeout 35 python3 -m labkit bench cache --experiments ttft --repeats 5 --name prefix-cache-ttft \
    --data-dir "$RES/bench" > "$RES/ttft.log" 2>&1; echo "rc=$?" >> "$RES/ttft.log"
# 2. workloads (LRU vs flops at 8 and 16 snapshots) and bf16 snapshots over 1,000 decode steps
timeout 30 python3 -m labkit bench cache --experiments workload precision --backends fused+graph \
    --name prefix-cache-workloads --data-dir "$RES/bench" > "$RES/workloads.log" 2>&1; echo "rc=$?" >> "$RES/workloads.log"
# 3. the prefix-cache tests on the GPU (reference, fused, fused+graph; both tiny presets and checkpoints)
timeout 25 python3 -m pytest -q -x tests/test_prefix_cache.py tests/test_prefix_cache_paths.py > "$RES/pytest.log" 2>&1; echo "rc=$?" >> "$RES/pytest.log"
tail -n 3 "$RES"/*.log
