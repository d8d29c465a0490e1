# GPU run: baseline measurements (issue: diagnosis). Logs, results and executed notebooks go to $OUT.
source tools/gpu_env.sh
exec > >(tee $OUT/baseline.log) 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
timeout ${NB_TIMEOUT:-300} python3 -m labkit notebooks --only 00 01 --out build -p SAVE_RESULTS=True -p INTERACTIVE=False
python3 -m labkit bench table
tar czf $OUT/results.tgz build data/bench
