# One GPU call made of stages, each under its own time limit; logs, executed notebooks, results and
# checkpoints go to $OUT even if a stage runs out of time. Choose stages with STAGES (default: all):
#   notebooks  execute the notebooks (SAVE_RESULTS=True) into build/       (~3 min for 00 + 01, NB_ONLY, NB_FLA)
#   train      train the byte-level checkpoints side by side; $OUT/ck-<name>.tar each (~6 min for both);
#              FAMILIES (default "lfm2 qwen3.5"); CORPUS=<.tgz of a directory made by
#              python -m labkit train-tiny --export-corpus> trains on that corpus
#   gputests   python -m pytest -m gpu tests/gpu: every op and backend at the real shapes (~5-8 min; needs
#              pytest in .whl/: pytest, pluggy, iniconfig)
#   ops        python -m labkit bench ops: every decode op checked, then timed, into data/bench (~2 min)
#   decode     python -m labkit bench decode: tokens/s of DECODE_IMPLS, steady state and wall clock of
#              1 and 10 generate() calls, set-up included (~3 min)
#   tune       python -m labkit tune: linear blockings swept into data/tuning/<gpu>.json, for at most
#              TUNE_LIMIT_S seconds of new keys (default 240; TUNE_BATCHES, default "1 16")
#   prefill    python -m labkit bench gdn-prefill: the chunked delta-rule kernel against fla, T = 1k..64k and
#              8 packed prompts, split choices PREFILL_SPLITS (default "auto 0 16"), into data/bench (~2 min)
#   compile    transformers + torch.compile decode peer, into data/bench     (COMPILE_TIMEOUT)
#   ablate     python -m labkit bench prefill-profile --ablate all: each fast path of the fused prefill
#              switched off in turn, both presets at 4,096 tokens, into data/bench (~1 min)
#   hit        python -m labkit bench hit-timeline, then hit-host: a prefix-cache hit (Qwen3.5-0.8B, 4,096 + 64
#              tokens, fused+graph) on the clock vs the GPU, and its host side; then bench miss-timeline for
#              both presets (a steady miss of 4,160 tokens against no cache), into data/bench (~3 min)
#   ttft       time to first token, issue 27's figures: the chunked delta rule's settings tuned (tune --sections
#              chunk_delta_rule: its single-chunk blocking runs a hit's tail), the prompt gate|up GEMM swept and
#              its winner written as the GPU's prompt_gate_up settings (bench tail-ops --prompt ... --write-tuning),
#              then prefill against prompt length beside transformers (bench prefill) and TTFT with and without the
#              prefix cache (bench cache --experiments ttft), into data/bench and data/tuning (~7 min; each step
#              under its own limit, 570 s in all)
# GPU=1 runs on the second GPU of a two-GPU machine; two sessions on two GPUs may run side by side:
#   (GPU=1 STAGES="train tune" bash tools/gpu_session.sh &); GPU=0 STAGES="notebooks gputests" bash tools/gpu_session.sh; wait
source tools/gpu_env.sh
GPU=${GPU:-0}
export CUDA_VISIBLE_DEVICES=$GPU
exec > >(tee $OUT/session-gpu$GPU.log) 2>&1
STAGES=${STAGES:-notebooks train gputests ops}
nvidia-smi -i $GPU --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
git log -1 --format=%h 2>/dev/null
for stage in $STAGES; do
  date -u; echo "== $stage (GPU $GPU)"
  case $stage in
    notebooks)
      # NB_ONLY="02" runs a subset; NB_FLA=1 lets the kernels import fla (the GDN peer of notebook 02;
      # left out of 00/01, where transformers would pick it up and change its own baseline)
      PYTHONPATH="$PYTHONPATH${NB_FLA:+:/tmp/fla}" timeout ${NB_TIMEOUT:-300} python3 -m labkit notebooks --out build \
        ${NB_ONLY:+--only $NB_ONLY} -p SAVE_RESULTS=True
      tar czf $OUT/notebooks-$(echo ${NB_ONLY:-all} | tr ' ' '_').tgz build data/bench ;;
    train)
      corpus_args=""
      if [ -n "${CORPUS:-}" ]; then
        rm -rf /tmp/corpus && mkdir -p /tmp/corpus && tar xzf "$CORPUS" -C /tmp/corpus
        corpus_args="--corpus-root $(dirname /tmp/corpus/*/CORPUS.json)"
      fi
      for family in ${FAMILIES:-lfm2 qwen3.5}; do
        timeout ${TRAIN_TIMEOUT:-420} python3 -m labkit train-tiny --family $family --device cuda \
          --time-budget-s ${TRAIN_BUDGET_S:-360} $corpus_args ${TRAIN_ARGS:-} --no-progress > $OUT/train-$family.log 2>&1 &
        pids="$pids $!"
      done
      wait $pids  # not a bare wait: that would also wait for the tee above, forever
      tail -n 4 $OUT/train-*.log
      # one file per checkpoint: a file coming back from the device machine may be 16 MiB at most,
      # and the two (14 MB of bf16 weights each) do not fit in one
      for ck in data/checkpoints/*/; do tar cf $OUT/ck-$(basename $ck).tar -C data/checkpoints $(basename $ck); done ;;
    gputests)
      timeout ${GPUTESTS_TIMEOUT:-570} python3 -m pytest -m gpu tests/gpu -q -rfs > $OUT/gputests.log 2>&1
      tail -40 $OUT/gputests.log ;;
    ops)
      PYTHONPATH="$PYTHONPATH:/tmp/fla" timeout ${OPS_TIMEOUT:-300} python3 -m labkit bench ops --name bench-ops \
        > $OUT/ops.log 2>&1
      tail -60 $OUT/ops.log
      tar czf $OUT/ops.tgz data/bench ;;
    decode)
      timeout ${DECODE_TIMEOUT:-400} python3 -m labkit bench decode --name bench-decode \
        --impls ${DECODE_IMPLS:-fused fused+graph fused+graph+pdl} --repeats 3 > $OUT/decode.log 2>&1
      tail -30 $OUT/decode.log
      tar czf $OUT/decode.tgz data/bench ;;
    prefill)
      PYTHONPATH="$PYTHONPATH:/tmp/fla" timeout ${PREFILL_TIMEOUT:-240} python3 -m labkit bench gdn-prefill \
        --splits ${PREFILL_SPLITS:-auto 0 16} --name gdn-prefill > $OUT/prefill.log 2>&1
      tail -30 $OUT/prefill.log
      tar czf $OUT/prefill.tgz data/bench ;;
    tune)
      timeout ${TUNE_TIMEOUT:-540} python3 -m labkit tune --batches ${TUNE_BATCHES:-1 16} \
        --time-limit-s ${TUNE_LIMIT_S:-240} ${TUNE_OUT:+--out-dir $TUNE_OUT} > $OUT/tune.log 2>&1
      tail -40 $OUT/tune.log
      cp data/tuning/*.json $OUT/ ;;
    hit)
      timeout ${HIT_TIMEOUT:-100} python3 -m labkit bench hit-timeline > $OUT/hit-timeline.log 2>&1
      timeout ${HIT_TIMEOUT:-100} python3 -m labkit bench hit-host > $OUT/hit-host.log 2>&1
      for m in qwen3.5-0.8b lfm2-350m; do  # a steady miss against no cache, each preset
        timeout ${HIT_TIMEOUT:-100} python3 -m labkit bench miss-timeline --model $m --name miss-timeline-$m \
          > $OUT/miss-timeline-$m.log 2>&1
      done
      tail -30 $OUT/hit-timeline.log $OUT/hit-host.log $OUT/miss-timeline-*.log
      tar czf $OUT/hit.tgz data/bench ;;
    ttft)
      timeout ${CHUNK_TUNE_TIMEOUT:-130} python3 -m labkit tune --sections chunk_delta_rule --time-limit-s 90 \
        > $OUT/tune-chunk.log 2>&1
      grep "chunk_delta_rule:" $OUT/tune-chunk.log
      timeout ${SWEEP_TIMEOUT:-200} python3 -m labkit bench tail-ops --rows --prompt 4096 1024 --name prompt-gate-up \
        --write-tuning > $OUT/prompt-gate-up.log 2>&1
      grep -v "^      " $OUT/prompt-gate-up.log | tail -8
      cp data/tuning/*.json $OUT/
      timeout ${LENGTHS_TIMEOUT:-120} python3 -m labkit bench prefill --models qwen3.5-0.8b lfm2-350m \
        --impls fused+graph transformers --lengths 512 4096 16384 --repeats 3 --peer-repeats 1 --name prefill \
        > $OUT/prefill-length.log 2>&1
      tail -14 $OUT/prefill-length.log
      timeout ${TTFT_TIMEOUT:-120} python3 -m labkit bench cache --models qwen3.5-0.8b lfm2-350m --experiments ttft \
        --ttft-cases 4096:64:256 --backends fused+graph --repeats 5 --name prefix-cache-ttft > $OUT/ttft.log 2>&1
      tail -8 $OUT/ttft.log
      tar czf $OUT/ttft.tgz data/bench data/tuning ;;
    ablate)
      timeout ${ABLATE_TIMEOUT:-200} python3 -m labkit bench prefill-profile --ablate all \
        --name prefill-profile-ablations > $OUT/ablate.log 2>&1
      grep -e "==" -e without $OUT/ablate.log
      tar czf $OUT/ablate.tgz data/bench ;;
    compile)
      timeout ${COMPILE_TIMEOUT:-200} python3 -m labkit bench decode --impls transformers transformers+compile \
        --batch 1 16 --repeats 3 --name compile-peer-decode > $OUT/compile.log 2>&1
      tail -20 $OUT/compile.log
      tar czf $OUT/compile.tgz data/bench ;;
  esac
done
date -u
