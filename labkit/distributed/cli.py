"""``python -m labkit serve-batch`` and ``python -m labkit allreduce``: launch a torchrun job, one
process per GPU, on this machine or (run once per machine) across several.

The launcher checks what it can before any process starts, sets NVLink multicast off in the
environment of torchrun and of every rank (:data:`labkit.distributed.runtime.MULTICAST_OFF`), and
runs ``python -m torch.distributed.run ... -m labkit.distributed <command> <the same arguments>``;
each rank parses the same arguments (:func:`rank_main`). Rank 0 writes the results to ``--out``;
rows go under ``data/bench/<gpu>/`` only with ``--save``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from .. import resources
from .runtime import MULTICAST_OFF, multicast_off_env

COMMANDS = ("serve-batch", "allreduce")


def labkit_importable(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child process of this interpreter that must import this labkit: the directory that
    holds labkit/ goes first on PYTHONPATH where the interpreter would not find it by itself (a checkout
    run with PYTHONPATH, or from its root); an installed package is left to the interpreter (its
    site-packages directory on PYTHONPATH would come before the standard library)."""
    holder = resources.PACKAGE_DIR.parent
    installed = {Path(p).resolve() for key in ("purelib", "platlib") if (p := sysconfig.get_path(key))}
    if holder not in installed:
        env["PYTHONPATH"] = os.pathsep.join([str(holder), *filter(None, [env.get("PYTHONPATH")])])
    return env


def build_parser(command: str) -> argparse.ArgumentParser:
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; commands: {', '.join(COMMANDS)}")
    p = argparse.ArgumentParser(prog=f"labkit {command}", description=(__doc__ or "").split("\n\n")[0])
    g = p.add_argument_group("where the processes run (torchrun)")
    g.add_argument("--nproc-per-node", "--nproc", dest="nproc", type=int, default=None,
                   help="processes on this machine, one per GPU (default: every visible GPU; 1 without a GPU)")
    g.add_argument("--nnodes", type=int, default=1, help="machines in the job; run the same command on each")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0 .. nnodes-1")
    g.add_argument("--master-addr", default="127.0.0.1", help="address of node 0 (with --nnodes > 1)")
    g.add_argument("--master-port", type=int, default=29500, help="a free port on node 0 (with --nnodes > 1)")
    g.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="GPUs through NCCL, or CPUs through gloo (default: GPUs where there are any)")
    g.add_argument("--timeout-s", type=float, default=900, help="how long a rank waits for its peers in a collective")
    g.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    o = p.add_argument_group("results")
    o.add_argument("--out", type=Path, default=Path("build") / f"{command}.json",
                   help="rank 0 writes the full results here (every request's tokens for serve-batch)")
    o.add_argument("--save", action="store_true", help="also write the rows to <data-dir>/<gpu>/<name>.json")
    o.add_argument("--name", default=command, help="file name of the saved rows")
    o.add_argument("--data-dir", type=Path, default=None, help="default: the repository's data/bench")
    j = p.add_argument_group("the job")
    if command == "serve-batch":
        j.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"],
                       help="presets (random weights, seeded), shipped checkpoint names, or checkpoint directories")
        j.add_argument("--backend", default="auto", help="labkit backend of every replica (default: fused+graph "
                       "on GPUs, reference on CPUs)")
        j.add_argument("--batch", nargs="+", type=int, default=[1, 16], help="sequences decoded together per replica")
        j.add_argument("--num-batches", type=int, default=8, help="batches in the request set, for each batch size")
        j.add_argument("--prompt-min", type=int, default=64)
        j.add_argument("--prompt-max", type=int, default=192)
        j.add_argument("--new-tokens", type=int, default=128, help="greedy tokens generated per request")
        j.add_argument("--repeats", type=int, default=3, help="timed runs of the request set (median kept)")
        j.add_argument("--seed", type=int, default=0, help="of the request set (and of preset weights: 0)")
        j.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
        j.add_argument("--compare-single", action="store_true",
                       help="first serve the whole set on rank 0 alone: speed-up and tokens against one GPU")
    else:
        j.add_argument("--models", nargs="+", default=["lfm2-350m", "qwen3.5-0.8b"],
                       help="presets whose hidden sizes set the message sizes")
        j.add_argument("--hidden", nargs="+", type=int, default=None, help="hidden sizes (instead of --models)")
        j.add_argument("--batch", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
        j.add_argument("--iters", type=int, default=200, help="eager all-reduces per timed run")
        j.add_argument("--graph-iters", type=int, default=100, help="all-reduces captured in the timed graph")
        j.add_argument("--repeats", type=int, default=5)
    return p


# -- the launcher ---------------------------------------------------------------------------------
def validate(command: str, args: argparse.Namespace) -> None:
    """Bad input found before any process starts: raise SystemExit with the reason."""
    def fail(msg: str) -> None:
        raise SystemExit(f"labkit {command}: {msg}")

    if args.nproc is not None and args.nproc < 1:
        fail(f"--nproc must be >= 1, got {args.nproc}")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        fail(f"need --nnodes >= 1 and 0 <= --node-rank < --nnodes, got {args.nnodes} and {args.node_rank}")
    if any(b < 1 for b in args.batch):
        fail(f"batch sizes must be >= 1, got {args.batch}")
    if args.repeats < 1:
        fail(f"--repeats must be >= 1, got {args.repeats}")
    if command == "serve-batch":
        ranks = args.nproc * args.nnodes
        if args.num_batches < ranks:
            fail(f"more ranks ({ranks}) than batches of requests ({args.num_batches}): every replica needs at least "
                 "one batch; raise --num-batches or lower --nproc")
        if not 1 <= args.prompt_min <= args.prompt_max:
            fail(f"need 1 <= --prompt-min <= --prompt-max, got {args.prompt_min} and {args.prompt_max}")
        if args.new_tokens < 1:
            fail(f"--new-tokens must be >= 1, got {args.new_tokens}")
        from ..shipped import CHECKPOINTS, checkpoint_path
        from ..config import PRESETS

        for name in args.models:  # other machines check their own copies when the ranks load
            if name in PRESETS:
                continue
            if name in CHECKPOINTS:
                try:
                    checkpoint_path(name)
                except FileNotFoundError as exc:
                    fail(str(exc))
            elif not Path(name).expanduser().is_dir():
                fail(f"model {name!r} is not a preset ({', '.join(PRESETS)}), a shipped checkpoint "
                     f"({', '.join(CHECKPOINTS)}) or a checkpoint directory")
    else:
        from ..config import PRESETS

        unknown = [m for m in args.models if m not in PRESETS]
        if unknown and not args.hidden:
            fail(f"unknown presets {unknown}; presets: {', '.join(PRESETS)} (or give --hidden)")
        if args.iters < 1 or args.graph_iters < 1:
            fail("--iters and --graph-iters must be >= 1")


def _resolve_device_and_nproc(command: str, args: argparse.Namespace) -> str:
    import torch

    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if args.device == "auto" else args.device
    if device == "cuda":
        if not cuda:
            raise SystemExit(f"labkit {command}: --device cuda, but torch sees no CUDA GPU on this machine")
        gpus = torch.cuda.device_count()
        args.nproc = gpus if args.nproc is None else args.nproc
        if args.nproc > gpus:
            raise SystemExit(f"labkit {command}: --nproc {args.nproc}, but this machine has {gpus} visible GPU(s); "
                             "one process drives one GPU")
    elif args.nproc is None:
        args.nproc = 1
    return device


def torchrun_command(command: str, argv: list[str], args: argparse.Namespace) -> list[str]:
    """``python -m torch.distributed.run`` with the rendezvous for one or several machines."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc}"]
    if args.nnodes == 1:
        cmd.append("--standalone")  # a local rendezvous on a free port
    else:
        cmd += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}",
                f"--master-addr={args.master_addr}", f"--master-port={args.master_port}"]
    return cmd + ["-m", "labkit.distributed", command, *argv]


LAUNCHER_ONLY = {"nproc", "nnodes", "node_rank", "master_addr", "master_port", "dry_run", "help"}


def rank_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The parsed options again, spelled out in full for the ranks, without the launcher's own: the
    ranks' arguments pass through torchrun's parser, which rejects abbreviations of its options."""
    out: list[str] = []
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if action.dest in LAUNCHER_ONLY or not action.option_strings:
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest)
        if isinstance(action, argparse._StoreTrueAction):
            out += [flag] if value else []
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        elif value is not None:
            out.append(f"{flag}={value}")
    return out


def launch_env(device: str) -> dict[str, str]:
    """This process's environment with multicast off, and this labkit importable by every rank."""
    env = labkit_importable(multicast_off_env())
    env.setdefault("PYTHONUNBUFFERED", "1")  # rank 0's progress lines appear as they happen
    if device == "cpu":
        env.setdefault("TRITON_INTERPRET", "1")
    return env


def main(argv: list[str]) -> int:
    """The launcher: ``argv`` starts with the command name."""
    command, rest = argv[0], argv[1:]
    parser = build_parser(command)
    args = parser.parse_args(rest)
    args.device = _resolve_device_and_nproc(command, args)  # every rank runs where the launcher decided
    validate(command, args)
    cmd = torchrun_command(command, rank_argv(parser, args), args)
    print("+ " + " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items()) + " " + shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    env = launch_env(args.device)
    env["LABKIT_COMMAND"] = shlex.join(["python", "-m", "labkit", *argv])  # recorded with the results
    code = subprocess.run(cmd, env=env).returncode
    if code != 0:
        print(f"labkit {command}: the job failed (exit status {code}); the failing rank's error is above", file=sys.stderr)
    return code


def run_job(command: str, args: list[str], out: str | Path, timeout_s: float | None = None,
            echo: bool = True) -> dict[str, Any]:
    """Run ``python -m labkit <command> <args> --out <out>`` in a new process group (a notebook cannot
    host torchrun's ranks itself) and return rank 0's results document.

    The job's output is printed as it ends (torchrun's banner left out); a failed or timed-out job
    raises RuntimeError with the end of its output, and a timed-out one is ended with all its ranks.
    """
    import signal

    cmd = [sys.executable, "-m", "labkit", command, *args, f"--out={out}"]
    env = labkit_importable(dict(os.environ))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher, torchrun and every rank share this group
        text, _ = proc.communicate()
        raise RuntimeError(f"labkit {command} ran past {timeout_s} s and was stopped:\n" + _tail(text)) from None
    except BaseException:  # an interrupted notebook cell takes its job down with it
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    noise = ("*****", "Setting OMP_NUM_THREADS")
    lines = [ln for ln in text.splitlines() if not ln.startswith(noise)]
    if proc.returncode != 0:  # torchrun's summary ends the output; a rank's own error is further up
        marks = ("Error", "error:", "terminate", "Abort", "what():")
        cause = [ln for ln in lines if any(m in ln for m in marks)][-20:]
        raise RuntimeError(f"labkit {command} failed (exit status {proc.returncode}):\n" + _tail("\n".join(lines))
                           + ("\n-- error lines from earlier in the output:\n" + "\n".join(cause) if cause else ""))
    if echo:
        print("\n".join(lines))
    return json.loads(Path(out).read_text())


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# -- one rank -------------------------------------------------------------------------------------
def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


def rank_main(argv: list[str]) -> int:
    """One process of the job (``python -m labkit.distributed <command> ...`` under torchrun)."""
    from . import runtime

    command, rest = argv[0], argv[1:]
    args = build_parser(command).parse_args(rest)
    rank = runtime.start(args.device, args.timeout_s)
    try:
        job_command = os.environ.get("LABKIT_COMMAND") or shlex.join(["python", "-m", "labkit", command, *rest])
        if command == "serve-batch":
            from .serve import serve_job as job
        else:
            from .allreduce import allreduce_job as job
        done = job(rank, args, job_command)
        if done is not None:  # rank 0
            doc, rows = done
            doc["options"] = _jsonable(doc["options"])
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {args.out}", flush=True)
            if args.save:
                from ..bench import write_results
                from ..lab.hw import device_facts

                facts = device_facts(str(rank.device), measure=False)
                path = write_results(args.name, doc["kind"], rows, facts, command=job_command,
                                     data_dir=args.data_dir)  # None: the checkout's data/bench
                print(f"wrote {path}", flush=True)
        # Leave together: a rank that tears down its process group while another is still inside a
        # collective can make that one abort (one CPU notebook run in CI saw a rank end on SIGABRT).
        rank.barrier()
    finally:
        runtime.finish()
    return 0
