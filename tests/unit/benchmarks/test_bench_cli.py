"""The benchmarks' shared command line: common flags, bad flags, the command and the writing."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks import report
from benchmarks.cli import BenchCli, command, positive_float

MAINS = (
    "rendezvous",
    "recovery",
    "preemption",
    "goodput",
    "state_commit",
    "hang",
    "recovery_cluster",
    "straggler",
    "operator_scale",
    "autoscaler",
)


def _cli(**kwargs: str | None) -> BenchCli:
    cli = BenchCli("demo", "a demo", quick_help="1 run", reps_help="runs (default 5)", **kwargs)
    cli.add_subset("--cases", ("a", "b", "c"))
    return cli


def test_defaults_are_a_full_run_that_writes() -> None:
    bench = _cli().parse([])
    assert (bench.quick, bench.json, bench.write) == (False, False, True)
    assert bench.reps(5) == 5
    assert bench.args.cases == ["a", "b", "c"]
    assert bench.command == "python -m benchmarks.demo"


def test_quick_and_no_write_never_write() -> None:
    assert not _cli().parse(["--quick"]).write
    assert not _cli().parse(["--no-write"]).write
    assert _cli().parse(["--quick"]).reps(5) == 1
    assert _cli().parse(["--quick"]).reps(5, quick=2) == 2


def test_reps_given_wins_over_both_defaults() -> None:
    assert _cli().parse(["--reps", "3"]).reps(5) == 3
    assert _cli().parse(["--quick", "--reps", "3"]).reps(5) == 3


def test_subset_keeps_the_order_given() -> None:
    assert _cli().parse(["--cases", "c,a"]).args.cases == ["c", "a"]


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--reps", "0"], "must be at least 1"),
        (["--reps", "two"], "not an integer"),
        (["--cases", "a,z"], "unknown 'z' (choose from a, b, c)"),
        (["--cases", ","], "empty selection"),
    ],
)
def test_bad_flags_exit_non_zero_with_the_usage(
    argv: list[str], hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli().parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m benchmarks.demo")
    assert hint in err


@pytest.mark.parametrize(
    ("text", "hint"),
    [("0", "must be a finite number > 0"), ("-1.5", "must be a finite number > 0"),
     ("inf", "must be a finite number > 0"), ("nan", "must be a finite number > 0"),
     ("ten", "not a number")],
)  # fmt: skip
def test_positive_float_refuses_what_is_no_duration(
    text: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = BenchCli("plain", None, quick_help="small")
    cli.add_argument("--every", type=positive_float, default=30.0)
    assert cli.parse(["--every", "2.5"]).args.every == 2.5
    with pytest.raises(SystemExit) as exc:
        cli.parse(["--every", text])
    assert exc.value.code == 2
    assert hint in capsys.readouterr().err


def test_a_benchmark_without_json_or_reps_refuses_them(capsys: pytest.CaptureFixture[str]) -> None:
    cli = BenchCli("plain", None, quick_help="small", json_help=None)
    for flag in ("--json", "--reps"):
        with pytest.raises(SystemExit) as exc:
            cli.parse([flag])
        assert exc.value.code == 2
        assert "unrecognized arguments" in capsys.readouterr().err
    assert cli.parse([]).reps(5, quick=2) == 5


def test_command_reproduces_the_arguments_quoted() -> None:
    assert command("recovery", ["--fault", "freeze", "--reps", "1"]) == (
        "python -m benchmarks.recovery --fault freeze --reps 1"
    )
    assert command("x", ["--note", "two words"]) == "python -m benchmarks.x --note 'two words'"
    assert command("x", []) == "python -m benchmarks.x"


def test_show_prints_json_or_the_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    _cli().parse(["--json"]).show("| table |", {"median_s": 1.5})
    assert json.loads(capsys.readouterr().out) == {"median_s": 1.5}
    _cli().parse([]).show("| table |", {"median_s": 1.5})
    assert capsys.readouterr().out == "| table |\n"


def test_write_section_only_when_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(report, "RESULTS_MD", results)
    monkeypatch.setattr(report, "machine_line", lambda: "test machine")
    assert not _cli().parse(["--quick"]).write_section("demo", "Demo", "body")
    assert not _cli().parse(["--no-write"]).write_section("demo", "Demo", "body")
    assert not results.exists()
    assert _cli().parse(["--reps", "2"]).write_section("demo", "Demo", "body")
    text = results.read_text()
    assert "Command: `python -m benchmarks.demo --reps 2`" in text
    assert "<!-- bench:demo:begin -->" in text and "body" in text


@pytest.mark.parametrize("name", MAINS)
def test_every_benchmark_main_takes_the_common_flags(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(f"benchmarks.{name}").main
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    usage = capsys.readouterr().out
    assert f"python -m benchmarks.{name}" in usage
    assert "--quick" in usage and "--no-write" in usage
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-flag"])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("name", [m for m in MAINS if m != "operator_scale"])
def test_every_repeating_benchmark_refuses_zero_reps(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(f"benchmarks.{name}").main
    with pytest.raises(SystemExit) as exc:
        main(["--reps", "0"])
    assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
