# Expected run time: about 115 s (4 diagnoses at ~20 s each, capped at 88 s; then a 25 s torch.compile probe).
# Notebook 01 round A: the reference decode step's measured time split, the trivial-work twin, the
# reference replayed from a CUDA graph (vs eager, parity), the profiler's overhead. Writes $RES/.
set +e
RES=${RES:-/tmp/nb01-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv > "$RES/nvidia-smi.txt" 2>&1
uptime > "$RES/uptime.txt" 2>&1
nproc >> "$RES/uptime.txt" 2>&1
timeout 88 python3 tools/gpu_experiments/nb01_diag.py 2>&1 | tee "$RES/diag.log"
# torch.compile(mode="reduce-overhead") of the reference step: does it capture a graph? (probe only)
timeout 25 python3 tools/gpu_experiments/nb01_compile.py 2>&1 | tail -40 > "$RES/compile.log"
uptime >> "$RES/uptime.txt" 2>&1
