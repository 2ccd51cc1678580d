"""Every subcommand and every flag of `dradriver` says what it is for in --help: the tree
built by build_parser() is walked whole (the `dev` tools included), so a new flag or
subcommand without help fails here."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dradriver.cli import build_parser


@dataclass
class Command:
    path: str  # "dradriver dev cluster"
    parser: argparse.ArgumentParser
    help: str | None  # its line in the parent's list of subcommands; None for the root


def commands(
    parser: argparse.ArgumentParser, path: str | None = None, help: str | None = None
) -> Iterator[Command]:
    path = path or parser.prog
    yield Command(path, parser, help)
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) not in seen:  # an alias names a parser already walked
                seen.add(id(sub))
                yield from commands(sub, f"{path} {name}", helps.get(name))


def _own_text(help: str | None) -> str:
    # flags.add appends "(env DRADRIVER_...; default: ...)" to whatever it is given, so
    # that suffix alone is no help.
    return (help or "").split(" (env DRADRIVER_")[0].strip()


def without_help(root: argparse.ArgumentParser) -> list[str]:
    """Subcommands without a help line or a description, and arguments without help
    (other than --help and --version, and those hidden on purpose)."""
    missing = []
    for cmd in commands(root):
        if cmd.path != root.prog and not (cmd.help and cmd.parser.description):
            missing.append(cmd.path)
        for action in cmd.parser._actions:
            skip = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)
            if isinstance(action, skip) or action.help == argparse.SUPPRESS:
                continue
            if not _own_text(action.help):
                missing.append(f"{cmd.path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_subcommand_and_argument_has_help() -> None:
    assert without_help(build_parser()) == []


def test_the_walk_reaches_the_dev_tools_and_finds_what_lacks_help() -> None:
    paths = {c.path for c in commands(build_parser())}
    assert {"dradriver devices", "dradriver dev cluster", "dradriver dev kubelet"} <= paths

    from dradriver import flags

    root = argparse.ArgumentParser(prog="x")
    sub = root.add_subparsers()
    a = sub.add_parser("a", help="does a", description="Does a.")
    a.add_argument("--fine", help="has help")
    a.add_argument("--bare")
    a.add_argument("thing")
    flags.add(a, "--from-env", "1")
    sub.add_parser("b", help="no description")
    sub.add_parser("c", description="no help line").add_argument("--hidden", help=argparse.SUPPRESS)
    assert without_help(root) == ["x a --bare", "x a thing", "x a --from-env", "x b", "x c"]


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["devices", "--help"], ["dev", "cluster", "--help"], ["dev", "kubelet", "-h"]],
)
def test_help_renders(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(argv)
    assert done.value.code == 0
    assert "usage: dradriver" in capsys.readouterr().out


def test_a_reader_that_leaves_early_is_no_error() -> None:
    """`dradriver devices -o json | head` printed a BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dradriver.cli",
            "devices",
            "--devices",
            "fake:8xH100-80GB",
            "--mig-mode",
            "dynamic",
            "-o",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)  # a few bytes, then the reader is gone
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
