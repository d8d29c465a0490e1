# One GPU call made of stages, each under its own time limit; logs, executed notebooks, results and
# checkpoints go to $OUT even if a stage runs out of time. Choose stages with STAGES (default: all):
#   notebooks  execute the notebooks (SAVE_RESULTS=True) into build/       (~3 min for 00 + 01)
#   train      train both byte-level checkpoints concurrently              (~4 min with the default budget)
#   fused      tools/gpu_fused_check.py: every kernel checked and timed     (~1.5 min)
# e.g. STAGES="fused train" bash tools/gpu_session.sh
source tools/gpu_env.sh
exec > >(tee $OUT/session.log) 2>&1
STAGES=${STAGES:-notebooks train fused}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
git log -1 --format=%h 2>/dev/null
for stage in $STAGES; do
  date -u; echo "== $stage"
  case $stage in
    notebooks)
      timeout ${NB_TIMEOUT:-300} python3 -m labkit notebooks --out build -p SAVE_RESULTS=True
      tar czf $OUT/notebooks.tgz build data/bench ;;
    train)
      for family in lfm2 qwen3.5; do
        timeout ${TRAIN_TIMEOUT:-260} python3 -m labkit train-tiny --family $family --device cuda \
          --time-budget-s ${TRAIN_BUDGET_S:-180} --no-progress > $OUT/train-$family.log 2>&1 &
      done
      wait
      tar czf $OUT/checkpoints.tgz data/checkpoints ;;
    fused)
      PYTHONPATH="$PYTHONPATH:/tmp/fla" timeout ${FUSED_TIMEOUT:-220} python3 tools/gpu_fused_check.py > $OUT/fused_check.log 2>&1
      tail -60 $OUT/fused_check.log ;;
  esac
done
date -u
