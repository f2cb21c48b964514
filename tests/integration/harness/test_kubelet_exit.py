"""A pod's processes end with its containers, and their peers see the close.

Where it sits: harness tier, the process kubelet on the real control plane. A
real runtime reports a container's exit only once every process of its PID
namespace is gone, so their sockets were closed (FIN sent) while the pod's
network still existed. The process kubelet has no PID namespace: a process
of the pod in a session of its own (as the agent's workers are) used to
outlive the container, and the pod's veth went first, leaving its peers on a
half-open connection (seen as the state API's survivors waiting on a
SIGKILLed pod's worker for gloo's whole timeout).
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.kubelet import records
from tests.integration.harness import pods
from tests.support import wait_for

pytestmark = pytest.mark.cluster

SERVER = textwrap.dedent(
    """
    import socket
    s = socket.socket()
    s.bind(("0.0.0.0", 7000))
    s.listen()
    open("/out/listening", "w").close()
    conn, _ = s.accept()
    got = conn.recv(1)  # blocks until the peer closes (b"") or sends
    open("/out/closed" if got == b"" else "/out/data", "w").close()
    """
)
# The main process leaves a child behind, in its own session, holding a connection.
LEAVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = (
        "import os, socket, sys, time\\n"
        "c = socket.create_connection((sys.argv[1], 7000))\\n"
        "open('/out/child', 'w').write(str(os.getpid()))\\n"
        "time.sleep(600)\\n"
    )
    subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], start_new_session=True)
    while not os.path.exists("/out/child"):
        time.sleep(0.05)
    """
)


def _kill_if_ours(pid_file: Path) -> None:
    """The left-behind child, if it still runs (only that very process: its command
    line holds the pod's script)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        if b"/out/child" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)


def test_a_containers_leftover_process_ends_with_it_and_its_peer_sees_the_close(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    server_out, leaver_out = tmp_path / "server", tmp_path / "leaver"
    server_out.mkdir()
    leaver_out.mkdir()
    pods.apply(cluster, namespace, pods.out_volume(pods.pod("server", SERVER), str(server_out)))
    wait_for((server_out / "listening").exists, 60, "the server listening")

    def server_ip() -> str:
        return str(
            ((pods.get(cluster, namespace, "server") or {}).get("status") or {}).get("podIP", "")
        )

    wait_for(server_ip, 30, "the server's address")
    leaver = pods.out_volume(pods.pod("leaver", LEAVER, server_ip()), str(leaver_out))
    pods.apply(cluster, namespace, leaver)
    try:
        pods.wait_phase(cluster, namespace, "leaver", "Succeeded")
        child = int((leaver_out / "child").read_text())
        wait_for((server_out / "closed").exists, 30, "the server seeing the close")
        assert not (server_out / "data").exists()
        st = records.read_stat(child)  # gone, or a zombie its new parent did not reap yet
        assert st is None or st.state in ("Z", "X"), "the leaver's child outlived its pod"
    finally:
        _kill_if_ours(leaver_out / "child")
