"""Table tests of the agent's dead-end fixes (issue 12): input bounds, the waiter's
member watch, the command check, launch error types, the store connect loop and
the etcd error text. Pure logic or the local filesystem only; no store, no network."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
from etcd3gw import exceptions as etcd_exc

from torchflex_agent.cli import USAGE_HINT, main
from torchflex_agent.errors import (
    CommandNotRunnableError,
    ConfigError,
    SpawnFailedError,
    StoreUnavailableError,
)
from torchflex_agent.loop.connecting import open_store
from torchflex_agent.loop.logic.config import MAX_NPROC, parse_args, resolve_nproc
from torchflex_agent.rendezvous.logic import MemberWatch, parse_counter
from torchflex_agent.rendezvous.protocol import RendezvousInterruptedError
from torchflex_agent.stores.etcd import etcd_cause
from torchflex_agent.stores.kvstore import KVStore, MemoryStore
from torchflex_agent.workers.group import command_problem, launch_error
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import Disposition, ExitCode, disposition

BASE = ["--rdzv-id", "job-1", "--rdzv-endpoint", "store:29400"]
CMD = ["--", "python", "train.py"]

# -- item 7: input validation ------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag", "says"),
    [
        (["--health-port", "99999"], "--health-port", "between 0 and 65535"),
        (["--health-port", "65536"], "--health-port", "between 0 and 65535"),
        (["--health-port", "nan"], "--health-port", "not a number"),
        (["--rdzv-join-timeout", "nan"], "--rdzv-join-timeout", "not a number"),
        (["--rdzv-join-timeout", "-5"], "--rdzv-join-timeout", "(or inf)"),
        (["--rdzv-join-timeout=-inf"], "--rdzv-join-timeout", "(or inf)"),
        (["--rdzv-last-call", "nan"], "--rdzv-last-call", "not a number"),
        (["--rdzv-last-call", "inf"], "--rdzv-last-call", "between 0 and 86400"),
        (["--heartbeat-interval", "NaN"], "--heartbeat-interval", "not a number"),
        (["--heartbeat-interval", "inf"], "--heartbeat-interval", "between 0.01 and 60"),
        (["--heartbeat-interval", "-0.2"], "--heartbeat-interval", "between"),
        (["--liveness-timeout", "nan"], "--liveness-timeout", "not a number"),
        (["--liveness-timeout", "inf"], "--liveness-timeout", "between 0.05 and 3600"),
        (["--monitor-interval", "nan"], "--monitor-interval", "not a number"),
        (["--monitor-interval", "inf"], "--monitor-interval", "between 0.01 and 60"),
        (["--monitor-interval", "0"], "--monitor-interval", "between"),
        (["--termination-grace", "nan"], "--termination-grace", "not a number"),
        (["--termination-grace", "inf"], "--termination-grace", "between 0 and 86400"),
        (["--termination-grace", "-1"], "--termination-grace", "between"),
        (["--stop-grace", "1e9"], "--stop-grace", "between 0 and 3600"),
        (["--max-restarts", "inf"], "--max-restarts", "not a number"),
        (["--max-restarts", "1" + "0" * 400], "--max-restarts", "between 0 and 1000000"),
        (["--nproc-per-node", str(MAX_NPROC + 1)], "--nproc-per-node", f"1..{MAX_NPROC}"),
        (["--nproc-per-node", "100000"], "--nproc-per-node", f"1..{MAX_NPROC}"),
    ],
)
def test_out_of_range_values_name_the_flag(argv: list[str], flag: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_args([*argv, *BASE, *CMD], env={})
    assert flag in str(err.value) and says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("env", "flag"),
    [
        ({tfenv.HEALTH_PORT: "99999"}, "--health-port"),
        ({tfenv.RDZV_JOIN_TIMEOUT: "nan"}, "--rdzv-join-timeout"),
        ({tfenv.HEARTBEAT_INTERVAL: "nan"}, "--heartbeat-interval"),
        ({tfenv.NPROC_PER_NODE: "5000"}, "--nproc-per-node"),
    ],
)
def test_env_values_are_checked_like_flags(env: dict[str, str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args([*BASE, *CMD], env=env)


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--rdzv-join-timeout", "inf"], "join_timeout", float("inf")),
        (["--health-port", "65535"], "health_port", 65535),
        (["--health-port", "0"], "health_port", 0),
        (["--nproc-per-node", str(MAX_NPROC)], "nproc_spec", str(MAX_NPROC)),
        (["--rdzv-last-call", "0"], "last_call", 0.0),
    ],
)
def test_boundary_values_are_accepted(argv: list[str], field: str, value: object) -> None:
    cfg = parse_args([*argv, *BASE, *CMD], env={})
    assert getattr(cfg, field) == value


def test_gpu_limit_above_the_bound_is_refused() -> None:
    with pytest.raises(ConfigError, match=tfenv.GPU_LIMIT):
        resolve_nproc("auto", str(MAX_NPROC + 1), lambda: 0)


@pytest.mark.parametrize(
    "argv",
    [
        ["--health-port", "99999"],
        ["--rdzv-join-timeout", "nan"],
        ["--monitor-interval", "nan"],
        ["--nproc-per-node", "4096"],
    ],
)
def test_cli_prints_one_line_and_a_usage_hint(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, *BASE, *CMD]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("torchflex-agent: error: ") and argv[0] in err[0]
    assert err[1] == USAGE_HINT


# -- item 1: the waiter's watch over a full round ----------------------------


@pytest.mark.parametrize(
    ("readings", "gone_at"),
    [
        # (time, {rank: counter}) per observation; first index whose result is non-empty.
        ([(0.0, {0: 5, 1: 7}), (1.0, {0: 5, 1: 7}), (1.6, {0: 5, 1: 7})], (2, (0, 1))),
        ([(0.0, {0: 5, 1: 7}), (1.0, {0: 6, 1: 7}), (1.6, {0: 7, 1: 7})], (2, (1,))),
        ([(0.0, {0: 5, 1: 7}), (1.0, {0: 6, 1: 8}), (2.0, {0: 7, 1: 9})], None),
        # Never heartbeated: absent counters stall like present ones.
        ([(0.0, {0: None}), (0.5, {0: None}), (1.5, {0: None})], (2, (0,))),
        # Restarted counting (a member re-created its key): still a change.
        ([(0.0, {0: 9}), (1.0, {0: 1}), (2.0, {0: 2})], None),
    ],
)
def test_member_watch(
    readings: list[tuple[float, dict[int, int | None]]], gone_at: tuple[int, tuple[int, ...]] | None
) -> None:
    watch = MemberWatch(timeout=1.5)
    seen = None
    for i, (now, beats) in enumerate(readings):
        stalled = watch.observe(beats, now)
        if stalled and seen is None:
            seen = (i, stalled)
    assert seen == gone_at


@pytest.mark.parametrize(("raw", "value"), [(None, None), (b"12", 12), (b"x", None), (b"", None)])
def test_parse_counter(raw: bytes | None, value: int | None) -> None:
    assert parse_counter(raw) == value


# -- item 2: a command that cannot run ---------------------------------------


def _file(path: Path, text: str, mode: int) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_command_problem(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    script = _file(tmp_path / "train.py", "print(1)\n", 0o644)
    tool = _file(tmp_path / "tool", "#!/bin/sh\n", 0o755)
    plain = _file(tmp_path / "plain", "#!/bin/sh\n", 0o644)
    python = os.path.realpath("/proc/self/exe")
    cases: list[tuple[list[str], str | None]] = [
        (["nosuchcmd", "--x"], "'nosuchcmd' not found on PATH"),
        (["/nonexistent/train"], "'/nonexistent/train' no such file"),
        ([plain], "is not an executable file"),
        (["plain"], "is not an executable file"),
        ([str(tmp_path)], "is not an executable file"),
        ([python, "/nonexistent/train.py"], "python cannot open '/nonexistent/train.py'"),
        ([python, "-u", "/nonexistent/train.py"], "python cannot open"),
        ([tool, "/nonexistent/train.py"], None),  # not python: the arguments are its own
        ([python, script, "--lr", "1"], None),
        ([python, "-m", "no_such_module_anywhere"], None),  # the interpreter's to report
        ([python, "-c", "pass"], None),
        (["tool"], None),
        (["sh", "-c", "exit 0"], None),
    ]
    for cmd, want in cases:
        got = command_problem(cmd, env)
        if want is None:
            assert got is None, (cmd, got)
        else:
            assert got is not None and want in got, (cmd, got)
            assert "\n" not in got and "cannot start the training command" in got


def test_long_commands_are_shortened_in_the_message() -> None:
    got = command_problem(["nosuchcmd", "x" * 1000], {"PATH": "/usr/bin"})
    assert got is not None and len(got) < 300


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.ENOENT, CommandNotRunnableError),
        (errno.EACCES, CommandNotRunnableError),
        (errno.ENOEXEC, CommandNotRunnableError),
        (errno.ENOTDIR, CommandNotRunnableError),
        (errno.EAGAIN, SpawnFailedError),
        (errno.ENOMEM, SpawnFailedError),
    ],
)
def test_launch_error_types(code: int, kind: type[Exception]) -> None:
    err = launch_error(["train", "--x"], OSError(code, os.strerror(code)))
    assert isinstance(err, kind)
    if kind is CommandNotRunnableError:
        assert "'train --x'" in str(err) and os.strerror(code) in str(err)


def test_bad_command_is_a_permanent_exit_code() -> None:
    assert disposition(ExitCode.BAD_COMMAND) is Disposition.PERMANENT
    assert ExitCode.BAD_COMMAND < 128
    assert len({int(c) for c in ExitCode}) == len(ExitCode)


# -- items 3 and 6: connecting ----------------------------------------------


class Attempts:
    """A connect function: fails ``failures`` times, then returns a store; or hangs."""

    def __init__(self, failures: int, hang: bool = False) -> None:
        self.failures = failures
        self.hang = hang
        self.calls = 0
        self.release = threading.Event()
        self.store = MemoryStore()

    def __call__(self, deadline: float) -> KVStore:
        self.calls += 1
        if self.hang and self.calls == 1:
            self.release.wait(30)
            raise StoreUnavailableError("released")
        if self.calls <= self.failures:
            raise StoreUnavailableError(f"refused #{self.calls}")
        return self.store


def test_open_store_retries_and_reports_each_error() -> None:
    connect = Attempts(failures=2)
    errors: list[str] = []
    store = open_store(
        connect,
        what="the test store",
        deadline=time.monotonic() + 30,
        stop=threading.Event(),
        on_error=errors.append,
    )
    assert store is connect.store
    assert errors == ["refused #1", "refused #2"]


def test_open_store_deadline_names_the_last_error() -> None:
    with pytest.raises(StoreUnavailableError, match=r"the test store unreachable .*refused #\d"):
        open_store(
            Attempts(failures=10**6),
            what="the test store",
            deadline=time.monotonic() + 1.0,
            stop=threading.Event(),
        )


def test_open_store_stops_on_request_even_while_an_attempt_hangs() -> None:
    connect = Attempts(failures=0, hang=True)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    try:
        with pytest.raises(RendezvousInterruptedError, match="the test store"):
            open_store(connect, what="the test store", deadline=float("inf"), stop=stop)
    finally:
        connect.release.set()


def test_open_store_leaves_a_hung_attempt_behind() -> None:
    connect = Attempts(failures=0, hang=True)
    try:
        store = open_store(
            connect,
            what="the test store",
            deadline=time.monotonic() + 30,
            stop=threading.Event(),
            hung_after=0.3,
        )
        assert store is connect.store and connect.calls == 2
    finally:
        connect.release.set()


def test_open_store_does_not_retry_programming_errors() -> None:
    def broken(deadline: float) -> KVStore:
        raise ValueError("bad endpoint list")

    with pytest.raises(ValueError, match="bad endpoint list"):
        open_store(broken, what="x", deadline=time.monotonic() + 30, stop=threading.Event())


# -- item 6: etcd errors say why --------------------------------------------

_REFUSED = (
    "HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: "
    "/v3/maintenance/status (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
    "object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused'))"
)
_TIMEOUT = "HTTPConnectionPool(host='127.0.0.1', port=2): Read timed out. (read timeout=0.5)"


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (etcd_exc.ConnectionFailedError(_REFUSED), "[Errno 111] Connection refused"),
        (etcd_exc.ConnectionTimeoutError(_TIMEOUT), "timed out (ConnectionTimeoutError)"),
        (etcd_exc.InternalServerError("boom", "Internal Server Error"), "Internal Server Error"),
        (etcd_exc.ConnectionFailedError(), "ConnectionFailedError"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "[Errno 113] No route to host"),
    ],
)
def test_etcd_cause(exc: BaseException, cause: str) -> None:
    assert etcd_cause(exc) == cause
