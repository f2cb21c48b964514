"""Issue 12's dead ends with real agents, real stores and real sockets on loopback.

* a whole round killed while the store survives: replacements end it and train;
* a full round whose members are gone (presence refused / heartbeats stalled) is
  ended by its waiters on every backend; a live one keeps them waiting;
* a training command that cannot start fails fast (exit 127), fails the job, and
  a later agent of the job stops at once instead of waiting for a round;
* SIGTERM while the store is unreachable (refused, or listening but silent) ends
  the agent at once, also with ``--rdzv-join-timeout inf``, and while it waits it
  says every few seconds what it waits for and why;
* etcd's "no endpoint reachable" names each endpoint's cause.

Every process is started here and stopped by PID; every wait is bounded; all
traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.localproc import LineLog, free_port, stop_process
from tests.integration.agent.conftest import Backend
from tests.integration.agent.test_rendezvous_contract import join_all, make_rdzv, pulse
from tests.integration.agent.tfagent_helpers import AGENT_BIN, PYTHON, Job, spawn
from torchflex_agent.errors import (
    JobFailedError,
    RendezvousTimeoutError,
    StoreUnavailableError,
)
from torchflex_agent.rendezvous.logic import (
    EXITED,
    SILENT,
    NodeDescriptor,
    RendezvousSettings,
    encode_membership,
)
from torchflex_agent.rendezvous.presence_probe import refused
from torchflex_agent.stores.etcd import EtcdKVStore
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import AgentReport, AgentState, RestartReason
from torchflex_contract.store_keys import CLOSED, HEARTBEAT, Keys, round_key

JOIN_TIMEOUT = 300.0
"""Far above every bound asserted here: a test that waits it out has failed."""
PROMPT_S = 15.0
"""Liveness bound (not a speed target) for 'at once' on a loaded 2-core machine."""


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel does) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def dead_port() -> int:
    """A loopback port nobody listens on (connections are refused)."""
    return free_port()


# -- item 1: a whole round dies ----------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nnodes", ["2:2", "1:1"], ids=["two-pods", "single-pod"])
def test_whole_round_killed_replacements_train_again(job: Job, nnodes: str) -> None:
    n = int(nnodes.split(":", maxsplit=1)[0])
    steps = 60
    extra = ["--rdzv-join-timeout", str(JOIN_TIMEOUT)]
    job.start_store()
    first = [job.start_agent(job.train_args(steps), nnodes, extra) for _ in range(n)]
    for log in first:
        log.wait_for(lambda s: "step=6 " in s, 120)
    # Freeze them all, then kill: no member gets to mark the round stale for
    # another's death -- the round stays closed, full and healthy-looking.
    for log in first:
        log.proc.send_signal(signal.SIGSTOP)
    for log in first:
        log.proc.send_signal(signal.SIGKILL)
    for log in first:
        log.proc.wait(10)
    fresh = [job.start_agent(job.train_args(steps), nnodes, extra) for _ in range(n)]
    joined = max(log.wait_for(lambda s: "joining the rendezvous" in s, 120)[0] for log in fresh)
    formed = max(log.wait_for(lambda s: "rendezvous took" in s, 60)[0] for log in fresh)
    waited = formed - joined
    assert waited < PROMPT_S, f"replacements waited {waited:.1f}s on a dead round"
    assert any("seen by a waiting joiner" in log.text() for log in fresh)
    # Infrastructure, not the user's budget: nobody counted a restart.
    assert all("restarts 0)" in log.text() for log in fresh)
    codes = [log.proc.wait(180) for log in fresh]
    assert codes == [ExitCode.SUCCESS] * n, [log.text()[-2000:] for log in fresh]
    assert any(f"step={steps} " in log.text() for log in fresh)
    assert any("resumed from step=" in log.text() for log in fresh)
    print(f"\nDEAD_ROUND nnodes={nnodes} waited_s={waited:.2f}")


def _dead_round(backend: Backend, run_id: str, watch_port: int, beats: int = 5) -> None:
    """Round 0 closed and full (max 2), its members gone: counters frozen at ``beats``."""
    store = backend.connect()
    keys = Keys(run_id)
    nodes = [NodeDescriptor(f"gone{i}", "127.0.0.1", 1, 1, watch_port) for i in range(2)]
    store.compare_set(round_key(keys, 0, CLOSED), None, encode_membership(nodes, "test"))
    for rank in range(2):
        store.add(round_key(keys, 0, HEARTBEAT, rank), beats)
    store.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("presence", ["refused", "unpublished"])
def test_waiters_end_a_full_round_whose_members_are_gone(backend: Backend, presence: str) -> None:
    settings = RendezvousSettings(2, 2, last_call=0.2, join_timeout=JOIN_TIMEOUT)
    run_id = f"dead-{uuid.uuid4().hex[:8]}"
    _dead_round(backend, run_id, dead_port() if presence == "refused" else 0)
    outcomes = join_all([make_rdzv(backend, run_id, f"n{i}", settings) for i in range(2)])
    assert [o.error for o in outcomes] == [None, None]
    results = [o.result for o in outcomes if o.result is not None]
    assert {r.round for r in results} == {1} and {r.num_nodes for r in results} == {2}
    slowest = max(o.elapsed for o in outcomes)
    assert slowest < PROMPT_S, f"waited {slowest:.1f}s on a dead round"
    check = make_rdzv(backend, run_id, "check", settings)
    mark = check.stale_mark(0)
    assert mark is not None and mark.reason is RestartReason.MEMBER_LOST
    how = EXITED if presence == "refused" else SILENT
    assert ("refused presence" if how == EXITED else "stopped heartbeating") in mark.detail
    assert check.lost(0) == ((0, how), (1, how))


@pytest.mark.timeout(120)
def test_a_live_full_round_keeps_its_waiters_waiting(backend: Backend) -> None:
    run_id = f"live-{uuid.uuid4().hex[:8]}"
    _dead_round(backend, run_id, 0)
    alive = pulse(backend, run_id, 0, 2)
    # Longer than several liveness timeouts: the watch must not end a live round.
    short = RendezvousSettings(2, 2, last_call=0.2, join_timeout=5.0)
    try:
        out = join_all([make_rdzv(backend, run_id, "waiter", short)])
    finally:
        alive.set()
    assert isinstance(out[0].error, RendezvousTimeoutError), out[0].error
    check = make_rdzv(backend, run_id, "check", short)
    assert check.stale_mark(0) is None
    # The members stop beating: the next waiter ends the round itself.
    settings = RendezvousSettings(1, 2, last_call=0.2, join_timeout=JOIN_TIMEOUT)
    out = join_all([make_rdzv(backend, run_id, "next", settings)])
    assert out[0].result is not None and out[0].result.round >= 1
    mark = check.stale_mark(0)
    assert mark is not None and "stopped heartbeating" in mark.detail


@pytest.mark.timeout(120)
def test_a_failed_job_ends_a_join_wait(backend: Backend) -> None:
    """A joiner waiting for the minimum stops within a slice once the job is failed."""
    settings = RendezvousSettings(2, 2, last_call=0.2, join_timeout=JOIN_TIMEOUT)
    run_id = f"failed-{uuid.uuid4().hex[:8]}"
    closer = make_rdzv(backend, run_id, "closer", settings)
    threading.Timer(1.0, closer.close_job, args=("failed", "cannot start 'nosuchcmd'")).start()
    out = join_all([make_rdzv(backend, run_id, "alone", settings)])
    assert isinstance(out[0].error, JobFailedError), out[0].error
    assert "nosuchcmd" in str(out[0].error)
    assert out[0].elapsed < PROMPT_S


def test_presence_probe_counts_only_refusals() -> None:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(4)
    try:
        live = int(listening.getsockname()[1])
        targets = [
            ("127.0.0.1", dead_port()),  # refused
            ("127.0.0.1", live),  # an agent lives there
            ("127.0.0.1", 0),  # no presence server published
            ("localhost", dead_port()),  # not an IP literal: no lookups, no verdict
            ("::1", dead_port()),  # refused over IPv6 too
        ]
        got = refused(targets)
    finally:
        listening.close()
    ipv6 = socket.has_ipv6 and Path("/proc/net/if_inet6").exists()
    assert got == ([0, 4] if ipv6 else [0])


# -- item 2: a command that cannot start -------------------------------------


def _bad_command(kind: str, tmp: Path) -> tuple[list[str], str]:
    if kind == "missing-executable":
        return ["nosuchcmd-7f3a", "--lr", "1"], "nosuchcmd-7f3a"
    if kind == "missing-script":
        return [PYTHON, "/nonexistent/train.py"], "/nonexistent/train.py"
    garbage = tmp / "not-a-program"
    garbage.write_text("this is not a program\n")
    garbage.chmod(0o755)
    return [str(garbage)], str(garbage)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["missing-executable", "missing-script", "exec-format"])
def test_bad_command_fails_fast_and_fails_the_job(job: Job, tmp_path: Path, kind: str) -> None:
    """Missing executable / script: refused before joining; not a program: at spawn."""
    job.start_store()
    extra = ["--rdzv-join-timeout", str(JOIN_TIMEOUT)]
    cmd, shown = _bad_command(kind, tmp_path)
    bad = job.start_agent(cmd, "1:1", extra)
    assert bad.proc.wait(60) == ExitCode.BAD_COMMAND, bad.text()[-3000:]
    report = job.termination_report(0)
    assert report.state is AgentState.FAILED
    assert shown in report.message and "\n" not in report.message
    assert "cannot start the training command" in report.message
    assert "Traceback" not in bad.text() and "terminate called" not in bad.text()
    # The job is failed in the store: a later agent (even with a command that
    # would run) stops at once with the reason instead of forming a round.
    later = job.start_agent([PYTHON, "-c", "pass"], "1:1", extra)
    assert later.proc.wait(60) == ExitCode.USER_ERROR, later.text()[-3000:]
    assert shown in job.termination_report(1).message


@pytest.mark.timeout(120)
def test_bad_command_with_an_unreachable_store_still_fails_fast(tmp_path: Path) -> None:
    """Marking the job failed is best effort: at most 5 s against a dead store."""
    report_path = tmp_path / "termination.log"
    cmd = [
        AGENT_BIN, "--nnodes", "1", "--rdzv-endpoint", f"127.0.0.1:{dead_port()}",
        "--rdzv-id", "bad-unreachable", "--rdzv-join-timeout", "inf", "--health-port", "0",
        "--", "nosuchcmd-7f3a",
    ]  # fmt: skip
    log = spawn(cmd, "agent", {"TORCHFLEX_TERMINATION_LOG": str(report_path)})
    proc = log.proc
    try:
        code = proc.wait(60)
    finally:
        stop_process(proc)
    assert code == ExitCode.BAD_COMMAND, log.text()[-2000:]
    assert "job not marked failed in the store" in log.text()
    assert "nosuchcmd-7f3a" in AgentReport.from_json(report_path.read_text()).message


# -- items 3 and 6: an unreachable store --------------------------------------


def _start_unreachable(
    backend: str, port: int, tmp: Path, join_timeout: str = "inf"
) -> tuple[LineLog, Path]:
    report = tmp / "termination.log"
    cmd = [
        AGENT_BIN,
        "--nnodes", "1",
        "--nproc-per-node", "1",
        "--rdzv-backend", backend,
        "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", f"unreachable-{uuid.uuid4().hex[:6]}",
        "--rdzv-join-timeout", join_timeout,
        "--health-port", "0",
        "--prewarm", "off",
        "--", PYTHON, "-c", "pass",
    ]  # fmt: skip
    return spawn(cmd, f"agent-{backend}", {"TORCHFLEX_TERMINATION_LOG": str(report)}), report


_CAUSES = {
    ("c10d", "refused"): "Connection refused",
    ("c10d", "silent"): "does not answer",
    ("etcd", "refused"): "Connection refused",
    ("etcd", "silent"): "timed out",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("endpoint", ["refused", "silent"])
@pytest.mark.parametrize("backend", ["c10d", "etcd"])
def test_sigterm_while_connecting_exits_at_once(
    tmp_path: Path, backend: str, endpoint: str
) -> None:
    with contextlib.ExitStack() as stack:
        port = dead_port() if endpoint == "refused" else stack.enter_context(silent_listener())
        log, report_path = _start_unreachable(backend, port, tmp_path)
        try:
            cause = _CAUSES[(backend, endpoint)]
            # It says what it waits for, and why, again and again (not once a minute).
            log.wait_for(lambda s: "still connecting to" in s and cause in s, 45)
            t0, _ = log.wait_for(lambda s: "still connecting to" in s, 1)
            log.wait_for(lambda s: "still connecting to" in s, 15, after=t0 + 0.01)
            assert all("no deadline" in m.string for _, m in log.matching("still connecting"))
            termed = time.monotonic()
            log.proc.send_signal(signal.SIGTERM)
            code = log.proc.wait(30)
            took = time.monotonic() - termed
        finally:
            stop_process(log.proc)
    assert code == ExitCode.PREEMPTED, log.text()[-2000:]
    # Connecting has no deadline: without the signal handler it would still be waiting at
    # wait(30). The bound tells the two apart with room for a loaded machine.
    assert took < 10.0, f"SIGTERM took {took:.1f}s while connecting"
    assert AgentReport.from_json(report_path.read_text()).state is AgentState.LEAVING
    print(f"\nSIGTERM_CONNECTING backend={backend} endpoint={endpoint} exit_s={took:.2f}")


@pytest.mark.timeout(120)
def test_unreachable_store_fails_at_the_join_timeout_with_the_cause(tmp_path: Path) -> None:
    log, report_path = _start_unreachable("c10d", dead_port(), tmp_path, join_timeout="8")
    try:
        code = log.proc.wait(60)
    finally:
        stop_process(log.proc)
    assert code == ExitCode.INFRA_ERROR, log.text()[-2000:]
    report = AgentReport.from_json(report_path.read_text())
    assert "unreachable for" in report.message and "Connection refused" in report.message


def test_etcd_error_names_each_endpoint_and_its_cause() -> None:
    with silent_listener() as silent:
        gone = dead_port()
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailableError) as err:
            EtcdKVStore([("http", "127.0.0.1", gone), ("http", "127.0.0.1", silent)], 0.5)
        took = time.monotonic() - t0
    text = str(err.value)
    assert f"http://127.0.0.1:{gone}: [Errno 111] Connection refused" in text, text
    assert f"http://127.0.0.1:{silent}: timed out" in text, text
    assert took < 10.0
