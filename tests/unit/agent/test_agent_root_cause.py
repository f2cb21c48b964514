"""Root cause: error files (ours and torch's), stderr tracebacks, the first failure, bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchflex_agent.workers import rootcause, zygote
from torchflex_agent.workers.group import WorkerFailure, first_failure
from torchflex_agent.workers.rootcause import Recorded, parse_error_file, parse_traceback
from torchflex_contract import env as tfenv
from torchflex_contract.progress import (
    MAX_ERROR_MESSAGE,
    MAX_ERROR_TYPE,
    MAX_FRAME,
    MAX_FRAMES,
    RootCause,
)

TORCH_FORMAT = {
    "message": {
        "message": "RuntimeError: CUDA out of memory",
        "extraInfo": {
            "py_callstack": (
                "Traceback (most recent call last):\n"
                '  File "/w/train.py", line 40, in <module>\n'
                "    main()\n"
                '  File "/w/train.py", line 12, in main\n'
                "    step(model)\n"
                "RuntimeError: CUDA out of memory\n"
            ),
            "timestamp": "1700000000",
        },
    }
}


def test_bootstrap_env_name_is_the_contracts() -> None:
    assert zygote.ERROR_FILE_ENV == tfenv.ERROR_FILE


def test_bootstrap_records_type_message_frames(tmp_path: Path) -> None:
    path = tmp_path / "error.json"

    def inner() -> None:
        raise ValueError("bad batch 7")

    def outer() -> None:
        inner()

    try:
        outer()
    except ValueError as exc:
        zygote.record_exception(exc, str(path))
    recorded = rootcause.read_error_file(path)
    assert recorded is not None
    assert (recorded.type, recorded.message) == ("ValueError", "bad batch 7")
    assert recorded.frames[-1].endswith(" in inner") and recorded.frames[-2].endswith(" in outer")
    assert f"{Path(__file__)}:" in recorded.frames[-1]
    assert recorded.timestamp > 0
    zygote.record_exception(ValueError("x"), None)  # no env: nothing, no error
    assert list(tmp_path.iterdir()) == [path]


def test_torch_record_format_is_read() -> None:
    recorded = parse_error_file(json.dumps(TORCH_FORMAT))
    assert recorded == Recorded(
        "RuntimeError",
        "CUDA out of memory",
        ("/w/train.py:40 in <module>", "/w/train.py:12 in main"),
        1700000000.0,
    )


@pytest.mark.parametrize("text", ["not json", "[1]", "{}", '{"type": "X", "timestamp": "soon"}'])
def test_unusable_error_files(text: str) -> None:
    assert parse_error_file(text) is None


def test_last_traceback_on_stderr() -> None:
    lines = [
        "step=3 loss=0.1",
        "Traceback (most recent call last):",
        '  File "/w/a.py", line 1, in <module>',
        "KeyError: 'first'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 9, in <module>',
        "    main()",
        '  File "/w/train.py", line 5, in main',
        "    1 / 0",
        "    ~~^~~",
        "ZeroDivisionError: division by zero",
    ]
    assert parse_traceback(lines) == Recorded(
        "ZeroDivisionError",
        "division by zero",
        ("/w/train.py:9 in <module>", "/w/train.py:5 in main"),
    )
    assert parse_traceback(["just a log line"]) is None
    assert parse_traceback(["Traceback (most recent call last):", "  File"]) is None


def test_first_failure_is_the_earliest_recorded() -> None:
    late = RootCause("ValueError", "late", rank=0, timestamp=200.0)
    early = RootCause("RuntimeError", "early", rank=1, timestamp=100.0)
    failures = [
        WorkerFailure(0, 1, late.summary(), late),
        WorkerFailure(1, 1, early.summary(), early),
        WorkerFailure(2, -9, ""),
    ]
    chosen = first_failure(failures)
    assert chosen.rank == 1
    assert chosen.describe() == "rank 1 failed (exit code 1): RuntimeError: early"
    assert first_failure([WorkerFailure(3, -9, "")]).rank == 3
    unknown_time = RootCause("E", "m", rank=0)
    assert rootcause.first([unknown_time, late]) == late


def test_root_cause_is_bounded_on_parse() -> None:
    cause = Recorded(
        "T" * 1000, "m" * 100_000, tuple(f"f{i}.py:{i} in g" + "x" * 500 for i in range(50))
    ).cause(rank=3, exit_code=1, round_no=2)
    assert len(cause.type) == MAX_ERROR_TYPE and len(cause.message) == MAX_ERROR_MESSAGE
    assert len(cause.frames) == MAX_FRAMES and all(len(f) == MAX_FRAME for f in cause.frames)
    assert cause.frames[-1].startswith("f49.py")  # the innermost are kept
    assert (cause.rank, cause.exit_code, cause.round) == (3, 1, 2)
