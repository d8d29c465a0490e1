# expected run time: about 80 s on one H200 (attention check + timing ~12 s, TTFT bench ~30 s, hit breakdown ~30 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 100 bash tools/gpu_experiments/hit-path.sh
# Issue #13: a prefix-cache hit (4096 cached + 64 new tokens, Qwen3.5-0.8B bf16, fused+graph) >= 10x faster than no cache.
set +e
RES=${RES:-/tmp/hit-path-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
echo "start $(date -u +%T)" > "$RES/times.txt"
# 1. the continuing attention form vs attend_ref at the real shape (checked, then timed per layer call)
timeout -k 5 20 python3 tools/gpu_experiments/hit_path_attention.py "$RES" > "$RES/attention.log" 2>&1
echo "rc=$?" >> "$RES/attention.log"; echo "attention $(date -u +%T)" >> "$RES/times.txt"
# 2. the TTFT bench (the final run's command, results under $RES/data instead of data/)
timeout -k 5 40 python3 -m labkit bench cache --experiments ttft --ttft-cases 4096:64:256 --backends fused+graph \
    --repeats 3 --name prefix-cache-ttft --data-dir "$RES/data" > "$RES/ttft.log" 2>&1
echo "rc=$?" >> "$RES/ttft.log"; echo "ttft $(date -u +%T)" >> "$RES/times.txt"
# 3. the hit's breakdown: whole, pieces, A/B with attend_ref, kernels per hit
timeout -k 5 32 python3 tools/gpu_experiments/hit_path_profile.py "$RES" > "$RES/profile.log" 2>&1
echo "rc=$?" >> "$RES/profile.log"; echo "profile $(date -u +%T)" >> "$RES/times.txt"
tail -n 12 "$RES/attention.log"; tail -n 3 "$RES/ttft.log"; head -n 16 "$RES/profile.log"
