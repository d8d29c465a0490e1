# expected run time: about 90 s on one H200 (attention ~12 s, TTFT bench ~30 s, hit breakdown ~30 s, GDN tail forms ~12 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 100 bash tools/gpu_experiments/hit-path.sh
# Issue #13: a prefix-cache hit (4096 cached + 64 new tokens, Qwen3.5-0.8B bf16, fused+graph) >= 10x faster than no cache.
set +e
RES=${RES:-/tmp/hit-path-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
echo "start $(date -u +%T)" > "$RES/times.txt"
# 1. the continuing attention form vs attend_ref at the real shape (checked, then timed per layer call)
timeout -k 5 16 python3 tools/gpu_experiments/hit_path_attention.py "$RES" > "$RES/attention.log" 2>&1
echo "rc=$?" >> "$RES/attention.log"; echo "attention $(date -u +%T)" >> "$RES/times.txt"
# 2. the TTFT bench (the final run's command, results under $RES/data instead of data/)
timeout -k 5 40 python3 -m labkit bench cache --experiments ttft --ttft-cases 4096:64:256 --backends fused+graph \
    --repeats 3 --name prefix-cache-ttft --data-dir "$RES/data" > "$RES/ttft.log" 2>&1
echo "rc=$?" >> "$RES/ttft.log"; echo "ttft $(date -u +%T)" >> "$RES/times.txt"
# 3. the hit's breakdown: whole, pieces, A/B with attend_ref, kernels per hit
timeout -k 5 30 python3 tools/gpu_experiments/hit_path_profile.py "$RES" > "$RES/profile.log" 2>&1
echo "rc=$?" >> "$RES/profile.log"; echo "profile $(date -u +%T)" >> "$RES/times.txt"
# 4. (last: cut first if time runs out) the GDN chunk kernel's forms on the 64-token tail, vs the reference
timeout -k 3 12 python3 tools/gpu_experiments/hit_path_gdn.py "$RES" > "$RES/gdn.log" 2>&1
echo "rc=$?" >> "$RES/gdn.log"; echo "gdn $(date -u +%T)" >> "$RES/times.txt"
# 5. (last, only if time is left) the multi-turn workload at the budgets proposed for the final run: its seconds
timeout -k 3 20 python3 -m labkit bench cache --models byte-qwen3.5-6m --dtype float32 --backends reference \
    --experiments workload --workloads multi-turn --block-size 64 --budgets 48 64 --policies lru flops flops+ends \
    --name prefix-cache-workloads --data-dir "$RES/data" > "$RES/workloads.log" 2>&1
echo "rc=$?" >> "$RES/workloads.log"; echo "workloads $(date -u +%T)" >> "$RES/times.txt"
tail -n 12 "$RES/attention.log"; tail -n 3 "$RES/ttft.log"; head -n 18 "$RES/profile.log"; cat "$RES/gdn.log"
