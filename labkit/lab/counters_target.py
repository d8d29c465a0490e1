"""The program ``python -m labkit bench counters`` profiles: one decode step of a preset, alone.

    python -m labkit.lab.counters_target --model lfm2-350m --batch 1 --steps 2

Builds the preset with random weights (bf16, seed 0), fills ``--context`` tokens into its cache,
runs ``--steps`` greedy decode steps of an eager backend (``fused`` by default: no CUDA graph, so
every kernel is a launch of its own) and brackets the last one with ``cudaProfilerStart`` /
``cudaProfilerStop`` and an NVTX range ``labkit::decode_step``. Under ``ncu --profile-from-start
off`` exactly that step's kernels are profiled: nothing needs counting to skip the model's set-up,
and the kernels have all compiled and loaded in the steps before.

The context is fed through decode steps by default, one token each (the cache holds what a prefill
of those tokens would leave, every rung computing the same function); ``--prefill`` feeds it through
the rung's prefill instead, which also compiles the prefill's kernels (seconds more per preset).
The program prints to stderr only: ncu's CSV is the only thing on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

STEP_RANGE = "labkit::decode_step"
EAGER_BACKENDS = ("fused", "reference")


def _parser() -> argparse.ArgumentParser:
    from ..config import PRESETS

    p = argparse.ArgumentParser(prog="python -m labkit.lab.counters_target", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=list(PRESETS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=32, help="tokens in the cache before the decode steps")
    p.add_argument("--steps", type=int, default=2,
                   help="greedy decode steps after the context, the last one profiled (at least 2)")
    p.add_argument("--backend", choices=EAGER_BACKENDS, default="fused")
    p.add_argument("--prefill", action="store_true", help="feed the context through one prefill, not decode steps")
    return p


@torch.no_grad()
def run(model_name: str, batch: int = 1, context: int = 32, steps: int = 2, backend: str = "fused",
        prefill: bool = False, device: str = "cuda") -> torch.Tensor:
    """Decode as the module docstring says; returns the tokens of the profiled step [batch]."""
    import labkit
    from ..decode.registry import make_decoder

    if steps < 2 or batch < 1 or context < 1:
        raise ValueError(f"need steps >= 2 (the first compiles and loads the step's kernels), batch >= 1 and "
                         f"context >= 1; got {steps}, {batch}, {context}")
    model = labkit.build(labkit.PRESETS[model_name], dtype=torch.bfloat16, device=device, seed=0)
    cache = model.new_cache(batch, context + steps + 1)
    decoder = make_decoder(backend, model, cache)
    ids = torch.randint(0, model.cfg.vocab_size, (batch, context), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    if prefill:
        token = decoder.prefill(ids).argmax(-1)
    else:
        for t in range(context):
            token = decoder.step_greedy(ids[:, t]).clone()
    for _ in range(steps - 1):
        token = decoder.step_greedy(token).clone()
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    try:
        with torch.cuda.nvtx.range(STEP_RANGE) if cuda else contextlib.nullcontext():
            token = decoder.step_greedy(token)
        if cuda:
            torch.cuda.synchronize()
    finally:
        if cuda:
            torch.cuda.profiler.stop()
    return token.clone()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("argument --steps: at least 2 (the first compiles and loads the kernels)")
    if args.batch < 1 or args.context < 1:
        parser.error("arguments --batch and --context: at least 1")
    if not torch.cuda.is_available():
        print("counters_target decodes on a CUDA GPU for ncu to profile, and torch sees none here", file=sys.stderr)
        return 2
    tokens = run(args.model, args.batch, args.context, args.steps, args.backend, args.prefill)
    print(f"{args.model} {args.backend} batch {args.batch}: profiled step {args.context + args.steps} "
          f"(context {args.context}), tokens {tokens.tolist()[:4]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
