# expected run time: about 85 s (bench cache TTFT ~25 s; workloads + bf16 snapshots ~35 s; prefix-cache tests on the GPU ~25 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/cache.sh
set +e
RES=${RES:-/tmp/cache-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
# 1. TTFT, Qwen3.5-0.8B batch 1: shared 4096-token prefix + 64-token suffix, block 256; and a
#    512-token prompt below one 544-token block (vLLM's Qwen3.5-0.8B block) and with 64-token blocks
timeout 28 python3 -m labkit bench cache --experiments ttft --repeats 5 --name prefix-cache-ttft \
    --data-dir "$RES/bench" > "$RES/ttft.log" 2>&1; echo "rc=$?" >> "$RES/ttft.log"
# 2. workloads (LRU vs flops at 8 and 16 snapshots, block 256) and bf16 snapshots over 1,000 decode steps
timeout 25 python3 -m labkit bench cache --experiments workload precision --backends fused+graph \
    --name prefix-cache-workloads --data-dir "$RES/bench" > "$RES/workloads.log" 2>&1; echo "rc=$?" >> "$RES/workloads.log"
# 2b. the same on the shipped checkpoints (trained: greedy tokens with few near-ties), block 64
timeout 12 python3 -m labkit bench cache --models byte-qwen3.5-6m byte-lfm2-6m --experiments workload precision \
    --backends fused+graph --block-size 64 --name prefix-cache-checkpoints --data-dir "$RES/bench" \
    > "$RES/checkpoints.log" 2>&1; echo "rc=$?" >> "$RES/checkpoints.log"
# 3. the prefix-cache tests on the GPU (reference, fused, fused+graph; tiny presets and the checkpoints)
timeout 22 python3 -m pytest -q -x tests/test_prefix_cache.py tests/test_prefix_cache_paths.py > "$RES/pytest.log" 2>&1
echo "rc=$?" >> "$RES/pytest.log"
tail -n 4 "$RES"/*.log
