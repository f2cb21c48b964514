"""The process kubelet survives what real kubelets survive (issue 12 item 8).

On the real control plane: a container exits while the API server is
stopped (by its PID) and started again; the kubelet process is restarted;
a pod recreated at the address of a deleted one is reachable from a peer
that still had the old pod's MAC.
"""

from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.kubelet import records
from tests.integration.harness import pods
from tests.support import wait_for

pytestmark = pytest.mark.cluster

SLEEP = "import time\nfor _ in range(6000): time.sleep(0.1)"
QUIT_ON_FILE = textwrap.dedent(
    """
    import os, time
    while not os.path.exists("/out/go"):
        time.sleep(0.05)
    """
)


def test_container_exit_while_api_server_is_down_keeps_every_pod(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    pods.apply(
        cluster,
        namespace,
        pods.pod("keeper", SLEEP),
        pods.out_volume(pods.pod("quitter", QUIT_ON_FILE), str(tmp_path)),
    )
    pods.wait_phase(cluster, namespace, "keeper", "Running")
    pods.wait_phase(cluster, namespace, "quitter", "Running")
    keeper = pods.record(cluster, namespace, "keeper").containers["main"]
    kubelet_pid = cluster.daemon_pid("kubelet")

    argv = cluster.stop_daemon("kube-apiserver")
    try:
        (tmp_path / "go").touch()
        # The kubelet saw the exit (it rewrites its record before it reports
        # the status, which fails now: connection refused).
        wait_for(
            lambda: not records.find(cluster.layout.pods, namespace, "quitter").containers,
            30,
            "the kubelet recording the quitter's exit",
        )
    finally:
        cluster.start_daemon("kube-apiserver", argv)
        wait_for(cluster.ready, 90, "API server ready again", interval_s=0.5)

    # The status that could not be sent during the outage lands afterwards ...
    pods.wait_phase(cluster, namespace, "quitter", "Succeeded")
    # ... and the kubelet, with every other pod, lived through it.
    assert cluster.daemon_alive("kubelet") and cluster.daemon_pid("kubelet") == kubelet_pid
    assert records.is_alive(keeper), "the other pod's process was killed"
    assert pods.phase(cluster, namespace, "keeper") == "Running"


def _lease_renewed_after(cluster: Cluster, when: dt.datetime) -> bool:
    lease = cluster.get_json("lease", cluster.process_node, "-n", "kube-node-lease")
    renew = dt.datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))
    return renew > when


def test_kubelet_restart_takes_over_its_lease_and_reports_lost_containers(
    cluster: Cluster, namespace: str
) -> None:
    pods.apply(
        cluster,
        namespace,
        pods.pod("always", SLEEP, restart="Always"),
        pods.pod("never", SLEEP),
    )
    pods.wait_phase(cluster, namespace, "always", "Running")
    pods.wait_phase(cluster, namespace, "never", "Running")

    argv = cluster.stop_daemon("kubelet")
    stopped = dt.datetime.now(dt.UTC)
    cluster.start_daemon("kubelet", argv)

    # The new process renews the Lease the old one held ...
    wait_for(lambda: _lease_renewed_after(cluster, stopped), 60, "the Lease renewed after restart")
    # ... restarts the Always pod's container (its processes died with the
    # old kubelet), reports the Never pod's container lost ...
    wait_for(
        lambda: (
            (p := pods.get(cluster, namespace, "always")) is not None
            and p["status"].get("phase") == "Running"
            and p["status"]["containerStatuses"][0]["restartCount"] == 1
            and "running" in p["status"]["containerStatuses"][0]["state"]
        ),
        60,
        "the Always pod running again with one restart",
    )
    always = pods.get(cluster, namespace, "always")
    assert always is not None
    last = always["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (137, "ContainerStatusUnknown")
    pods.wait_phase(cluster, namespace, "never", "Failed")
    never = pods.get(cluster, namespace, "never")
    assert never is not None
    term = never["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "ContainerStatusUnknown")
    # ... runs new pods, and keeps running with the node Ready.
    pods.apply(cluster, namespace, pods.pod("fresh", "print('hello')"))
    pods.wait_phase(cluster, namespace, "fresh", "Succeeded")
    assert cluster.daemon_alive("kubelet")
    assert cluster.node_ready(cluster.process_node)


SERVER = textwrap.dedent(
    """
    import os, socket
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 7000)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(os.environ["POD_UID"].encode() + b"\\n"); c.close()
    """
)

# Connects again and again, as a training peer re-dialling its store would:
# every answer (the server pod's UID) or error goes to the log.
PEER = textwrap.dedent(
    """
    import socket, sys, time
    while True:
        try:
            with socket.create_connection((sys.argv[1], 7000), timeout=1) as c:
                print("ok", c.recv(100).decode().strip(), flush=True)
        except OSError as exc:
            print("error", exc, flush=True)
        time.sleep(0.2)
    """
)


def _only_pods_of(cluster: Cluster, namespace: str) -> bool:
    """The process node runs no pod of another namespace (earlier tests' pods
    still terminating would free lower addresses at any moment)."""
    out = cluster.get_json(
        "pods", "-A", "--field-selector", f"spec.nodeName={cluster.process_node}"
    )
    return all(p["metadata"]["namespace"] == namespace for p in out["items"])


def test_recreated_pod_at_the_same_address_announces_its_mac(
    cluster: Cluster, namespace: str
) -> None:
    # The kubelet gives a new pod the lowest free address: with nothing else
    # on the node, the recreated server gets the deleted one's address.
    wait_for(lambda: _only_pods_of(cluster, namespace), 120, "the node free of other tests' pods")
    pods.apply(cluster, namespace, pods.pod("srv", SERVER))
    pods.wait_phase(cluster, namespace, "srv", "Running")
    first = pods.get(cluster, namespace, "srv")
    assert first is not None
    ip, old_uid = first["status"]["podIP"], first["metadata"]["uid"]
    old_mac = pods.mac_of(pods.record(cluster, namespace, "srv").netns)
    pods.apply(cluster, namespace, pods.pod("peer", PEER, ip))
    peer = pods.record(cluster, namespace, "peer")
    peer_log = cluster.layout.pods / f"{namespace}_peer_{peer.uid}" / "main.log"
    wait_for(lambda: old_uid in peer_log.read_text(), 60, "the peer talking to the first server")
    assert pods.neighbour_mac(peer.netns, ip) == old_mac

    cluster.kubectl("delete", "pod", "srv", "-n", namespace, "--grace-period=0", "--force")
    wait_for(lambda: pods.get(cluster, namespace, "srv") is None, 30, "the first server gone")
    pods.apply(cluster, namespace, pods.pod("srv", SERVER))
    pods.wait_phase(cluster, namespace, "srv", "Running")
    second = pods.get(cluster, namespace, "srv")
    assert second is not None
    new_uid = second["metadata"]["uid"]
    assert second["status"]["podIP"] == ip, "precondition: the kubelet reused the address"
    new_mac = pods.mac_of(pods.record(cluster, namespace, "srv").netns)
    assert new_mac != old_mac

    # The peer learnt the new MAC from the announcement, not from its own
    # ARP timeouts (it had confirmed the old entry moments ago) ...
    assert pods.neighbour_mac(peer.netns, ip) == new_mac
    # ... so its next connection reaches the new pod.
    wait_for(lambda: new_uid in peer_log.read_text(), 30, "the peer talking to the new server")
