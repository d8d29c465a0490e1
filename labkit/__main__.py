"""Command line: ``python -m labkit <command>`` (also installed as ``labkit``)."""

from __future__ import annotations

import argparse
import ast
import sys


def _notebooks(args: argparse.Namespace) -> int:
    from .notebooks import cpu_environment, print_summary, run_notebooks

    cpu_environment()
    params = {}
    for kv in args.param:
        name, _, text = kv.partition("=")
        try:  # numbers, booleans, lists as Python literals; anything else stays a string
            params[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            params[name] = text
    rows = run_notebooks(args.out, parameters=params, only=args.only, log_output=args.log_output)
    print_summary(rows)
    return 1 if any(r["error"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":  # its own parser: python -m labkit bench {decode,prefill,hw,table}
        from .bench import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] in ("serve-batch", "allreduce"):  # torchrun jobs, their own parsers: labkit serve-batch --help
        from .distributed.cli import main as distributed_main

        return distributed_main(argv)
    if argv and argv[0] == "train-tiny":  # its own parser: python -m labkit train-tiny --family ...
        from .train import main as train_main

        return train_main(argv[1:])
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    nb = sub.add_parser("notebooks", help="execute the notebooks with papermill")
    nb.add_argument("--out", default="build", help="where the executed notebooks go")
    nb.add_argument("--only", nargs="*", help="run the notebooks whose names contain these")
    nb.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a papermill parameter (a Python literal, else a string), repeatable")
    nb.add_argument("--log-output", action="store_true", help="stream the cells' output while they run")
    nb.set_defaults(func=_notebooks)
    sub.add_parser("bench", help="benchmarks: python -m labkit bench {decode,prefill,hw,table} --help")
    sub.add_parser("serve-batch", help="replicas on N GPUs (torchrun): python -m labkit serve-batch --help")
    sub.add_parser("allreduce", help="all-reduce latency at decode sizes (torchrun): python -m labkit allreduce --help")
    sub.add_parser("train-tiny", help="train a small byte-level model: python -m labkit train-tiny --help")

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
