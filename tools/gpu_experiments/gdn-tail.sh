# expected run time: about 4 min on one H200 (single-chunk GPU tests 43 s, measured 2026-12-02; the tail timing ran past
# 40 s and 70 s in two runs, printing nothing: it compiles each variant first and prints its table at the end;
# the rest of the op's GPU tests over 25 s)
# Run from the worktree root: source tools/gpu_env.sh; RES=<dir> timeout 290 bash tools/gpu_experiments/gdn-tail.sh
# A prefix-cache hit's GDN tail (every sequence <= 64 tokens): chunk_delta_rule's single-chunk kernel (one launch)
# against the multi-kernel path, checked at the real shape (16 heads, K = V = 128, bf16) and timed in CUDA graphs
# at T = 1, T = 64 (batch 1) and 8 x 64 packed. The earlier build of this design: ~12 us against ~21 us per layer.
# Every step has its own timeout and writes under $RES even when it fails.
set +e
RES=${RES:-/tmp/gdn-tail-res}
mkdir -p "$RES"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$RES/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$RES/gpu.txt" 2>&1
echo "start $(date -u +%T)" > "$RES/times.txt"
# 1. the single-chunk kernel at the real shape vs the reference (auto and forced, packed, checkpoints, graph replay)
timeout -k 5 60 python3 -m pytest -q -m gpu tests/gpu/test_chunk_delta_rule_gpu.py -k single \
    -p no:cacheprovider > "$RES/tests_single.log" 2>&1
echo "rc=$?" >> "$RES/tests_single.log"; echo "tests_single $(date -u +%T)" >> "$RES/times.txt"
# 2. the timing: one kernel vs the multi-kernel path (and the single kernel's block_v / warps), no fla
timeout -k 5 150 python3 -m labkit.bench.gdn_prefill --lengths 1 64 --packed 8 64 --splits 0 --no-fla --reps 15 \
    --variants multi-kernel single-chunk single-chunk+bv64 single-chunk+w8 --name gdn-tail > "$RES/timing.log" 2>&1
cp data/bench/*/gdn-tail.json "$RES/" 2>/dev/null
echo "rc=$?" >> "$RES/timing.log"; echo "timing $(date -u +%T)" >> "$RES/times.txt"
# 3. (last: cut first if time runs out) the op's other GPU tests (the multi-kernel path, long prompts)
timeout -k 3 60 python3 -m pytest -q -m gpu tests/gpu/test_chunk_delta_rule_gpu.py -k "not single" \
    -p no:cacheprovider > "$RES/tests_rest.log" 2>&1
echo "rc=$?" >> "$RES/tests_rest.log"; echo "tests_rest $(date -u +%T)" >> "$RES/times.txt"
tail -n 15 "$RES/tests_single.log"; cat "$RES/timing.log"; tail -n 8 "$RES/tests_rest.log"
exit 0
