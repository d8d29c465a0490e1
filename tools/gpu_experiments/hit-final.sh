# Issue #13's final H200 run, one call of at most ~580 s: the prefix-cache hit's kernels checked, the
# TTFT bench (bf16, and float32 where greedy tokens carry no bf16 near-ties), notebook 03 executed on
# those results, then the diagnostics of where a hit's time goes. Each stage gets what is left of the
# call's time, so a slow stage cannot cost the notebook; logs and results go to $RES.
#   source tools/gpu_env.sh; RES=$OUT/final bash tools/gpu_experiments/hit-final.sh
set +e
RES=${RES:-/tmp/hit-final}
mkdir -p "$RES"
END=$(( $(date +%s) + ${LIMIT_S:-575} ))
left() { local l=$(( END - $(date +%s) - ${1:-0} )); [ $l -gt 5 ] && echo $l || echo 5; }
stage() {  # stage NAME MAX_S RESERVE_S command...: at most MAX_S, leaving RESERVE_S for what follows
  local name=$1 max=$2 reserve=$3; shift 3
  local t=$(left $reserve); [ $t -gt $max ] && t=$max
  local s=$(date +%s)
  timeout -k 5 $t "$@" > "$RES/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s (limit $t)" | tee -a "$RES/stages.txt"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$RES/gpu.txt" 2>&1
git log -1 --format=%h > "$RES/commit.txt" 2>/dev/null
stage gdn 100 400 env RES="$RES/gdn" bash tools/gpu_experiments/gdn-tail.sh
stage ttft 70 330 python3 -m labkit bench cache --experiments ttft --ttft-cases 4096:64:256 --backends fused+graph \
    --repeats 3 --name prefix-cache-ttft
# (2026-12-02: ran past its 70 s and wrote nothing; give it more when time allows)
stage ttft-fp32 70 260 python3 -m labkit bench cache --experiments ttft --ttft-cases 4096:64:256 --backends fused+graph \
    --repeats 3 --dtype float32 --name prefix-cache-ttft-fp32
stage nb03 240 60 python3 -m labkit notebooks --only 03 --out "$RES/nb" -p SAVE_RESULTS=True
stage timeline 40 20 python3 tools/gpu_experiments/hit_timeline.py "$RES"
stage hit-host 70 0 env RES="$RES/host" bash tools/gpu_experiments/hit-host.sh
cp data/bench/nvidia-h200/prefix-cache-*.json "$RES/" 2>/dev/null
# $RES/hit_timeline.json and $RES/host/hit_host.json are committed as data/bench/nvidia-h200/hit-timeline.json, hit-host.json
cat "$RES/stages.txt"; tail -n 3 "$RES"/ttft*.log; head -n 12 "$RES/timeline.log"
