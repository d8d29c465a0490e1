# Expected run time: about 70 s (the final command: article's two-level cache, quality on both shipped checkpoints
# on held-out and one-byte-repeated text, tok/s at real shapes with random weights). Round A (03:12) timed out per step: the
# reference decode path is ~16 ms a step on the H200, so this run decodes more windows (64) for fewer steps (48 + 24).
# Run from the worktree copy's root:  source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/article-cache.sh
set +e
mkdir -p "$RES"
exec > >(tee "$RES/article-cache.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
/usr/bin/time -f "article-cache wall %e s" timeout 86 python3 -m labkit bench article-cache --data-dir "$RES/bench"
ls -R "$RES/bench"
date -u
