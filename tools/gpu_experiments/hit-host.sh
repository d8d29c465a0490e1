# expected run time: about 60 s on one H200 (model build, one 4,160-token miss, ~50 timed hits per piece); ~40 s on a CPU
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 120 bash tools/gpu_experiments/hit-host.sh
# The host side of a prefix-cache hit (Qwen3.5-0.8B bf16 fused+graph on a GPU, tiny-qwen3.5 reference on a CPU):
# look-up, checks, restore plan, copies, tail prefill, each timed alone, and Python calls counted (cProfile).
set +e
RES=${RES:-/tmp/hit-host-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$RES/gpu.txt" 2>&1
echo "start $(date -u +%T)" > "$RES/times.txt"
timeout -k 5 110 python3 tools/gpu_experiments/hit_host.py "$RES" > "$RES/hit_host.log" 2>&1
echo "rc=$?" >> "$RES/hit_host.log"; echo "hit_host $(date -u +%T)" >> "$RES/times.txt"
cat "$RES/hit_host.log"
