# Expected run time: about 70-90 s (article's two-level cache: quality on both shipped checkpoints, tok/s at real shapes, variants).
# Run from the worktree copy's root:  source tools/gpu_env.sh; RES=<dir> timeout 90 bash tools/gpu_experiments/article-cache.sh
# Each step has its own timeout and its own results file, so a slow step costs only itself.
set +e
mkdir -p "$RES"
exec > >(tee "$RES/article-cache.log") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
# 1. quality: trained checkpoints, 16 held-out windows, teacher-forced + greedy, every threshold (float32)
/usr/bin/time -f "quality wall %e s" timeout 38 python3 -m labkit bench article-cache --presets \
    --name article-cache-quality --data-dir "$RES/bench"
# 2. speed: real shapes, random weights, batch 1, reference decode path with and without the cache
/usr/bin/time -f "speed wall %e s" timeout 22 python3 -m labkit bench article-cache --checkpoints \
    --name article-cache-speed --data-dir "$RES/bench"
# 3. the article's best case, "stable context": each window's first 32 bytes repeated (fewer windows)
/usr/bin/time -f "repeated wall %e s" timeout 15 python3 -m labkit bench article-cache --presets --contexts repeated \
    --windows 8 --tokens 129 --greedy-steps 32 --name article-cache-repeated --data-dir "$RES/bench"
# 4. the article's cache on Qwen3.5's GDN layers only (attention exact)
/usr/bin/time -f "gdn-only wall %e s" timeout 11 python3 -m labkit bench article-cache --presets \
    --checkpoints byte-qwen3.5-6m --kinds gdn --windows 8 --tokens 129 --greedy-steps 32 \
    --thresholds 0 0.1 0.3 1.0 3.0 --name article-cache-gdn-only --data-dir "$RES/bench"
ls -R "$RES/bench"
date -u
