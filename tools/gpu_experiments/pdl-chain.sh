# Expected run time: about 180 s (warm 41, placements 42, timeline 12, best 8, tune 33, final chain 18, decode 25); every
# step under its own `timeout -k 5` (a process that ignores SIGTERM is killed 5 s later); the driver exits by os._exit.
# Round A of branch pdl-chain (issue 14, item 4): PDL placements and per-key blockings inside the chained
# step (all projections + lm_head, one CUDA graph, weights only), batch 1 and 16, both presets; then
# decode fused+graph vs fused+graph+pdl with the winners. Every variant is checked against its
# reference at the real shapes before it is timed (labkit.bench.chain.Chain.check).
set +e
RES=${RES:-/tmp/pdl-chain-res}
mkdir -p "$RES"
exec > >(tee "$RES/log.txt") 2>&1
D=tools/gpu_experiments/pdl_chain.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
T0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }

stamp "warm: compile every variant in 4 processes (Triton's disk cache)"
PIDS=""
for i in 0 1 2 3; do
  timeout -k 5 41 python3 $D --warm $i/4 > "$RES/warm-$i.log" 2>&1 &
  PIDS="$PIDS $!"
done
wait $PIDS  # these only: a bare wait would also wait for the tee above, which never ends
tail -n 2 "$RES"/warm-*.log | grep -v '^$' | head -40

stamp "placements: every GEMV / PDL placement over the whole chain (checked, then timed)"
timeout -k 5 42 python3 $D --stage placements --res "$RES"
stamp "timeline: global-timer stamps per program, plain GEMV chain of LFM2 layers 0-2, PDL off/on"
timeout -k 5 12 python3 $D --stage timeline --res "$RES"
BEST=$(timeout -k 5 8 python3 $D --stage best --res "$RES" | tail -n 1)
case "$BEST" in preload+*|no-preload+*) ;; *) BEST=preload+early ;; esac  # a failed step prints no placement
echo "best batch-1 placement: $BEST"

stamp "tune: per-key blockings inside the chain, PDL with $BEST"
timeout -k 5 33 python3 $D --stage tune --res "$RES" --placement "$BEST" --time-limit-s 24
cp "$RES/tuning/nvidia-h200.json" data/tuning/nvidia-h200.json && echo "tuned table installed for the next steps"

stamp "final chain with the tuned table"
timeout -k 5 18 python3 $D --stage final --res "$RES" --placement "$BEST" --tag tuned

stamp "decode: fused+graph vs fused+graph+pdl ($BEST, and the old preload+end), tuned table"
timeout -k 5 25 python3 $D --stage decode --res "$RES" --placement "preload+end,$BEST" --batches 1 16
stamp "done"
