"""Contract tests of the rendezvous, run against every backend.

Each test runs the same protocol over the in-memory fake, a real c10d
TCPStore (a ``torchflex-agent store`` process) and a real etcd. Members are
threads with their own store connection, except where a member must die for
real: there it is a subprocess (``rdzv_member.py``) killed with SIGKILL.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import threading
import time
import uuid

import pytest

from e2e.localproc import stop_process
from tests.integration.agent.conftest import Backend
from tests.integration.agent.tfagent_helpers import PYTHON, child_env
from torchflex_agent.errors import RendezvousTimeoutError
from torchflex_agent.rendezvous.liveness import LivenessSettings, RoundMonitor
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult, RendezvousSettings
from torchflex_agent.rendezvous.protocol import Rendezvous, RendezvousInterruptedError
from torchflex_contract.progress import RestartReason
from torchflex_contract.roles import RoleSize
from torchflex_contract.store_keys import ARRIVALS, HEARTBEAT, Keys, round_key

LIVENESS = LivenessSettings(heartbeat_interval=0.2, timeout=1.5)
MEMBER_SCRIPT = str(__import__("pathlib").Path(__file__).with_name("rdzv_member.py"))


def new_run_id() -> str:
    return f"contract-{uuid.uuid4().hex[:10]}"


def make_rdzv(backend: Backend, run_id: str, name: str, settings: RendezvousSettings) -> Rendezvous:
    node = NodeDescriptor(name, "127.0.0.1", 29500, 1)
    return Rendezvous(backend.connect(), run_id, node, settings)


@dataclasses.dataclass
class Outcome:
    rdzv: Rendezvous
    result: RendezvousResult | None = None
    error: BaseException | None = None
    elapsed: float = 0.0


def join_all(
    rdzvs: list[Rendezvous],
    min_round: int = 0,
    stop: threading.Event | None = None,
    stagger: float = 0.0,
    timeout: float = 60.0,
) -> list[Outcome]:
    outcomes = [Outcome(r) for r in rdzvs]

    def run(o: Outcome) -> None:
        started = time.monotonic()
        try:
            o.result = o.rdzv.next_round(min_round, stop=stop)
        except BaseException as exc:
            o.error = exc
        o.elapsed = time.monotonic() - started

    threads = []
    for o in outcomes:
        t = threading.Thread(target=run, args=(o,), daemon=True)
        t.start()
        threads.append(t)
        if stagger:
            time.sleep(stagger)
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a joiner did not return in time"
    return outcomes


def assert_one_group(results: list[RendezvousResult], size: int) -> None:
    assert len(results) == size
    assert len({r.round for r in results}) == 1, "members disagree on the round"
    assert sorted(r.node_rank for r in results) == list(range(size))
    memberships = {tuple(n.node_id for n in r.nodes) for r in results}
    assert len(memberships) == 1, "members disagree on the membership"
    for r in results:
        assert r.me.node_id == r.nodes[r.node_rank].node_id
        assert r.world_size == size


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [3, 16])
def test_n_agents_form_one_group(backend: Backend, n: int) -> None:
    # A last call far longer than forming takes, so the check below tells "closed when
    # max joined" from "waited out the last call" even on a loaded machine.
    settings = RendezvousSettings(1, n, last_call=30.0, join_timeout=60)
    run_id = new_run_id()
    rdzvs = [make_rdzv(backend, run_id, f"n{i}", settings) for i in range(n)]
    t0 = time.monotonic()
    outcomes = join_all(rdzvs)
    wall = time.monotonic() - t0
    assert [o.error for o in outcomes] == [None] * n
    assert_one_group([o.result for o in outcomes if o.result], n)
    # max nodes joined: closing must not wait out the 30 s last call.
    assert wall < 15.0, f"rendezvous of {n} took {wall:.2f}s"
    print(f"\nRDZV_TIME backend={backend.name} n={n} wall_ms={wall * 1000:.1f}")


def pulse(backend: Backend, run_id: str, round_no: int, ranks: int) -> threading.Event:
    """Heartbeat ``ranks`` members of a round every 0.2 s until the returned event is set.

    Waiters on a full round watch its members and end the round for ones
    whose counters stall, so a group formed by bare ``next_round`` calls must
    beat like real members (``RoundMonitor``) for its waiters to keep waiting.
    """
    done = threading.Event()
    store = backend.connect()
    keys = [round_key(Keys(run_id), round_no, HEARTBEAT, r) for r in range(ranks)]

    def beat() -> None:
        try:
            while not done.wait(0.2):
                for key in keys:
                    store.add(key, 1)
        finally:
            store.close()

    threading.Thread(target=beat, daemon=True).start()
    return done


@pytest.mark.timeout(60)
def test_exclusivity_late_agents_wait(backend: Backend) -> None:
    # The join timeout bounds the waiters (the test waits them out) but must
    # leave the first round ample time to form on a loaded 2-core machine: a
    # member whose own join times out before closure aborts the round.
    settings = RendezvousSettings(2, 3, last_call=0.2, join_timeout=8.0)
    run_id = new_run_id()
    rdzvs = [make_rdzv(backend, run_id, f"n{i}", settings) for i in range(5)]
    alive = pulse(backend, run_id, 0, 3)
    try:
        outcomes = join_all(rdzvs)
    finally:
        alive.set()
    formed = [o.result for o in outcomes if o.result is not None]
    waited = [o.error for o in outcomes if o.error is not None]
    assert_one_group(formed, 3)
    # The two extra agents never form a second group: they wait for room
    # until their join timeout.
    assert len(waited) == 2
    assert all(isinstance(e, RendezvousTimeoutError) for e in waited), waited


@pytest.mark.timeout(60)
def test_closes_after_last_call_once_min_reached(backend: Backend) -> None:
    settings = RendezvousSettings(2, 4, last_call=0.6, join_timeout=20)
    run_id = new_run_id()
    outcomes = join_all([make_rdzv(backend, run_id, f"n{i}", settings) for i in range(2)])
    assert_one_group([o.result for o in outcomes if o.result], 2)
    slowest = max(o.elapsed for o in outcomes)
    # Closed by the last call (0.6 s), not by the 20 s join timeout.
    assert 0.5 <= slowest < 10.0, f"closed after {slowest:.2f}s, last call is 0.6s"


@pytest.mark.timeout(60)
def test_timeout_below_minimum_is_a_clear_error(backend: Backend) -> None:
    settings = RendezvousSettings(3, 4, last_call=0.1, join_timeout=1.0)
    run_id = new_run_id()
    outcomes = join_all([make_rdzv(backend, run_id, f"n{i}", settings) for i in range(2)])
    errors = [str(o.error) for o in outcomes]
    for o in outcomes:
        assert isinstance(o.error, RendezvousTimeoutError), o.error
        assert o.elapsed >= 0.9  # not before its 1 s join timeout (how late: benchmarks' job)
    # The first to time out leaves (aborts round 0). The other either times out in
    # round 0 too, or (started a little later, so its deadline is later) sees the
    # abort, moves on, and times out alone: each error says what it saw.
    assert any("round 0: 2 of min 3" in e for e in errors), errors
    assert all("round 0: 2 of min 3" in e or "round 1: 1 of min 3" in e for e in errors), errors


def start_monitors(
    members: list[tuple[Rendezvous, RendezvousResult]],
) -> list[tuple[RoundMonitor, threading.Event]]:
    out = []
    for rdzv, result in members:
        wake = threading.Event()
        mon = RoundMonitor(rdzv, result, LIVENESS, wake)
        mon.start()
        out.append((mon, wake))
    return out


def wait_event(mon: RoundMonitor, wake: threading.Event, timeout: float) -> RestartReason:
    assert wake.wait(timeout), "monitor reported nothing"
    assert mon.event is not None
    return mon.event.reason


@pytest.mark.timeout(90)
def test_late_joiner_is_admitted(backend: Backend) -> None:
    settings = RendezvousSettings(2, 4, last_call=0.2, join_timeout=20)
    run_id = new_run_id()
    first = join_all([make_rdzv(backend, run_id, f"n{i}", settings) for i in range(2)])
    members = [(o.rdzv, o.result) for o in first if o.result is not None]
    assert len(members) == 2
    monitors = start_monitors(members)
    late = make_rdzv(backend, run_id, "late", settings)
    late_out: list[Outcome] = []
    t = threading.Thread(target=lambda: late_out.extend(join_all([late])), daemon=True)
    t.start()
    try:
        for mon, wake in monitors:
            assert wait_event(mon, wake, 5.0) is RestartReason.MEMBER_JOINED
    finally:
        for mon, _ in monitors:
            mon.stop()
    round_no = members[0][1].round
    again = join_all([rdzv for rdzv, _ in members], min_round=round_no + 1)
    t.join(30)
    results = [o.result for o in again + late_out if o.result is not None]
    assert_one_group(results, 3)
    assert results[0].round > round_no


def spawn_member(backend: Backend, run_id: str, lo: int, hi: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, MEMBER_SCRIPT, backend.name, str(backend.port), run_id, str(lo), str(hi)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )


def form_with_member_process(
    backend: Backend, run_id: str, settings: RendezvousSettings, n_threads: int
) -> tuple[subprocess.Popen[str] | None, list[tuple[Rendezvous, RendezvousResult]]]:
    """Form a group of ``n_threads`` thread members plus one process member (not for memory)."""
    proc = None
    size = n_threads
    if backend.name != "memory":
        proc = spawn_member(backend, run_id, settings.min_nodes, settings.max_nodes)
        size += 1
        # Let the process arrive first (it pays a torch import), so the
        # threads' last call cannot close the round without it.
        probe = backend.connect()
        arrivals = round_key(Keys(run_id), 0, ARRIVALS)
        deadline = time.monotonic() + 30
        while probe.tickets(arrivals) < 1:
            assert time.monotonic() < deadline, "member process never arrived"
            assert proc.poll() is None, "member process died"
            time.sleep(0.05)
        probe.close()
    outcomes = join_all([make_rdzv(backend, run_id, f"t{i}", settings) for i in range(n_threads)])
    members = [(o.rdzv, o.result) for o in outcomes if o.result is not None]
    assert len(members) == n_threads, [o.error for o in outcomes]
    assert members[0][1].num_nodes == size
    if proc is not None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert json.loads(line)["round"] == members[0][1].round
    return proc, members


@pytest.mark.timeout(90)
def test_member_that_stops_heartbeating_is_dropped(backend: Backend) -> None:
    settings = RendezvousSettings(2, 3, last_call=0.3, join_timeout=30)
    run_id = new_run_id()
    proc, members = form_with_member_process(
        backend, run_id, settings, 3 if backend.name == "memory" else 2
    )
    try:
        # In-process fake: the victim simply never heartbeats (no monitor started).
        survivors = members[:2] if proc is None else members
        monitors = start_monitors(survivors)
        time.sleep(0.5)
        killed_at = time.monotonic()
        if proc is not None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        try:
            for mon, wake in monitors:
                assert wait_event(mon, wake, 6.0) is RestartReason.MEMBER_LOST
            detected = time.monotonic() - killed_at
        finally:
            for mon, _ in monitors:
                mon.stop()
        assert detected < 4.0, f"loss detected after {detected:.2f}s"
        round_no = survivors[0][1].round
        again = join_all([r for r, _ in survivors], min_round=round_no + 1)
        assert_one_group([o.result for o in again if o.result], 2)
        print(f"\nLOSS_DETECT backend={backend.name} s={detected:.2f}")
    finally:
        if proc is not None:
            stop_process(proc)


@pytest.mark.timeout(90)
def test_sigterm_leave_is_seen_at_once(backend: Backend) -> None:
    settings = RendezvousSettings(2, 3, last_call=0.3, join_timeout=30)
    run_id = new_run_id()
    proc, members = form_with_member_process(
        backend, run_id, settings, 3 if backend.name == "memory" else 2
    )
    survivors = members if proc is not None else members[:2]
    monitors = start_monitors(survivors)
    try:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
        else:
            leaver, result = members[2]
            leaver.mark_stale(result.round, RestartReason.MEMBER_LEFT, "bye")
        # MemberLeft, not MemberLost: seen from the leaver's own mark, not from its
        # heartbeats stopping (a wall-clock bound here would only measure the machine's load).
        for mon, wake in monitors:
            assert wait_event(mon, wake, 5.0) is RestartReason.MEMBER_LEFT
        if proc is not None:
            assert proc.wait(10) == 0
    finally:
        for mon, _ in monitors:
            mon.stop()
        if proc is not None:
            stop_process(proc)


@pytest.mark.timeout(60)
def test_stop_while_joining_aborts_the_round(backend: Backend) -> None:
    settings = RendezvousSettings(3, 3, last_call=0.1, join_timeout=30)
    run_id = new_run_id()
    stop = threading.Event()
    quitter = make_rdzv(backend, run_id, "quitter", settings)
    waiter = make_rdzv(backend, run_id, "waiter", settings)
    threading.Timer(0.5, stop.set).start()
    out = join_all([quitter], stop=stop)
    assert isinstance(out[0].error, RendezvousInterruptedError)
    # The aborted round is stale: a newcomer goes straight to the next one.
    assert quitter.stale_mark(0) is not None
    late = join_all(
        [
            waiter,
            make_rdzv(backend, run_id, "a", settings),
            make_rdzv(backend, run_id, "b", settings),
        ]
    )
    results = [o.result for o in late if o.result]
    assert_one_group(results, 3)
    assert results[0].round >= 1


@pytest.mark.timeout(60)
def test_joint_round_admits_by_role_and_an_onlooker_reads_it(backend: Backend) -> None:
    """Multi-role jobs (issue 29) on every backend: a Joint round of trainer 1:1 and
    ps 2:2 closes once every role is at its maximum, ordered by role whatever the
    arrival order; ``peek_round`` reads it from another key id without writing."""
    roles = (RoleSize("trainer", 1, 1), RoleSize("ps", 2, 2))
    settings = RendezvousSettings.joint(roles, last_call=30.0, join_timeout=60, liveness=1.5)
    run_id = new_run_id()
    arrivals = [("p0", "ps"), ("t0", "trainer"), ("p1", "ps")]
    rdzvs = [
        Rendezvous(
            backend.connect(), run_id, NodeDescriptor(n, "127.0.0.1", 1, 1, role=r), settings
        )
        for n, r in arrivals
    ]
    outcomes = join_all(rdzvs, stagger=0.05)
    assert [o.error for o in outcomes] == [None] * 3
    results = [o.result for o in outcomes if o.result]
    assert {tuple(n.role for n in r.nodes) for r in results} == {("trainer", "ps", "ps")}
    onlooker = make_rdzv(backend, f"{run_id}.other", "watcher", settings).for_run(run_id)
    peek = onlooker.peek_round(0)
    assert (peek.round, peek.stale, peek.forming) == (results[0].round, False, False)
    assert peek.nodes == results[0].nodes
    assert (
        make_rdzv(backend, run_id, "x", settings).for_run(f"{run_id}.none").peek_round(0).round
        == -1
    )
