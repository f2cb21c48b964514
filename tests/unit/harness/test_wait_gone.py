"""``e2e.operator_proc.wait_gone``: a killed process counts as gone once it has
exited, even while its zombie still waits to be reaped.

Where it sits: the e2e scenarios SIGKILL a pod's processes and wait for them
with ``wait_gone`` before timing what follows. The agent's children become
orphans that PID 1 reaps; this machine's init does that only every 1.0-2.0 s,
which used to land inside the e2e recovery figures. Real processes, started
and killed here by PID; nothing is timed.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from e2e.kubelet import records
from e2e.operator_proc import wait_gone


def test_a_zombie_is_gone_a_running_process_is_not() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not wait_gone([proc.pid], timeout_s=0.2)
        proc.send_signal(signal.SIGKILL)
        assert wait_gone([proc.pid], timeout_s=10)
        # Not reaped yet (nobody waited for it): the zombie is still in /proc.
        st = records.read_stat(proc.pid)
        assert st is not None and st.state == "Z"
        assert Path(f"/proc/{proc.pid}").exists()
    finally:
        proc.kill()
        proc.wait(10)
    assert wait_gone([proc.pid], timeout_s=1)
