"""The command line every benchmark shares: ``--quick``, ``--json``, ``--reps``, ``--no-write``.

Where it sits: each benchmark's ``main`` (``benchmarks/<name>.py``) builds its
parser with :class:`BenchCli`, adds only the flags that are its own, and gets a
:class:`Bench` back: whether this is a smoke run, how many repetitions, the
exact command that reproduces the run, and the two ways a benchmark reports
(its RESULTS.md section through :mod:`benchmarks.report`, and stdout: the
markdown, or one JSON object with ``--json``). One place decides what the
common flags mean, so they mean the same in every benchmark:

* ``--quick``: a smoke run (fewer repetitions and sizes); never writes
  RESULTS.md or plots;
* ``--no-write``: a full run that leaves RESULTS.md and plots as they are;
* ``--reps N``: repetitions per cell, a positive integer; it wins over the
  benchmark's default and over ``--quick``'s;
* ``--json``: stdout gets one JSON object, the benchmark's summary (in place
  of the markdown, or after it where the benchmark's help says so).

A bad flag or value exits with status 2 and argparse's usage line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks import report
from e2e import hostfiles


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (seconds, rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def subset(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """argparse type: a comma-separated subset of ``choices``, in the order given."""

    def parse(text: str) -> list[str]:
        picked = [c for c in text.split(",") if c]
        unknown = [c for c in picked if c not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))} (choose from {', '.join(choices)})"
            )
        if not picked:
            raise argparse.ArgumentTypeError("empty selection")
        return picked

    return parse


def command(name: str, argv: Sequence[str]) -> str:
    """The shell command that reproduces a run of ``benchmarks.<name>`` with ``argv``."""
    return f"python -m benchmarks.{name} {shlex.join(argv)}".strip()


@dataclasses.dataclass(frozen=True)
class Bench:
    """One parsed benchmark command line: the common flags, the benchmark's own in ``args``."""

    name: str
    args: argparse.Namespace
    command: str

    @property
    def quick(self) -> bool:
        return bool(self.args.quick)

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def write(self) -> bool:
        """Whether this run may write RESULTS.md and plots (not a smoke run, not ``--no-write``)."""
        return not (self.args.quick or self.args.no_write)

    def reps(self, default: int, quick: int = 1) -> int:
        """``--reps`` if given, else ``quick`` for a smoke run, else ``default``."""
        given: int | None = getattr(self.args, "reps", None)
        if given is not None:
            return given
        return quick if self.quick else default

    def write_section(self, section: str, title: str, body: str) -> bool:
        """Writes this run's RESULTS.md section (with its command) if it may; True if written."""
        if not self.write:
            return False
        report.write_section(section, title, self.command, body)
        return True

    def show(self, text: str, result: Mapping[str, Any]) -> None:
        """stdout: ``result`` as one JSON object with ``--json``, else the markdown ``text``."""
        if self.json:
            self.print_json(result)
        else:
            print(text)

    @staticmethod
    def print_json(result: Mapping[str, Any]) -> None:
        print(json.dumps(result), flush=True)


class BenchCli:
    """The parser of ``python -m benchmarks.<name>`` with the common flags already in it."""

    def __init__(
        self,
        name: str,
        description: str | None,
        *,
        quick_help: str,
        reps_help: str | None = None,
        json_help: str | None = "print one JSON object instead of the markdown",
    ) -> None:
        """The helps say what the flags do in this benchmark; ``None``: it has no such flag."""
        self.name = name
        self.parser = argparse.ArgumentParser(
            prog=f"python -m benchmarks.{name}", description=description
        )
        self.parser.add_argument(
            "--quick", action="store_true", help=f"{quick_help}; does not write RESULTS.md"
        )
        if json_help is not None:
            self.parser.add_argument("--json", action="store_true", help=json_help)
        if reps_help is not None:
            self.parser.add_argument("--reps", type=positive_int, default=None, help=reps_help)
        self.parser.add_argument(
            "--no-write", action="store_true", help="do not touch RESULTS.md / plots"
        )

    def add_argument(self, *names: str, **kwargs: Any) -> None:
        """A flag of this benchmark only (argparse's own arguments)."""
        self.parser.add_argument(*names, **kwargs)

    def add_subset(self, flag: str, choices: Sequence[str]) -> None:
        """``flag`` takes a comma-separated subset of ``choices`` (a list); default: all."""
        self.parser.add_argument(
            flag, type=subset(choices), default=",".join(choices),
            help=f"comma-separated subset of {','.join(choices)} (default: all)",
        )  # fmt: skip

    def parse(self, argv: Sequence[str] | None = None) -> Bench:
        given = list(argv) if argv is not None else sys.argv[1:]
        bench = Bench(self.name, self.parser.parse_args(given), command(self.name, given))
        # Every benchmark starts torch stores on the host: their peer-name lookups stay
        # in /etc/hosts, never reaching the machine's DNS server (e2e.hostfiles).
        hostfiles.ensure_loopback_names()
        return bench
