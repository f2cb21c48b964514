"""The e2e fault helpers on plain pods: freeze/thaw a whole process tree, cut
and restore a pod's link; each fault silent (the pod stays Running) and
confined to its pod."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.kubelet import faults, records
from e2e.kubelet.records import Proc
from tests.integration.harness import pods
from tests.support import wait_for

pytestmark = pytest.mark.cluster

# A parent that forks a child; both append to their own counter file.
TREE = textwrap.dedent(
    """
    import os, time
    who = "child" if os.fork() == 0 else "parent"
    n = 0
    while True:
        n += 1
        with open(f"/out/{who}", "w") as fh:
            fh.write(str(n))
        time.sleep(0.05)
    """
)

SERVER = textwrap.dedent(
    """
    import socket
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7000)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(b"hi\\n"); c.close()
    """
)


def _state(proc: Proc) -> str:
    st = records.read_stat(proc.pid)
    return st.state if st is not None and st.start == proc.start else "gone"


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def test_freeze_stops_the_whole_tree_and_only_it_thaw_resumes(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pods.apply(
        cluster,
        namespace,
        pods.out_volume(pods.pod("target", TREE), str(tmp_path / "a")),
        pods.out_volume(pods.pod("bystander", TREE), str(tmp_path / "b")),
    )
    for name in ("target", "bystander"):
        pods.wait_phase(cluster, namespace, name, "Running")
    wait_for(lambda: _count(tmp_path / "a" / "child") > 0, 60, "the target's child counting")
    wait_for(lambda: _count(tmp_path / "b" / "child") > 0, 60, "the bystander's child counting")

    frozen = faults.freeze_pod(cluster.layout.pods, namespace, "target")
    # Parent and forked child: the container's main process and what is below it.
    assert len(frozen.procs) == 2
    assert all(_state(p) in ("T", "t") for p in frozen.procs)
    assert faults.is_frozen(frozen)
    bystander = records.pod_tree(pods.record(cluster, namespace, "bystander"))
    assert len(bystander) == 2
    assert all(_state(p) not in ("T", "t", "gone") for p in bystander)
    # Silent: the kubelet sees nothing wrong.
    assert pods.phase(cluster, namespace, "target") == "Running"
    counted = _count(tmp_path / "a" / "child")

    assert faults.thaw(frozen) == 2
    wait_for(
        lambda: _count(tmp_path / "a" / "child") > counted, 30, "the child counting after the thaw"
    )
    assert not any(_state(p) in ("T", "t") for p in frozen.procs)


def test_cut_network_is_silent_and_restore_brings_it_back(cluster: Cluster, namespace: str) -> None:
    pods.apply(cluster, namespace, pods.pod("srv", SERVER))
    pods.wait_phase(cluster, namespace, "srv", "Running")
    got = pods.get(cluster, namespace, "srv")
    assert got is not None
    ip = got["status"]["podIP"]

    def answers() -> bool:
        try:
            with socket.create_connection((ip, 7000), timeout=1) as c:
                return c.recv(10) == b"hi\n"
        except OSError:
            return False

    wait_for(answers, 30, "the server answering from the host side of the bridge")
    record = faults.cut_pod_network(cluster.layout.pods, namespace, "srv")
    try:
        # No refusal, no reset: the connection attempt just goes unanswered.
        with pytest.raises(TimeoutError):
            socket.create_connection((ip, 7000), timeout=1).close()
        assert pods.phase(cluster, namespace, "srv") == "Running"
    finally:
        faults.restore_pod_network(record)
    wait_for(answers, 30, "the server answering after the link came back")


def test_freezing_a_pod_the_kubelet_does_not_run_says_so(cluster: Cluster, namespace: str) -> None:
    with pytest.raises(LookupError, match="no pod"):
        faults.freeze_pod(cluster.layout.pods, namespace, "nobody")
