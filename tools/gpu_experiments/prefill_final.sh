# expected run time ~110 s (at most 120): the committed prefill results of issue 12, in two processes.
# Run from the repository root on the H200 after `source tools/gpu_env.sh`. Each process writes its rows as
# they come (per model), so a time limit keeps what was measured.
set +e
# 1. fla on the path (~50 s: fla's autotuning ~30 s, paid once): the GDN kernel beside fla (T = 1k, 4k, 16k,
#    64k and 8 x 2k packed; the default form, with and without the sequence split), then transformers+fla on
#    Qwen3.5 (LFM2 has no GDN layer). Also compiles the chunk kernels into Triton's cache for step 2.
PYTHONPATH="/tmp/fla:$PYTHONPATH" timeout -k 5 55 python3 -m labkit bench prefill --models qwen3.5-0.8b \
    --impls transformers+fla --lengths 512 4096 16384 --repeats 1 --name prefill-transformers-fla \
    --gdn-kernel gdn-prefill --gdn-variants default
# 2. no fla (~60 s): labkit fused+graph (steady state = replays; first_call_ms = a new decoder's first,
#    eager, prefill) and plain transformers, both presets, and the plot of prefill ms against prompt length
#    (data/bench/nvidia-h200/prefill.png) with the transformers+fla rows
timeout -k 5 65 python3 -m labkit bench prefill --models qwen3.5-0.8b lfm2-350m --impls fused+graph transformers \
    --lengths 512 4096 16384 --repeats 3 --peer-repeats 1 --name prefill \
    --plot data/bench/nvidia-h200/prefill-transformers-fla.json
exit 0
