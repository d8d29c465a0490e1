# GPU run: baseline measurements (issue: diagnosis). Results and executed notebooks go to $OUT.
source tools/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
python3 -m labkit notebooks --only 00 01 --out build -p SAVE_RESULTS=True 2>&1 | grep -v -e "falling back" -e USDT
python3 -m labkit bench table
tar czf $OUT/results.tgz build data/bench
