# expected run time ~178 s: fused prefill of Qwen3.5-0.8B (80 s) and LFM2-350M (45 s) at 4096 tokens, eager vs graph, then the GDN kernel sweep (50 s)
# Round A of the prefill branch. Every step has its own timeout and writes under $RES even when it fails.
set +e
RES=${RES:-/tmp/prefill-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$RES/gpu.txt" 2>&1
# (c) whole-model prefill, eager (with / without the element-wise fusions) and fused+graph, profiler kernel sums
timeout 80 python3 tools/gpu_experiments/prefill_model.py "$RES/model_prefill.json" qwen3.5-0.8b 4096 > "$RES/model_qwen.log" 2>&1
echo "qwen rc=$?" >> "$RES/steps.txt"
timeout 45 python3 tools/gpu_experiments/prefill_model.py "$RES/model_prefill.json" lfm2-350m 4096 > "$RES/model_lfm2.log" 2>&1
echo "lfm2 rc=$?" >> "$RES/steps.txt"
# (a) + (b) kernel variants: checks against the recurrence and fla at T=1024, timings at 4096 and 16384 vs fla
PYTHONPATH="/tmp/fla:$PYTHONPATH" timeout 50 python3 tools/gpu_experiments/prefill_kernel_sweep.py "$RES/kernel_sweep.json" 40 > "$RES/kernel_sweep.log" 2>&1
echo "sweep rc=$?" >> "$RES/steps.txt"
tail -n 5 "$RES"/*.log
exit 0
