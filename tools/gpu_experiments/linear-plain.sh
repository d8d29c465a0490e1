# Expected run time: about 98 s (warm 24, chain LFM2 25, chain Qwen 29, decode 18); each step under its own
# `timeout -k 3` (the driver exits by os._exit). Round B of branch linear-plain (issue 14): labkit.ops.linear's
# batch-1 loop now requests weights first; is it as fast as the plain GEMV in the chained step (all
# projections + lm_head, one CUDA graph, weights only), against main's kernel in the same run; batch 16 vs
# cuBLAS; then decode tok/s (fused+graph+pdl) with it. Every variant is checked against its reference before
# it is timed (labkit.bench.chain.Chain.check); results in $RES (log.txt, chain.json, decode.json).
set +e
RES=${RES:-/tmp/linear-plain-res}
mkdir -p "$RES"
exec > >(tee "$RES/log.txt") 2>&1
D=tools/gpu_experiments/linear_plain.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
T0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }

stamp "warm: compile every variant in 12 processes (Triton's disk cache; not timed): 4 decode steps, 8 chain shards"
PIDS=""
for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
  timeout -k 3 24 python3 $D --warm $i/12 > "$RES/warm-$i.log" 2>&1 &
  PIDS="$PIDS $!"
done
wait $PIDS
tail -n 3 "$RES"/warm-*.log | grep -v '^$' | head -60

stamp "chain lfm2-350m: main / new kernel, placements, blockings, plain, cuBLAS (checked, then timed)"
MODELS=lfm2-350m timeout -k 3 25 python3 $D --stage chain --res "$RES/lfm2"
stamp "chain qwen3.5-0.8b"
MODELS=qwen3.5-0.8b timeout -k 3 29 python3 $D --stage chain --res "$RES/qwen"
stamp "decode fused+graph+pdl, new kernel: B=1 (the best chain variant, and main's defaults), B=16 (norm after / before the dot)"
timeout -k 3 18 python3 $D --stage decode --res "$RES"
stamp "done"
