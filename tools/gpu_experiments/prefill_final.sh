# expected run time ~115 s (at most 120): the committed prefill results of issue 12, in two processes.
# Run from the repository root on the H200 after `source tools/gpu_env.sh`. Each writes its rows as they come,
# so a time limit keeps what was measured.
set +e
# 1. fla on the path (~55 s): the GDN kernel beside fla (T = 1k, 4k, 16k, 64k and 8 x 2k packed; the default
#    form and the former one), then transformers+fla on Qwen3.5 (fla autotunes once for both)
PYTHONPATH="/tmp/fla:$PYTHONPATH" timeout -k 5 60 python3 -m labkit bench prefill --models qwen3.5-0.8b \
    --impls transformers+fla --lengths 512 4096 16384 --repeats 1 --name prefill-transformers-fla \
    --gdn-kernel gdn-prefill --gdn-variants default fused-prepare+walk-outputs
# 2. no fla (~55 s): labkit fused+graph (steady state and a new length's first call) and plain transformers,
#    both presets, and the plot of prefill ms against prompt length with the transformers+fla rows
timeout -k 5 60 python3 -m labkit bench prefill --models lfm2-350m qwen3.5-0.8b --impls fused+graph transformers \
    --lengths 512 4096 16384 --repeats 3 --peer-repeats 1 --name prefill \
    --plot data/bench/nvidia-h200/prefill-transformers-fla.json
exit 0
