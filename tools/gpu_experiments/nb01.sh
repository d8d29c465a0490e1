# Expected run time: about 110 s (ncu metric names ~10 s, then 4 diagnoses at ~20 s each, capped at 90 s).
# Notebook 01 round A: the reference decode step's measured time split, the trivial-work twin, the
# reference replayed from a CUDA graph (vs eager, parity), the profiler's overhead. Writes $RES/.
set +e
RES=${RES:-/tmp/nb01-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,utilization.gpu,memory.used --format=csv > "$RES/nvidia-smi.txt" 2>&1
uptime > "$RES/uptime.txt" 2>&1
nproc >> "$RES/uptime.txt" 2>&1
# the article's Nsight Compute metric names: listed by ncu or not
timeout 10 ncu --query-metrics --chip gh100 > "$RES/ncu-query.txt" 2>&1
timeout 8 python3 tools/gpu_experiments/nb01_ncu.py 2>&1 | tee "$RES/ncu.log"
timeout 95 python3 tools/gpu_experiments/nb01_diag.py 2>&1 | tee "$RES/diag.log"
uptime >> "$RES/uptime.txt" 2>&1
