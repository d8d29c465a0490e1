# Expected run time: about 90 s (chain CLI 50, decode CLI 40 at most); each step under its own `timeout -k 3`.
# Round B of branch linear-plain, third run: the final run's own commands on this branch's defaults (the batch-1
# table and PDL preload+early; at batch 16 the tuning file's 'impl': 'torch' dispatch to linear_unfused, read from
# data/tuning/nvidia-h200.json as the product reads it): how long they take, and the figures they give. The first
# two runs (05:38, 06:07) used a driver with a copy of the old kernel as a same-run baseline, removed once measured
# (its figures are in the tuning notes and the merge message). Results under $RES
# (log.txt; data/nvidia-h200/chain.json and bench-decode.json, as the final run would write them to data/bench/).
set +e
RES=${RES:-/tmp/linear-plain-res}
mkdir -p "$RES/data"
exec > >(tee "$RES/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
T0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }

stamp "python3 -m labkit bench chain (checked, then timed; step = what the fused step runs, dispatch included)"
timeout -k 3 50 python3 -m labkit bench chain --batch 1 16 --gemvs linear+pdl step+pdl plain+pdl cublas --no-groups \
  --name chain --data-dir "$RES/data"
stamp "python3 -m labkit bench decode fused+graph+pdl, batch 1 and 16"
timeout -k 3 40 python3 -m labkit bench decode --impls fused+graph+pdl --batch 1 16 --repeats 3 --name bench-decode \
  --data-dir "$RES/data"
stamp "done"
