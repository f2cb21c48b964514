"""A rank alive but stuck, and a long declared evaluation, with real agents (issue 28).

Three agents on a real c10d store train ``stall_train.py`` (DDP over gloo,
no torchflex call but one ``paused`` in the evaluation case). A rank that
stops taking part leaves every process alive: no socket closes and every
heartbeat goes on. The agents must see the job stop progressing (the fork
server's hooks count optimizer steps and forwards), declare a hang after
``--hang-timeout``, record every rank's stack, name the rank that stopped,
restart the workers once (a counted failure) and train on to the end. An
evaluation of longer than the timeout, declared with ``pulse.paused``, must
not be called a hang.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from e2e import throttle
from e2e.kubelet.records import process_tree
from e2e.localproc import LineLog
from tests.integration.agent.tfagent_helpers import PYTHON, Job
from tests.support import wait_for
from torchflex_agent.loop.node import free_port
from torchflex_agent.rendezvous.logic import NodeDescriptor
from torchflex_agent.rendezvous.node_check import NodeCheckRecords, Pairing
from torchflex_agent.stores.tcp import TCPKVStore
from torchflex_contract.progress import RestartReason
from torchflex_contract.store_keys import Keys

SCRIPT = str(Path(__file__).with_name("stall_train.py"))
TIMEOUT_S = 10
FLAGS = ["--hang-timeout", str(TIMEOUT_S), "--max-restarts", "3"]


def _stall_time(job: Job) -> float:
    """When rank 1 stopped taking part (its agent's log line), waited for up to 120 s."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for log in job.agents:
            hits = log.matching(r"rank 1: stopping to take part")
            if hits:
                return hits[0][0]
        time.sleep(0.2)
    raise AssertionError("rank 1 never stopped: " + job.agents[0].text()[-2000:])


@pytest.mark.timeout(240)
def test_a_rank_that_stops_taking_part_is_named_and_the_job_trains_on(tmp_path: Path) -> None:
    env = {"STALL_AT": "20", "STALL_RANK": "1", "STEPS": "40"}
    with Job(tmp_path, agent_env=env, serve_status=True, pod_names=True) as job:
        job.start_store()
        logs = [job.start_agent([PYTHON, SCRIPT], "3:3", FLAGS) for _ in range(3)]
        t_stall = _stall_time(job)
        # The hang is declared, every worker restarted once, and training resumes.
        resumed = [
            log.wait_for(lambda s: re.search(r"step \d+ world 3 restart 1", s) is not None, 90)[0]
            for log in logs
        ]
        assert max(resumed) - t_stall < TIMEOUT_S + 30, (t_stall, resumed)
        # The live report of the agent that held node rank 0 carries every rank's stack.
        live = [job.status(i).stall for i in range(3)]
        stalls = [st for st in live if st is not None]
        assert len(stalls) == 1, live
        stall = stalls[0]
        assert stall.rank == 1 and stall.pod.startswith("pod-"), stall
        assert stall.timeout == TIMEOUT_S
        assert {r.rank for r in stall.ranks} == {0, 1, 2}, stall
        culprit, *others = stall.ranks
        assert culprit.pod == stall.pod, stall
        assert "stalled_in_user_code" in culprit.stack and not culprit.waiting, culprit
        assert all(o.waiting for o in others), others
        codes = [a.proc.wait(120) for a in job.agents]
        assert codes == [0, 0, 0], [a.text()[-3000:] for a in job.agents]
        reports = [job.termination_report(i) for i in range(3)]
        assert {r.restarts for r in reports} == {1}, reports
        assert {r.last_restart_reason for r in reports} == {RestartReason.HANG}, reports
        # Each agent logged its ranks' whole stacks.
        text = "\n".join(a.text() for a in job.agents)
        assert text.count("hang: rank ") >= 3, text[-4000:]


@pytest.mark.timeout(240)
def test_a_declared_evaluation_longer_than_the_timeout_is_not_a_hang(tmp_path: Path) -> None:
    """Rank 0 evaluates for 2.5 timeouts inside ``paused`` while ranks 1 and 2 wait in a
    barrier, making no progress at all: their agents must see the pause (shared through
    the store) and leave the job alone."""
    env = {"EVAL_AT": "10", "EVAL_SECONDS": str(TIMEOUT_S * 2.5), "STEPS": "20"}
    with Job(tmp_path, agent_env=env) as job:
        job.start_store()
        for _ in range(3):
            job.start_agent([PYTHON, SCRIPT], "3:3", FLAGS)
        codes = [a.proc.wait(180) for a in job.agents]
        text = "\n".join(a.text() for a in job.agents)
        assert codes == [0, 0, 0], text[-4000:]
        assert "rank 0: evaluating" in text
        assert "hang" not in text.lower(), text[-4000:]
        reports = [job.termination_report(i) for i in range(3)]
        assert {r.restarts for r in reports} == {0}, reports
        assert all(r.stall is None for r in reports), reports
        # Every rank trained to the end in the first run.
        assert len(re.findall(r"step 20 world 3 restart 0", text)) == 3, text[-4000:]


@pytest.mark.timeout(240)
def test_the_same_evaluation_undeclared_is_a_hang(tmp_path: Path) -> None:
    """The control: without ``paused`` the waiting ranks' agents do declare the hang (so
    the test above is known to bite), and name rank 0, the one not waiting on peers."""
    env = {"EVAL_AT": "10", "EVAL_SECONDS": str(TIMEOUT_S * 2.5), "STEPS": "20",
           "EVAL_UNDECLARED": "1"}  # fmt: skip
    with Job(tmp_path, agent_env=env, serve_status=True) as job:
        job.start_store()
        for _ in range(3):
            job.start_agent([PYTHON, SCRIPT], "3:3", [*FLAGS[:2], "--max-restarts", "0"])
        codes = [a.proc.wait(180) for a in job.agents]
        text = "\n".join(a.text() for a in job.agents)
        assert 1 in codes, (codes, text[-4000:])
        assert "no training progress for 10 s" in text, text[-4000:]
        stalls = [r.stall for i in range(3) if (r := job.termination_report(i)).stall]
        assert len(stalls) == 1 and stalls[0].rank == 0, stalls


@pytest.mark.timeout(300)
def test_a_frozen_member_and_a_wait_below_the_minimum_are_not_hangs(tmp_path: Path) -> None:
    """One member of a 3:3 job frozen (SIGSTOP of its agent and every process below it)
    for over twice the hang timeout: the fencing path's fault, not a hang. The others
    stop heartbeat-watching it, stop their workers and wait below the minimum, making no
    progress at all for as long: no member may declare a hang or count a restart. Woken,
    the frozen member fences itself, rejoins, and the job trains again at world 3."""
    env = {"STEPS": "100000"}
    with Job(tmp_path, agent_env=env, serve_status=True) as job:
        job.start_store()
        logs = [job.start_agent([PYTHON, SCRIPT], "3:3", FLAGS) for _ in range(3)]
        for log in logs:
            log.wait_for(lambda s: re.search(r"step 5 world 3", s) is not None, 120)
        job.frozen = process_tree(logs[1].proc.pid)
        for pid in job.frozen:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_for(
            lambda: any(
                t >= frozen_at for i in (0, 2) for t, _ in logs[i].matching("stopped heartbeating")
            ),
            30,
            "a survivor seeing the frozen member stop heartbeating",
        )
        time.sleep(TIMEOUT_S * 2.5)
        woke_at = time.monotonic()
        for pid in job.frozen:
            os.kill(pid, signal.SIGCONT)
        job.frozen = []
        logs[1].wait_for(lambda s: "fenced" in s, 30, after=woke_at)
        world3 = re.compile(r"step \d+ world 3")
        for log in logs:
            log.wait_for(lambda s: world3.search(s) is not None, 120, after=woke_at)
        text = "\n".join(a.text() for a in job.agents)
        assert not re.search(r"round \d+: hang", text), text[-4000:]
        assert "no training progress" not in text, text[-4000:]
        reports = [job.status(i) for i in range(3)]
        assert all(r.stall is None for r in reports), reports
        assert {r.restarts for r in reports} == {0}, reports


@pytest.mark.timeout(300)
def test_a_node_under_a_cpu_quota_is_named_a_straggler(tmp_path: Path) -> None:
    """One agent's whole process tree runs under a CPU quota (a cgroup, as a container's
    CPU limit): its workers' forwards take several times the others', and the agent
    holding node rank 0 names that node, with its ratio, in its report."""
    assert throttle.available() is None, throttle.available()
    env = {"WIDTH": "384", "STEP_SLEEP": "0", "STEPS": "100000"}
    with Job(tmp_path, agent_env=env, serve_status=True, pod_names=True) as job:
        job.start_store()
        logs = [job.start_agent([PYTHON, SCRIPT], "3:3", FLAGS) for _ in range(3)]
        for log in logs:
            log.wait_for(lambda s: re.search(r"step 5 world 3", s) is not None, 120)
        reports = [job.status(i) for i in range(3)]
        leader = next(i for i, r in enumerate(reports) if r.node_rank == 0)
        slow = (leader + 1) % 3
        slow_rank = reports[slow].node_rank
        with throttle.throttled(process_tree(logs[slow].proc.pid), cpus=0.1):
            got = job.status_when(leader, lambda r: bool(r.stragglers), 120)
        assert [st.node_rank for st in got.stragglers] == [slow_rank], got.stragglers
        (st,) = got.stragglers
        assert st.pod == f"pod-{slow}" and st.ratio >= 2.0, st
        print(f"STRAGGLER: node rank {slow_rank} forward {st.forward_s:.4f} s, {st.ratio}x")
        text = "\n".join(a.text() for a in job.agents)
        assert "straggler: node rank" in text


def start_good_node(job: Job, flags: list[str]) -> LineLog:
    """An agent whose node check passes. Its matmul is compared with its peer's, timed a
    moment before on this shared 2-core machine: a load burst between the two (6x seen
    beside other tests) can make a good node "too slow" (exit 79). That is the rule
    working (table-tested in ``tests/unit/agent/test_agent_stalls.py``), not what this
    test is about, so such a node is started again, up to 3 times."""
    for _ in range(3):
        log = job.start_agent([PYTHON, SCRIPT], "2:3", flags)
        _, line = log.wait_for(lambda s: "node check passed" in s or "too slow" in s, 120)
        if "node check passed" in line:
            return log
        assert log.proc.wait(60) == 79, log.text()[-2000:]
    raise AssertionError(f"a good node judged too slow 3 times: {log.text()[-2000:]}")


@pytest.mark.timeout(300)
def test_node_check_passes_good_nodes_and_keeps_a_broken_one_out(tmp_path: Path) -> None:
    """``--node-check on``: two agents time their matmul and pass (the first with no peer
    to compare with, the second against it) and train; a third whose interpreter cannot
    run torch (a real Python without it: a broken node image) fails its check, exits 79
    (``BAD_NODE``) naming why, and never joins. The slower-than-peers rule is table-tested
    (``tests/unit/agent/test_agent_stalls.py``): on this shared 2-core machine the peers'
    own figures swing too much with load for a CPU quota to make a stable test of it."""
    broken = tmp_path / "no-torch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(broken)], check=True)
    flags = [*FLAGS, "--node-check", "on"]
    with Job(tmp_path, agent_env={"STEPS": "200"}) as job:
        job.start_store()
        good = []
        for _ in range(2):  # one after the other: two checks at once both see no peer
            good.append(start_good_node(job, flags))
        assert "no peer to compare with yet" in good[0].text(), good[0].text()[-2000:]
        assert "against a median of" in good[1].text(), good[1].text()[-2000:]
        bad_index = len(job.agents)
        bad = job.start_agent([str(broken / "bin" / "python"), SCRIPT], "2:3", flags)
        assert bad.proc.wait(120) == 79, bad.text()[-3000:]
        report = job.termination_report(bad_index)
        assert "node check failed to run" in report.message, report
        assert "No module named 'torch'" in report.message, report
        assert "joining the rendezvous" not in bad.text()
        assert [a.proc.wait(180) for a in good] == [0, 0], [a.text()[-2000:] for a in good]
        assert "step 200 world 2" in good[0].text() + good[1].text()


@pytest.mark.timeout(300)
def test_node_check_pairs_nodes_starting_together_for_a_collective(tmp_path: Path) -> None:
    """``--node-check on``, the peer half: two agents started together both pass their
    compute check, meet in the store's lobby and run a timed gloo all_reduce between
    their addresses (127.0.0.1 here); each logs the collective's bus bandwidth and its
    peer's pod. A third started alone after them (a replacement joining later) waits
    for a peer in vain and passes on its compute half: "no peer checking at the same
    time". All three then train together. The slower-than-peers and wrong-sum rules are
    table-tested (``tests/unit/agent/test_agent_stalls.py``)."""
    flags = [*FLAGS, "--node-check", "on"]
    with Job(tmp_path, agent_env={"STEPS": "100"}, pod_names=True) as job:
        job.start_store()
        pair = [job.start_agent([PYTHON, SCRIPT], "3:3", flags) for _ in range(2)]
        for log in pair:
            log.wait_for(lambda s: "node check passed" in s, 150)
        bandwidth = re.compile(r"all_reduce with (pod-\d): (\d+\.\d+) GB/s bus bandwidth")
        peers = []
        for i, log in enumerate(pair):
            found = bandwidth.search(log.text())
            assert found is not None, log.text()[-3000:]
            assert float(found.group(2)) > 0, found.group(0)
            peers.append(found.group(1))
            print(f"NODE CHECK pod-{i}: {found.group(0)}")
        assert peers == ["pod-1", "pod-0"], peers
        alone = job.start_agent([PYTHON, SCRIPT], "3:3", flags)
        alone.wait_for(lambda s: "node check passed" in s, 150)
        assert "no peer checking at the same time" in alone.text(), alone.text()[-3000:]
        assert "all_reduce with" not in alone.text()
        agents = [*pair, alone]
        assert [a.proc.wait(180) for a in agents] == [0, 0, 0], [a.text()[-2000:] for a in agents]
        assert "step 100 world 3" in "".join(a.text() for a in agents)


@pytest.mark.timeout(300)
def test_node_check_fails_a_node_whose_collective_with_its_peer_fails(tmp_path: Path) -> None:
    """The peer half's fail: this test plays a node that offers itself in the lobby and,
    once claimed, never runs its side (a peer lost right after pairing, or a link that
    drops everything): nothing listens on the port it announced. The agent passes its
    compute half, claims the offer, its all_reduce cannot connect within the limit, and
    it exits 79 (``BAD_NODE``) naming the peer, without ever joining."""
    flags = [*FLAGS, "--node-check", "on"]
    dead_port = free_port()
    with Job(tmp_path, pod_names=True) as job:
        job.start_store()
        store = TCPKVStore("127.0.0.1", job.port)
        ghost = NodeCheckRecords(
            store, Keys(job.run_id), NodeDescriptor("ghost", "127.0.0.1", 0, 1, pod="pod-ghost")
        )
        paired: list[Pairing | None] = []
        waiter = threading.Thread(target=lambda: paired.append(ghost.pair(dead_port, 150.0, 150.0)))
        waiter.start()
        agent = job.start_agent([PYTHON, SCRIPT], "1:1", flags)
        waiter.join(160)
        store.close()
        assert paired == [Pairing(0, "127.0.0.1", dead_port, "pod-0")], agent.text()[-3000:]
        assert agent.proc.wait(150) == 79, agent.text()[-3000:]
        report = job.termination_report(0)
        assert "node check failed: all_reduce with pod-ghost failed" in report.message, report
        print(f"REPORT: {report.message[:400]}")
        assert "joining the rendezvous" not in agent.text()
