"""Workers die with their agent: ``PR_SET_PDEATHSIG`` on a real SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from e2e.localproc import stop_process
from tests.integration.agent.tfagent_helpers import stand_in_agent

# A stand-in agent: launches one worker (`sleep 60`) through WorkerGroup,
# prints its pid, then waits to be killed.
FAKE_AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
    from torchflex_agent.workers.group import LaunchContext, WorkerGroup
    result = RendezvousResult(0, 0, (NodeDescriptor("n", "127.0.0.1", 1, 1),))
    ctx = LaunchContext("r", 0, 0, 1, Path(sys.argv[1]))
    group = WorkerGroup(["sleep", "60"], result, ctx, {"PATH": "/usr/bin:/bin"})
    group.start()
    print(group.pids[0], flush=True)
    time.sleep(60)
    """
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(60)
def test_worker_dies_when_agent_is_sigkilled(tmp_path: Path) -> None:
    agent = stand_in_agent(FAKE_AGENT, tmp_path)
    worker = 0
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        assert alive(worker)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        deadline = time.monotonic() + 2.0
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(worker), "worker outlived its SIGKILLed agent"
    finally:
        stop_process(agent)
        if worker and alive(worker):
            # Only reached if the assertion above failed: clean up our own child's child.
            subprocess.run(["kill", "-9", str(worker)], check=False)
