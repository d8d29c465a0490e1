# Expected run time: about 60-90 s (article's two-level cache: quality on both shipped checkpoints, tok/s at real shapes, a GDN-only variant).
# Run from the worktree copy's root:  source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/article-cache.sh
set +e
mkdir -p "$RES"
exec > >(tee "$RES/article-cache.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
# 1. quality: trained checkpoints, held-out windows, teacher-forced + greedy, every threshold (float32)
/usr/bin/time -f "quality wall %e s" timeout 48 python3 -m labkit bench article-cache --presets \
    --name article-cache-quality --data-dir "$RES/bench"
# 2. speed: real shapes, random weights, batch 1, reference decode path with and without the cache
/usr/bin/time -f "speed wall %e s" timeout 25 python3 -m labkit bench article-cache --checkpoints \
    --name article-cache-speed --data-dir "$RES/bench"
# 3. variant: the article's cache on Qwen3.5's GDN layers only (attention exact), fewer windows
/usr/bin/time -f "gdn-only wall %e s" timeout 14 python3 -m labkit bench article-cache --presets \
    --checkpoints byte-qwen3.5-6m --kinds gdn --windows 8 --tokens 129 --greedy-steps 32 \
    --thresholds 0 0.1 0.3 1.0 3.0 --name article-cache-gdn-only --data-dir "$RES/bench"
ls -R "$RES/bench"
date -u
