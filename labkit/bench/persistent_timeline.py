"""``python -m labkit bench persistent-timeline``: one persistent decode step as the device saw it.

The persistent rung (``"persistent"``) runs the whole step as one kernel of resident programs; here
each program stamps the start and end of its part of every instruction with the GPU's global timer
(:meth:`labkit.decode.persistent.PersistentDecoder.timeline`). Per instruction the results give
when its first program started (its weights requested, then waiting), when its last tile ended,
and the busy time its programs spent, beside the bytes it streams and the time those bytes take at
the copy roofline; and the step as a whole: the stamped span, the steady-state graph replay (CUDA
events, median), and the roofline's floor for the step. What a step spends beyond its bytes is
there to see: waits at each boundary, tiles dealt unevenly, instructions whose programs stream
slower than the roofline.

    python -m labkit bench persistent-timeline --model lfm2-350m --batch 1
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import torch


def _instruction_rows(prog, stamps: torch.Tensor, copy_bytes_per_s: float) -> list[dict]:
    from ..ops.persistent_decode import ARGS

    rows = []
    for i, (name, ins) in enumerate(zip(prog.names, prog.instructions)):
        s = stamps[:, i]
        ran = s[:, 0] >= 0
        starts, ends = s[ran, 0].double(), s[ran, 1].double()
        if ins.op == "embed":  # B rows of the table, not the table
            w, h = ins.args
            streamed = ins.tiles * w.shape[1] * w.element_size()
        else:
            streamed = sum(t.numel() * t.element_size() for n, t in zip(ARGS[ins.op], ins.args)
                           if t is not None and n in ("w", "conv_w"))
        rows.append({
            "instruction": name, "op": ins.op, "tiles": ins.tiles, "programs": int(ran.sum()),
            "first_start_us": starts.min().item() / 1e3, "last_end_us": ends.max().item() / 1e3,
            "first_end_us": ends.min().item() / 1e3,
            "last_start_us": starts.max().item() / 1e3,
            "busy_us_mean": (ends - starts).mean().item() / 1e3, "busy_us_max": (ends - starts).max().item() / 1e3,
            "weight_bytes": streamed, "roofline_us": streamed / copy_bytes_per_s * 1e6,
        })
    return rows


def main(argv: list[str]) -> int:
    from ..config import PRESETS
    from ..lab.hw import device_facts
    from ..lab.roofline import step_cost
    from ..lab.timing import measure
    from .cli import positive_int, results_name
    from .results import DATA_DIR, write_document

    p = argparse.ArgumentParser(prog="labkit bench persistent-timeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(PRESETS), default="lfm2-350m", help="a preset, random bf16 weights")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--prompt", type=positive_int, default=128, help="tokens in the cache before the stamped step")
    p.add_argument("--repeats", type=positive_int, default=50, help="graph replays timed for the steady state")
    p.add_argument("--name", type=results_name, default="persistent-timeline",
                   help="results go to data/bench/<gpu>/<name>.json")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench persistent-timeline stamps the step with the GPU's global timer: it needs a CUDA GPU "
              "(the CPU tests check the same step: python -m pytest tests/test_persistent_decode.py)")
        return 2
    import labkit
    from ..decode.persistent import PersistentDecoder

    facts = device_facts("cuda")
    model = labkit.build(args.model, dtype=torch.bfloat16, device="cuda", seed=0)
    cache = model.new_cache(args.batch, args.prompt + args.repeats + 64)
    dec = PersistentDecoder(model, cache)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size, (args.batch, args.prompt), generator=gen).to("cuda")
    token = dec.prefill(ids).argmax(-1)
    prog, stamps = dec.timeline(token)
    stamps = stamps.cpu()
    rows = _instruction_rows(prog, stamps, facts.copy_bytes_per_s)
    replay = measure(lambda: dec.step_greedy(token), device="cuda", graph=False, warmup=5, repeats=args.repeats)
    cost = step_cost(model.cfg, args.batch, args.prompt)
    ran = stamps[..., 0] >= 0
    doc = {
        "model": args.model, "batch": args.batch, "context": args.prompt,
        "programs": int(stamps.shape[0]), "instructions": len(prog.instructions), "settings": dec.settings,
        "stamped_span_us": (stamps[..., 1].max() - stamps[..., 0][ran].min()).item() / 1e3,
        "step_ms_median": replay.ms, "tokens_per_s": args.batch / (replay.ms / 1e3),
        "roofline_step_us": cost.time_floor_s(facts.copy_bytes_per_s) * 1e6,
        "roofline_tokens_per_s": cost.tokens_per_s_limit(facts.copy_bytes_per_s),
        "rows": rows,
    }
    print(f"{args.model} B={args.batch}: {doc['instructions']} instructions on {doc['programs']} programs; "
          f"stamped {doc['stamped_span_us']:.1f} µs, replayed {replay.ms * 1e3:.1f} µs per step "
          f"({doc['tokens_per_s']:,.0f} tok/s), roofline {doc['roofline_step_us']:.1f} µs "
          f"({doc['roofline_tokens_per_s']:,.0f} tok/s)")
    for r in rows[:12]:
        print(f"  {r['instruction']:28s} {r['first_start_us']:8.1f} -> {r['last_end_us']:8.1f} µs "
              f"(busy {r['busy_us_mean']:6.1f}, roofline {r['roofline_us']:6.1f})")
    command = shlex.join(["python", "-m", "labkit", "bench", "persistent-timeline", *argv])
    path = write_document(args.name, "profile", doc, facts, command=command, data_dir=args.data_dir)
    print(f"wrote {path}")
    return 0
