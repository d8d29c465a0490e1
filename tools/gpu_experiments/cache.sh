# expected run time: about 95 s on one H200 (TTFT bench ~25 s, workloads bench ~10 s, notebook 03 ~50-60 s): the final run's commands
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 110 bash tools/gpu_experiments/cache.sh
# (round A, 2026-12-01 03:11, reached only the first two TTFT rows: fused eager 4096+64: 51.3 -> 42.6 ms, 1.2x)
set +e
RES=${RES:-/tmp/cache-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
# 1. TTFT, Qwen3.5-0.8B bf16 batch 1: shared 4096-token prefix + 64-token suffix, block 256, fused+graph
timeout -k 5 28 python3 -m labkit bench cache --experiments ttft --ttft-cases 4096:64:256 --backends fused+graph \
    --repeats 3 --name prefix-cache-ttft > "$RES/ttft.log" 2>&1; echo "rc=$?" >> "$RES/ttft.log"
# 2. multi-turn workload on the trained GDN checkpoint in float32 (exactness: 0 mismatches), block 64,
#    LRU vs FLOPs-per-byte (and Marconi-style admission) at 8 and 16 snapshots
timeout -k 5 12 python3 -m labkit bench cache --models byte-qwen3.5-6m --dtype float32 --backends reference \
    --experiments workload --workloads multi-turn --block-size 64 --budgets 8 16 --policies lru flops flops+ends \
    --name prefix-cache-workloads > "$RES/workloads.log" 2>&1; echo "rc=$?" >> "$RES/workloads.log"
cp data/bench/*/prefix-cache-*.json "$RES/" 2>/dev/null
# 3. notebook 03 on the GPU
timeout -k 5 60 python3 -m labkit notebooks --out "$RES/nb" --only 03 --log-output > "$RES/nb.log" 2>&1
echo "rc=$?" >> "$RES/nb.log"
tail -n 4 "$RES"/*.log
