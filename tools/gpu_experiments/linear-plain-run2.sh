# (Second run, 06:07 UTC; kept for the record.) Expected run time: about 85 s (warm 24, chain LFM2 25, chain Qwen 29, decode 18; the first run of 05:38 took 72 s);
# each step under its own `timeout -k 3` (the driver exits by os._exit). Round B of branch linear-plain (issue 14),
# second run: this branch's defaults (weights-first batch-1 loop, PDL preload+early, the batch-1 table measured in
# the first run) against main's kernel, placement and table in the chained step (all projections + lm_head, one
# CUDA graph, weights only), batch 1 and 16, both presets; at batch 16 per key against linear_unfused (one-kernel
# norm + cuBLAS + one-kernel epilogue) and the step with the keys where that won dispatched; decode tok/s with
# the defaults and with that dispatch. Every variant is checked against its reference before it is timed
# (labkit.bench.chain.Chain.check); results in $RES (log.txt, lfm2/chain.json, qwen/chain.json, decode.json).
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

stamp "chain lfm2-350m: this branch vs main, plain, cuBLAS, linear_unfused per key, dispatch (checked, then timed)"
MODELS=lfm2-350m timeout -k 3 25 python3 $D --stage chain --res "$RES/lfm2"
stamp "chain qwen3.5-0.8b"
MODELS=qwen3.5-0.8b timeout -k 3 29 python3 $D --stage chain --res "$RES/qwen"
stamp "decode: this branch's defaults, B=1 and 16 (fused+graph+pdl), B=16 with the measured dispatch, B=1 without PDL"
timeout -k 3 18 python3 $D --stage decode --res "$RES"
stamp "done"
