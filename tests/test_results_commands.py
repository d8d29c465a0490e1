"""Every committed results file names a command that today's command line accepts: its "command" is
split as a shell would (shlex) and the argv after ``python -m labkit`` is given to labkit's own
argument parsers, which stop there (nothing runs)."""

import argparse
import json
import shlex
from pathlib import Path

import pytest

from labkit.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("data/bench/**/*.json"), *ROOT.glob("data/tuning/*.json")])


class _Parsed(Exception):
    """Raised by the first ``parse_args`` that accepts the argv: labkit's command goes no further."""


@pytest.fixture
def parse_only(monkeypatch):
    real = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)

    def parse(argv: list[str]) -> argparse.Namespace:
        try:
            main(argv)
        except _Parsed as parsed:
            return parsed.args[0]
        raise AssertionError(f"labkit {argv} returned without parsing its arguments")

    return parse


def labkit_argv(command: str) -> list[str]:
    """The argv after ``python -m labkit`` (or ``python3``, or with environment assignments before it)."""
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)  # VAR=value prefixes
    assert words[:3] in (["python", "-m", "labkit"], ["python3", "-m", "labkit"]), (
        f"not a `python -m labkit ...` command: {command!r}")
    return words[3:]


def test_there_are_results_files():
    assert len(FILES) > 20 and "data/tuning/nvidia-h200.json" in FILES


@pytest.mark.parametrize("path", FILES)
def test_the_results_file_names_a_command_the_cli_accepts(path, parse_only):
    doc = json.loads((ROOT / path).read_text())
    assert isinstance(doc.get("command"), str), f"{path} has no 'command'"
    args = parse_only(labkit_argv(doc["command"]))
    assert isinstance(args, argparse.Namespace)


@pytest.mark.parametrize("command", [
    "python tools/gpu_experiments/hit_host.py OUT",  # a script, not the CLI
    "python -m labkit bench decode --batch 0 --name x",  # refused value
    "python -m labkit bench nosuch --name x",  # no such subcommand
    "python -m labkit bench tma --no-such-option",  # an option its own parser does not have
])
def test_a_command_the_cli_refuses_is_caught(command, parse_only):
    with pytest.raises((AssertionError, SystemExit)):
        parse_only(labkit_argv(command))
