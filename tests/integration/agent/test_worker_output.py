"""A worker's output reaches the agent's, each line prefixed with the worker's rank.

Where it sits: beside ``test_worker_lifetime.py`` (the other ``WorkerGroup``
test with a stand-in agent). A worker kept across a membership change
(``WorkerGroup.adopt``, the state API's in-place path) may get another rank
in the new round: its lines from then on must carry that rank, or a reader
of the pod's log attributes them to another worker. A real process and real
pipes; the stand-in agent is the only thing not the product.

A stopped group's last lines must reach the agent's output before ``stop``
returns: the agent prints the next round's header after it, and a reader of
the pod's log (the e2e checks, a user) orders rounds by that header. A slow
sink (a loaded node, a slow log disk) stands in for a starved copier thread.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from e2e.localproc import stop_process
from tests.integration.agent.tfagent_helpers import stand_in_agent

# The stand-in agent: one node of two, node rank 1 (worker rank 1); once the
# worker said "before", it is kept for a round that makes this node rank 0.
# The worker prints "after" when the file `go` exists.
FAKE_AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
    from torchflex_agent.workers.group import LaunchContext, WorkerGroup
    folder = Path(sys.argv[1])
    a, b = NodeDescriptor("a", "127.0.0.1", 1, 1), NodeDescriptor("b", "127.0.0.1", 1, 1)
    ctx, env = LaunchContext("r", 0, 0, 1, folder), {"PATH": "/usr/bin:/bin"}
    script = f"echo before; while [ ! -e {folder}/go ]; do sleep 0.01; done; echo after"
    group = WorkerGroup(["sh", "-c", script], RendezvousResult(0, 1, (a, b)), ctx, env)
    group.start()
    time.sleep(0.5)  # "before" is read under the first round's rank
    envs = group.adopt(RendezvousResult(1, 0, (b,)), ctx, env)
    print(f"adopted as rank {envs[0]['RANK']}", flush=True)
    (folder / "go").touch()
    group.wait(10)
    time.sleep(0.2)  # the pump thread writes the last line
    """
)


@pytest.mark.timeout(60)
def test_a_kept_workers_lines_carry_its_new_rank(tmp_path: Path) -> None:
    agent = stand_in_agent(FAKE_AGENT, tmp_path)
    try:
        out, _ = agent.communicate(timeout=30)
    finally:
        stop_process(agent)
    assert agent.returncode == 0, out
    assert out.splitlines() == ["[rank 1] before", "adopted as rank 0", "[rank 0] after"]


# The stand-in agent: its stdout takes 0.2 s per write; the worker prints ten lines
# and exits; "stopped" is printed once stop() returns.
SLOW_SINK_AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
    from torchflex_agent.workers.group import LaunchContext, WorkerGroup

    class Slow:
        def __init__(self, raw):
            self.raw = raw
        def write(self, data):
            time.sleep(0.2)
            return self.raw.write(data)
        def flush(self):
            self.raw.flush()

    class Out:
        buffer = Slow(sys.stdout.buffer)

    folder = Path(sys.argv[1])
    a = NodeDescriptor("a", "127.0.0.1", 1, 1)
    ctx, env = LaunchContext("r", 0, 0, 1, folder), {"PATH": "/usr/bin:/bin"}
    script = "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done"
    real = sys.stdout
    sys.stdout = Out()
    group = WorkerGroup(["sh", "-c", script], RendezvousResult(0, 0, (a,)), ctx, env)
    group.start()
    group.wait(10)
    group.stop(1.0)
    sys.stdout = real
    print("stopped", flush=True)
    """
)


@pytest.mark.timeout(60)
def test_a_stopped_groups_last_lines_come_before_stop_returns(tmp_path: Path) -> None:
    agent = stand_in_agent(SLOW_SINK_AGENT, tmp_path)
    try:
        out, _ = agent.communicate(timeout=30)
    finally:
        stop_process(agent)
    assert agent.returncode == 0, out
    assert out.splitlines() == [*(f"[rank 0] line {i}" for i in range(1, 11)), "stopped"]
