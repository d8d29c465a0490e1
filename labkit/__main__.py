"""Command line: ``python -m labkit <command>`` (also installed as ``labkit``)."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def _notebooks(args: argparse.Namespace) -> int:
    from .lab.notebooks import cpu_environment, print_summary, run_notebooks

    cpu_environment()
    params = {}
    for kv in args.param:
        name, _, text = kv.partition("=")
        try:  # numbers, booleans, lists as Python literals; anything else stays a string
            params[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            params[name] = text
    try:
        rows = run_notebooks(args.out, parameters=params, only=args.only, log_output=args.log_output)
    except ValueError as exc:  # --only matching no notebook, or a parameter no notebook has: nothing ran
        print(f"labkit notebooks: {exc}", file=sys.stderr)
        return 2
    print_summary(rows)
    return 1 if any(r["error"] for r in rows) else 0


def _strip(args: argparse.Namespace) -> int:
    from .lab.notebooks import strip_notebook

    for path in args.paths:
        print(f"{path}: {'; '.join(strip_notebook(path)) or 'none'}")
    return 0


def _colab(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .lab.notebooks import add_colab_cells, has_colab_cells, notebook_paths

    paths = [Path(p) for p in args.paths] or notebook_paths()
    if args.check:  # every notebook starts with the current cells (CI; nothing is written)
        stale = [p for p in paths if not has_colab_cells(json.loads(p.read_text(encoding="utf-8")), p.name)]
        for path in stale:
            print(f"{path}: its Colab cells are missing or stale; run python -m labkit colab-cells")
        return 1 if stale else 0
    for path in paths:
        print(f"{path}: {'wrote the Colab cells' if add_colab_cells(path) else 'up to date'}")
    return 0


def _ladder_table(args: argparse.Namespace) -> int:
    from .lab import ladder, summary

    try:
        if args.readme:
            summary.update_readme(args.readme, args.gpu)
        else:
            print(summary.markdown_table(summary.ladder_rows(args.gpu)))
    except (ladder.LadderMissing, ValueError) as exc:
        print(f"labkit ladder-table: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own_parsers = {  # commands with their own parser: python -m labkit <command> --help
        "bench": "labkit.bench.cli",
        "tune": "labkit.bench.tune",
        "compile-check": "labkit.lab.compile_check",
        "compile-check-prefill": "labkit.lab.compile_check_prefill",
        "train-tiny": "labkit.train",
    }
    if argv and argv[0] in own_parsers:
        import importlib

        return importlib.import_module(own_parsers[argv[0]]).main(argv[1:])
    if argv and argv[0] in ("serve-batch", "allreduce"):  # torchrun jobs: the rank's argv keeps the command
        from .distributed.cli import main as distributed_main

        return distributed_main(argv)
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    nb = sub.add_parser("notebooks", help="execute the notebooks with papermill")
    nb.add_argument("--out", default="build", help="where the executed notebooks go")
    nb.add_argument("--only", nargs="*", help="run the notebooks whose names contain these")
    nb.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a papermill parameter (a Python literal, else a string), repeatable")
    nb.add_argument("--log-output", action="store_true", help="stream the cells' output while they run")
    nb.set_defaults(func=_notebooks)
    strip = sub.add_parser("strip-notebooks", help="remove papermill's injected-parameters cell from executed "
                           "notebooks and set their kernelspec and language_info to what JupyterLab writes with "
                           "the kernel make lab installs, before committing them")
    strip.add_argument("paths", nargs="+")
    strip.set_defaults(func=_strip)
    colab = sub.add_parser("colab-cells", help="put the 'Open in Colab' badge and the Colab install cell first in "
                           "the notebooks (idempotent; default: every notebook in notebooks/)")
    colab.add_argument("paths", nargs="*")
    colab.add_argument("--check", action="store_true", help="write nothing; exit 1 if a notebook's cells are stale")
    colab.set_defaults(func=_colab)
    lt = sub.add_parser("ladder-table", help="the closing ladder (every rung, both models, batch 1 and 16) from "
                        "data/bench/<gpu>/ladder.json, as markdown; --readme rewrites the README's ladder block")
    lt.add_argument("--gpu", default="nvidia-h200")
    lt.add_argument("--readme", type=Path, help="rewrite the ladder block of this README")
    lt.set_defaults(func=_ladder_table)
    sub.add_parser("bench", help="benchmarks: python -m labkit bench --help (decode, prefill, ops, cache, table, "
                   "chain, tma, hit-timeline, hit-host, ...)")
    sub.add_parser("tune", help="sweep the linear kernels' blockings on this GPU into data/tuning/<gpu>.json")
    sub.add_parser("compile-check", help="compile every fused-step kernel for a GPU target, without a GPU")
    sub.add_parser("serve-batch", help="replicas on N GPUs (torchrun): python -m labkit serve-batch --help")
    sub.add_parser("allreduce", help="all-reduce latency at decode sizes (torchrun): python -m labkit allreduce --help")
    sub.add_parser("train-tiny", help="train a small byte-level model: python -m labkit train-tiny --help")

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
