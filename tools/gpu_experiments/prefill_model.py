"""Round A, prefill branch: the fused prefill of whole models (random weights, real shapes, bf16,
batch 1): eager with the element-wise fusions, eager without them (the path before them), and
fused+graph (first call: warm-up + capture; then replays), each checked against the reference's
last-token logits; a torch.profiler kernel-time sum beside the wall time shows the host's share.

    python3 tools/gpu_experiments/prefill_model.py $RES/model_prefill.json PRESET LENGTH [LENGTH...]

Also prints the profiler's top kernels of one eager call. Appends rows to the JSON file.
"""

import json
import os
import statistics
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import labkit
from labkit.decode.registry import make_decoder
from labkit.bench.ops import rel_err

OUT, PRESET, LENGTHS = sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]]
rows = json.load(open(OUT)) if os.path.exists(OUT) else []


def save():
    with open(OUT, "w") as f:
        json.dump(rows, f, indent=1)


def events_ms(fn, reps=5, setup=None):
    """Median ms of fn() by CUDA events around the host calls (host overhead included); setup()
    before each, untimed."""
    out = []
    for _ in range(reps):
        if setup is not None:
            setup()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def kernel_ms(fn, top=0, label=""):
    """Sum of device time of everything the profiler saw during one fn() (kernels, memcpy/set)."""
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    total = sum(e.self_device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA) / 1e3
    if top:
        print(f"--- top kernels: {label}")
        print(avg.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=70))
    return total


model = labkit.build(PRESET, dtype=torch.bfloat16, device="cuda", seed=0)
for T in LENGTHS:
    ids = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T)).cuda()
    with torch.no_grad():
        ref_cache = model.new_cache(1, T + 1)
        want = model(ids, cache=ref_cache, last_only=True)[:, -1].float()
        del ref_cache
        results = {}
        for name, backend, fusions in (("fused-eager", "fused", True), ("fused-eager-nofusion", "fused", False),
                                       ("fused+graph", "fused+graph", True)):
            row = dict(preset=PRESET, T=T, impl=name)
            try:
                cache = model.new_cache(1, T + 1)
                dec = make_decoder(backend, model, cache)
                if not fusions:
                    dec._fusions = None
                t0 = time.perf_counter()
                cache.reset()
                got = dec.prefill(ids).float()
                torch.cuda.synchronize()
                row["first_call_s"] = time.perf_counter() - t0
                row["capture_s"] = dec.last_prefill_capture_s
                row["rel_err_vs_ref"] = rel_err(got, want)
                row["argmax_equal"] = bool((got.argmax(-1) == want.argmax(-1)).all())

                def call():
                    dec.prefill(ids)

                cache.reset()
                call()
                row["ms"] = events_ms(call, setup=cache.reset)
                cache.reset()
                row["kernel_ms"] = kernel_ms(call, top=25 if name != "fused+graph" else 12, label=f"{PRESET} T={T} {name}")
                row["host_share"] = 1 - row["kernel_ms"] / row["ms"]
                row["captures"] = dec.prefill_captures
                del dec, cache
            except Exception as e:  # noqa: BLE001
                import traceback

                traceback.print_exc()
                row["error"] = repr(e)[:400]
            rows.append(row)
            print(row, flush=True)
            save()
            torch.cuda.empty_cache()

    # generate() as a user calls it: ttft_s of the first call (capture included) and of the next
    # (replay), and the greedy tokens against the reference backend's
    try:
        ref = labkit.generate(model, ids, 8, backend="reference", progress=False)
        first = labkit.generate(model, ids, 8, backend="fused+graph", progress=False)
        second = labkit.generate(model, ids, 8, backend="fused+graph", progress=False)
        row = dict(preset=PRESET, T=T, impl="generate fused+graph", ttft_first_s=first.ttft_s,
                   setup_first_s=first.setup_s, ttft_second_s=second.ttft_s, setup_second_s=second.setup_s,
                   tokens_equal_reference=bool(torch.equal(ref.tokens, first.tokens) and torch.equal(ref.tokens, second.tokens)))
    except Exception as e:  # noqa: BLE001
        row = dict(preset=PRESET, T=T, impl="generate fused+graph", error=repr(e)[:400])
    rows.append(row)
    print(row, flush=True)
    save()
