"""The agent as PID 1 (``torchflex_agent.pid1``): orphans reaped, signals forwarded, exit code kept.

In a container the agent is PID 1 of the pod's PID namespace. Here a real
PID namespace (``unshare --pid --fork --mount-proc``, the harness's own
process tree) plays the container: the code under test forks, stays PID 1 as
the init and the script goes on as the agent, which sends a SIGTERM to PID 1
at once (while PID 1 may still be installing its handlers), orphans a
grandchild, has a SIGTERM sent to PID 1 again and exits; ``unshare`` returns PID 1's status.
``tests/realnode/test_elasticjob.py`` checks the same in the agent image.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import os, signal, sys, time
from torchflex_agent import pid1
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))  # the agent's
pid1.become_init_if_pid1()
assert (os.getpid(), os.getppid()) == (2, 1), (os.getpid(), os.getppid())
# At once, while PID 1 may still be installing its handlers: blocked, never dropped.
os.kill(1, signal.SIGTERM)
if os.fork() == 0:  # a child that leaves a grandchild behind: the orphan
    if os.fork() == 0:
        time.sleep(0.3)
        os._exit(0)
    os._exit(0)
os.wait()

def processes():
    # (pid, state) of every process in the namespace
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue  # gone meanwhile
        found.append((pid, stat.rsplit(")", 1)[1].split()[0]))
    return sorted(found)

for _ in range(100):  # bounded: 10 s for the orphan to exit and be reaped
    time.sleep(0.1)
    if [pid for pid, _ in processes()] == ["1", "2"]:
        break
print("zombies", [pid for pid, state in processes() if state == "Z"], flush=True)
print("processes", [pid for pid, _ in processes()], flush=True)
os.kill(1, signal.SIGTERM)  # as the kubelet signals the container's PID 1
for _ in range(100):
    if len(got) == 2:
        break
    time.sleep(0.1)
print("forwarded", got, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize(("how", "code"), [("0", 0), ("7", 7), ("kill", 128 + 9)])
def test_as_pid1_the_agent_runs_under_an_init_that_reaps_forwards_and_keeps_its_exit_code(
    how: str, code: int
) -> None:
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", SCRIPT, how],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == code, out.stdout + out.stderr
    # Only PID 1 (the init) and PID 2 (the agent) are left: the orphan was reaped.
    assert "zombies []\nprocesses ['1', '2']\n" in out.stdout, out.stdout + out.stderr
    assert f"forwarded [{15}, {15}]" in out.stdout, out.stdout + out.stderr


def test_not_pid1_nothing_happens() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import os; from torchflex_agent import pid1; "
         "pid1.become_init_if_pid1(); print(os.getpid() != 1)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "True"
