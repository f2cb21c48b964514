"""What a pod sees of the process kubelet beyond its process: ``kubectl logs``
through the API server, names without a DNS server, and volume mount points
that stay inside the pod.

Where it sits: integration tier on the local control plane (real API server,
real process kubelet); everything through kubectl as a user would.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from tests.integration.harness import pods
from tests.support import wait_for
from torchflex_contract import env
from torchflex_contract.labels import Annotation

pytestmark = pytest.mark.cluster

# Prints three lines, then one more once the test creates /out/go (bounded).
TALKER = textwrap.dedent(
    """
    import os, time
    for i in (1, 2, 3):
        print(f"line-{i}", flush=True)
    for _ in range(600):
        if os.path.exists("/out/go"):
            break
        time.sleep(0.1)
    print("after-go", flush=True)
    """
)


def _read_until(proc: subprocess.Popen[bytes], text: str, timeout_s: float) -> str:
    """What ``proc`` printed until ``text`` appeared (bounded; raw reads, so
    nothing waits in a buffer the selector cannot see)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while text.encode() not in seen and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                seen += chunk
    assert text.encode() in seen, f"kubectl logs -f never printed {text!r}: {seen!r}"
    return seen.decode()


def test_kubectl_logs_and_follow(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    pods.apply(cluster, namespace, pods.out_volume(pods.pod("talker", TALKER), str(tmp_path)))
    pods.wait_phase(cluster, namespace, "talker", "Running")
    wait_for(
        lambda: "line-3" in cluster.kubectl("logs", "talker", "-n", namespace, check=False).stdout,
        30,
        "kubectl logs showing line-3",
    )
    assert cluster.kubectl("logs", "talker", "-n", namespace).stdout == "line-1\nline-2\nline-3\n"
    tail = cluster.kubectl("logs", "talker", "-n", namespace, "--tail=1").stdout
    assert tail == "line-3\n"

    follow = subprocess.Popen(
        ["kubectl", "logs", "-f", "talker", "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=cluster.env,
    )
    try:
        # Connected and caught up before the pod prints its last line.
        _read_until(follow, "line-3", 30)
        (tmp_path / "go").touch()
        _read_until(follow, "after-go", 30)
        # The stream ends with the container, as with a real kubelet.
        assert follow.wait(timeout=30) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(timeout=10)
    pods.wait_phase(cluster, namespace, "talker", "Succeeded")
    # A finished container's log stays readable.
    assert "after-go" in cluster.kubectl("logs", "talker", "-n", namespace).stdout


def test_logs_only_for_the_api_servers_identity(cluster: Cluster) -> None:
    """The endpoint refuses a client certificate that is not the API server's."""
    ip = cluster.get_json("node", cluster.process_nodes[0])["status"]["addresses"][0]["address"]
    pki = cluster.layout.pki
    out = subprocess.run(
        [
            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
            "--cacert", str(pki / "ca.crt"),
            "--cert", str(pki / "admin.crt"), "--key", str(pki / "admin.key"),
            f"https://{ip}:10250/containerLogs/default/x/y",
        ],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.stdout == "403"


# Runs in the pod: a UDP socket on the pod's own 127.0.0.1:53 catches any DNS
# query; then the lookups c10d and ordinary code make.
RESOLVER = textwrap.dedent(
    """
    import json, os, socket
    trap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    trap.bind(("127.0.0.1", 53))
    trap.setblocking(False)
    out = {"resolv": open("/etc/resolv.conf").read()}
    try:
        socket.getaddrinfo("no-such-name.example", 80)
        out["unknown"] = "resolved"
    except socket.gaierror as exc:
        out["unknown"] = exc.errno
    out["self"] = socket.gethostbyname(socket.gethostname())
    # c10d's getnameinfo on a peer address nobody named: numeric, no error.
    out["peer"] = socket.getnameinfo(("10.1.2.3", 80), socket.NI_NUMERICSERV)[0]
    queries = 0
    while True:
        try:
            trap.recvfrom(512)
            queries += 1
        except BlockingIOError:
            break
    out["queries"] = queries
    open("/dev/termination-log", "w").write(json.dumps(out))
    """
)


def test_names_come_from_hosts_and_no_dns_is_tried(cluster: Cluster, namespace: str) -> None:
    pods.apply(cluster, namespace, pods.pod("resolver", RESOLVER))
    pods.wait_phase(cluster, namespace, "resolver", "Succeeded")
    pod = pods.get(cluster, namespace, "resolver")
    assert pod is not None
    result = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert result["queries"] == 0, result
    assert "nameserver" not in result["resolv"]
    assert f"search {namespace}.svc.cluster.local" in result["resolv"]
    assert result["unknown"] == -2, result  # EAI_NONAME, not EAI_AGAIN (-3)
    assert result["self"] == pod["status"]["podIP"]
    assert result["peer"] == "10.1.2.3"


def test_mount_points_stay_inside_the_pod(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    """Volumes at paths the host lacks (a new top-level directory, a new
    directory under an existing one) mount in the pod, and the host
    filesystem gets neither path; workingDir may be such a mount."""
    top = f"/tf-mount-probe-{uuid.uuid4().hex[:8]}"
    nested = tmp_path / "not-on-host" / "deeper"
    code = textwrap.dedent(
        f"""
        import os
        open("here", "w").write("top")
        open("{nested}/file", "w").write("nested")
        print(os.getcwd(), flush=True)
        """
    )
    p = pods.pod("mounter", code)
    p["spec"]["volumes"] = [
        {"name": "top", "emptyDir": {}},
        {"name": "nested", "emptyDir": {}},
    ]
    container = p["spec"]["containers"][0]
    container["workingDir"] = f"{top}/work"
    container["volumeMounts"] = [
        {"name": "top", "mountPath": f"{top}/work"},
        {"name": "nested", "mountPath": str(nested)},
    ]
    pods.apply(cluster, namespace, p)
    pods.wait_phase(cluster, namespace, "mounter", "Succeeded")
    assert cluster.kubectl("logs", "mounter", "-n", namespace).stdout == f"{top}/work\n"
    assert not Path(top).exists()
    assert not (tmp_path / "not-on-host").exists()
    # The writes landed in the pod's emptyDirs.
    pod_dir = next(cluster.layout.pods.glob(f"{namespace}_mounter_*"))
    assert (pod_dir / "volumes" / "top" / "here").read_text() == "top"
    assert (pod_dir / "volumes" / "nested" / "file").read_text() == "nested"


STANDBY = Annotation.STANDBY.value
# Prints the standby file whenever it changes; ends once it reads "false" (bounded).
STANDBY_PRINTER = textwrap.dedent(
    f"""
    import time
    last = None
    for _ in range(600):
        value = open("{env.STANDBY_MOUNT_DIR}/{env.STANDBY_FILE_NAME}").read()
        if value != last:
            print(f"standby={{value}}", flush=True)
            last = value
        if value == "false":
            break
        time.sleep(0.05)
    """
)


def _log(cluster: Cluster, ns: str, name: str) -> str:
    return cluster.kubectl("logs", name, "-n", ns, check=False).stdout


def test_downward_api_file_follows_an_annotation(cluster: Cluster, namespace: str) -> None:
    """As on a real node, a running pod's downwardAPI file changes with its
    annotation (the warm spare's promotion channel, issue 18)."""
    p = pods.pod("spare", STANDBY_PRINTER)
    p["metadata"]["annotations"] = {STANDBY: "true"}
    field = f"metadata.annotations['{STANDBY}']"
    item = {"path": env.STANDBY_FILE_NAME, "fieldRef": {"fieldPath": field}}
    p["spec"]["volumes"] = [{"name": env.STANDBY_VOLUME, "downwardAPI": {"items": [item]}}]
    mount = {"name": env.STANDBY_VOLUME, "mountPath": env.STANDBY_MOUNT_DIR, "readOnly": True}
    p["spec"]["containers"][0]["volumeMounts"] = [mount]
    pods.apply(cluster, namespace, p)
    wait_for(
        lambda: "standby=true" in _log(cluster, namespace, "spare"),
        30,
        "the spare printing its standby file",
    )
    cluster.kubectl("annotate", "--overwrite", "pod", "spare", "-n", namespace, f"{STANDBY}=false")
    pods.wait_phase(cluster, namespace, "spare", "Succeeded")
    assert cluster.kubectl("logs", "spare", "-n", namespace).stdout == (
        "standby=true\nstandby=false\n"
    )
