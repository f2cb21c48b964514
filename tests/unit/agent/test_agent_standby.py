"""The warm spare's decision, its flag, and its wait on a real local file.

Where it sits: unit tests of ``torchflex_agent.loop.standby`` and of the
``--standby-file`` flag (``config``). The wait reads a file in ``tmp_path``
that a thread replaces the way a kubelet does (write a temporary, rename);
the agent's real processes are in tests/integration/agent/test_agent_standby.py.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic.config import parse_args
from torchflex_agent.loop.standby import (
    WAITING_MESSAGE,
    is_standby,
    read_standby,
    wait_for_promotion,
)
from torchflex_contract import env as tfenv

BASE = ["--rdzv-id", "job-1", "--rdzv-endpoint", "store:29400"]


@pytest.mark.parametrize(
    ("content", "spare"),
    [
        ("true", True),
        ("true\n", True),
        ("  true \n", True),
        ("false", False),
        ("", False),
        (None, False),
        ("True", False),
        ("yes", False),
        ("true true", False),
    ],
)
def test_only_true_keeps_the_agent_waiting(content: str | None, spare: bool) -> None:
    assert is_standby(content) is spare


def test_a_missing_or_unreadable_file_reads_as_none(tmp_path: Path) -> None:
    assert read_standby(tmp_path / "absent") is None
    assert read_standby(tmp_path) is None  # a directory
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    assert read_standby(binary) is None


def test_flag_defaults_from_the_env_and_empty_means_none() -> None:
    env = {tfenv.STANDBY_FILE: "/etc/torchflex/podinfo/standby"}
    assert parse_args([*BASE, "--", "t"], env).standby_file == "/etc/torchflex/podinfo/standby"
    assert parse_args([*BASE, "--standby-file", "/x", "--", "t"], env).standby_file == "/x"
    assert parse_args([*BASE, "--", "t"], {}).standby_file is None
    assert parse_args([*BASE, "--", "t"], {tfenv.STANDBY_FILE: ""}).standby_file is None


def test_a_blank_path_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--standby-file"):
        parse_args([*BASE, "--standby-file", "  ", "--", "t"], {})


def _replace(path: Path, text: str) -> None:
    """Like a kubelet: write a temporary file, then rename it over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.mark.parametrize("content", ["false", "", "true-ish", None])
def test_not_a_spare_returns_at_once_and_logs_nothing(
    tmp_path: Path, content: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "standby"
    if content is not None:
        path.write_text(content)
    caplog.set_level(logging.INFO, logger="torchflex_agent.loop.standby")
    assert wait_for_promotion(path, threading.Event()) == 0.0
    assert caplog.records == []


@pytest.mark.parametrize("promoted_to", ["false", "", None])
def test_spare_waits_until_the_file_reads_anything_else(
    tmp_path: Path, promoted_to: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "standby"
    path.write_text("true")
    caplog.set_level(logging.INFO, logger="torchflex_agent.loop.standby")
    waiting = threading.Event()

    def promote() -> None:
        # Promote only once the wait has logged its start (bounded).
        waiting.wait(10)
        if promoted_to is None:
            path.unlink()
        else:
            _replace(path, promoted_to)

    class StartSeen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if WAITING_MESSAGE in record.getMessage():
                waiting.set()

    seen = StartSeen()
    logging.getLogger("torchflex_agent.loop.standby").addHandler(seen)
    promoter = threading.Thread(target=promote)
    promoter.start()
    try:
        waited = wait_for_promotion(path, threading.Event())
    finally:
        promoter.join(10)
        logging.getLogger("torchflex_agent.loop.standby").removeHandler(seen)
    assert waited is not None and waited > 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == f"{WAITING_MESSAGE} ({path})"
    assert messages[1].startswith("promoted after ") and messages[1].endswith(
        " s in standby: joining"
    )


def test_stop_ends_the_wait_without_promotion(tmp_path: Path) -> None:
    path = tmp_path / "standby"
    path.write_text("true")
    stop = threading.Event()
    stop.set()
    assert wait_for_promotion(path, stop) is None
    assert path.read_text() == "true"
