# Expected run time: about 60-85 s (article's two-level cache: quality on both shipped checkpoints, tok/s at real shapes).
# Run from the worktree copy's root:  source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/article-cache.sh
set +e
mkdir -p "$RES"
exec > >(tee "$RES/article-cache.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
# 1. quality: trained checkpoints, held-out windows, teacher-forced + greedy, every threshold (float32)
/usr/bin/time -f "quality wall %e s" timeout 45 python3 -m labkit bench article-cache --presets \
    --name article-cache-quality --data-dir "$RES/bench"
# 2. speed: real shapes, random weights, batch 1, reference decode path with and without the cache
/usr/bin/time -f "speed wall %e s" timeout 30 python3 -m labkit bench article-cache --checkpoints \
    --name article-cache-speed --data-dir "$RES/bench"
ls -R "$RES/bench"
date -u
