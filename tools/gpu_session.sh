# One GPU call: the baseline notebooks (00, 01) and the fused-kernel check, each under its own time
# limit; logs, executed notebooks and results go to $OUT even if a stage runs out of time.
source tools/gpu_env.sh
exec > >(tee $OUT/session.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
date -u
timeout ${NB_TIMEOUT:-230} python3 -m labkit notebooks --only 00 01 --out build -p SAVE_RESULTS=True -p INTERACTIVE=False
tar czf $OUT/results.tgz build data/bench
date -u
PYTHONPATH="$PYTHONPATH:/tmp/fla" timeout ${FUSED_TIMEOUT:-220} python3 tools/gpu_fused_check.py > $OUT/fused_check.log 2>&1
tail -60 $OUT/fused_check.log
date -u
