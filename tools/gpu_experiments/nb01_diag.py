"""Round-A experiment for notebook 01: the measured time split of the reference decode step, the
trivial-work twin, the reference replayed from a CUDA graph (vs eager, with a parity check), the
profiler's overhead, on the real presets (random weights) at batch 1 and 16. Writes $RES/diag.json."""

import json
import os
import sys
import time
import traceback
from pathlib import Path
from dataclasses import asdict

import torch

import labkit
from labkit.lab.diagnosis import diagnose, graph_experiment
from labkit.bench.decode import time_decode
from labkit.bench.results import write_results
from labkit.lab.hw import device_facts, measure_launch_overhead
from labkit.lab.profile import profile_prefill

res = os.environ.get("RES", "/tmp/nb01-res")
os.makedirs(res, exist_ok=True)
t_start = time.time()
DEVICE = os.environ.get("NB01_DEVICE", "cuda")  # "cpu" only to smoke-test this script with tiny presets
facts = device_facts(DEVICE)
launch = measure_launch_overhead(device=DEVICE)
out = {"facts": {"name": facts.name, "copy_TBps": facts.copy_bytes_per_s / 1e12}, "launch": launch, "rows": [],
       "torch": torch.__version__}
print(f"{facts.name}: copy {facts.copy_bytes_per_s / 1e12:.2f} TB/s, launch {launch}", flush=True)


def save():
    with open(os.path.join(res, "diag.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)


only = sys.argv[1:] or ["lfm2-350m:1", "qwen3.5-0.8b:1", "lfm2-350m:16", "qwen3.5-0.8b:16"]
models = {}
diagnoses, prefills = [], []
out["decode"], out["prefill"] = [], []
for job in only:
    name, b = job.split(":")
    b = int(b)
    t0 = time.time()
    try:
        if name not in models:
            models.clear()
            torch.cuda.empty_cache()
            models[name] = labkit.build(name, dtype=torch.bfloat16 if DEVICE == "cuda" else torch.float32, device=DEVICE, seed=0)
        d, p = diagnose(models[name], b, launch, context=int(os.environ.get('NB01_CONTEXT', 128)), steps=5, rounds=3, graph=False, twin_rounds=2)
        try:
            graph_experiment(d, models[name])
        except Exception:
            traceback.print_exc()
        diagnoses.append(d)
        if DEVICE == "cuda":  # the committed file notebook 01 reads on a machine without a GPU
            print(write_results("baseline-diagnosis", "diagnosis", diagnoses, facts, data_dir=Path(res),
                                command="bash tools/gpu_experiments/nb01.sh (labkit.lab.diagnosis.diagnose)"))
        row = asdict(d)
        row.pop("timeline")
        row["profiler_overhead"] = d.profiler_overhead
        row["seconds"] = time.time() - t0
        tl = p.timeline
        row["timeline_kernels"] = len(tl)
        row["timeline_span_us"] = (tl[-1].start_us + tl[-1].dur_us) if tl else 0.0
        row["timeline_busy_us"] = sum(s.dur_us for s in tl)
        gaps = sorted(((tl[i + 1].start_us - (tl[i].start_us + tl[i].dur_us)), i) for i in range(len(tl) - 1))
        row["largest_gaps_us"] = [(round(g, 1), tl[i].name[:60], tl[i + 1].name[:60]) for g, i in gaps[-5:]]
        row["family_ms"] = p.family_ms
        row["bench_runs_ms"], row["profiled_runs_ms"] = p.bench_runs_ms, p.profiled_runs_ms
        out["rows"].append(row)
        # the timeline itself, for the figure (names cut)
        with open(os.path.join(res, f"timeline-{name}-b{b}.json"), "w") as f:
            json.dump([(s.family, round(s.start_us, 2), round(s.dur_us, 3)) for s in tl], f)
        sp = d.split()
        print(f"\n== {name} batch {b} ({row['seconds']:.1f} s)", flush=True)
        print(f"step {d.step_ms:.3f} ms (runs {p.bench_runs_ms}), profiled {d.profiled_step_ms:.3f} ms "
              f"(x{d.profiler_overhead:.2f}); kernels {d.kernels}, busy {d.gpu_busy_ms} ms; "
              f"launch api under profiler {d.launch_api_us} us; split error {d.split_error}")
        if sp:
            print("split: " + ", ".join(f"{k} {v:.3f} ms ({100 * v / sp.step_ms:.1f}%)" for k, v in sp.parts().items()))
        print(f"twin: step {d.twin_step_ms:.3f} ms, kernels {d.twin_kernels}, busy {d.twin_busy_ms}")
        if d.graph_step_ms:
            print(f"graph: step {d.graph_step_ms:.3f} ms, predicted {d.graph_predicted_ms:.3f} ms, "
                  f"rel err {d.graph_rel_err:.2e}, tokens match {d.graph_tokens_match}; eager/graph = "
                  f"x{d.step_ms / d.graph_step_ms:.1f}; tok/s eager {b / d.step_ms * 1e3:.1f} graph {b / d.graph_step_ms * 1e3:.1f}")
        # the notebook's decode benchmark for the two reference rungs (prompt 128, 32 steps, 2 runs)
        for impl in ("reference", "reference+graph"):
            r = time_decode(models[name], impl, b, 128, 32, repeats=2, facts=facts)
            out["decode"].append(asdict(r))
            print(f"time_decode {impl} b{b}: {r.tokens_per_s} tok/s ({r.pct_of_roofline}% of roofline) {r.error or ''}")
        if b == 1:  # how many kernels a reference prefill launches, and how busy they keep the GPU
            for n in (512, 4096):
                pp = profile_prefill(models[name], n)
                out["prefill"].append(asdict(pp))
                prefills.append(pp)
                if DEVICE == "cuda":
                    write_results("baseline-prefill-profile", "prefill-profile", prefills, facts, data_dir=Path(res),
                                  command="bash tools/gpu_experiments/nb01.sh (labkit.lab.profile.profile_prefill)")
                print(f"prefill {n}: {pp}")
        print(f"timeline: {len(tl)} kernels over {row['timeline_span_us']:.0f} us, busy {row['timeline_busy_us']:.0f} us; "
              f"largest gaps {row['largest_gaps_us']}")
    except Exception as exc:
        traceback.print_exc()
        out["rows"].append({"model": name, "batch": b, "error": repr(exc)[:500]})
    save()
print(f"total {time.time() - t_start:.1f} s")
