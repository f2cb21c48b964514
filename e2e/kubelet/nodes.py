"""Node registration and heartbeats for the process kubelet's nodes.

Where it sits: ``agent.Kubelet.run`` registers every node once and runs
:meth:`NodeHeartbeat.loop` in a thread: the node Lease is renewed and the
Ready condition refreshed often enough that the node-lifecycle controller
never marks a live node NotReady. Nodes carry no kwok annotation, so kwok
leaves them alone. The Lease is renewed by read-modify-write with the
resourceVersion just read (the API server refuses an unconditional update
of a Lease), so a restarted kubelet takes over the Lease its previous
process left. :class:`Placement` says where one kubelet process's nodes
and pods sit when several run side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import threading
from typing import Any

from kubernetes import client

from e2e.kubelet.logserver import KUBELET_PORT
from e2e.toolchain.versions import KUBERNETES_VERSION

LEASE_NS = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_EVERY_S = 5.0
REQUEST_TIMEOUT_S = 5.0
CAPACITY = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one kubelet process's nodes and pods sit among the others' (``__main__``)."""

    first_host: int = 1
    first_pod_ip: int = 2
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    provider_id: str = ""


def _micro_now() -> str:
    now = dt.datetime.now(dt.UTC)
    # The client turns a timestamp string into a datetime and back: a zero
    # microsecond part would lose its digits, which a MicroTime refuses.
    return now.replace(microsecond=max(now.microsecond, 1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeHeartbeat:
    def __init__(
        self,
        api: client.ApiClient,
        nodes: dict[str, str],
        stop: threading.Event,
        label: str,
        *,
        extra_labels: dict[str, str] | None = None,
        provider_id: str = "",
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.nodes, self.stop, self.label = nodes, stop, label
        self.extra_labels, self.provider_id = extra_labels or {}, provider_id

    def node_status(self, ip: str, name: str) -> dict[str, Any]:
        now = _now()

        def cond(kind: str, status: str, reason: str) -> dict[str, Any]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": "process kubelet",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }

        return {
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name},
            ],
            # Where the API server sends kubectl logs (logserver, on the InternalIP).
            "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
            "capacity": CAPACITY,
            "allocatable": CAPACITY,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                cond("Ready", "True", "KubeletReady"),
            ],
            "nodeInfo": {
                "kubeletVersion": KUBERNETES_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "process://torchflex-e2e",
                "osImage": "torchflex process kubelet",
                "kernelVersion": "",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        }

    def register(self) -> None:
        for name, ip in self.nodes.items():
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        self.label: "process",
                        **self.extra_labels,
                    },
                },
            }
            if self.provider_id:  # a test-cloud node: the autoscaler matches it by this
                body["spec"] = {"providerID": self.provider_id}
            with contextlib.suppress(client.ApiException):
                self.core.create_node(body)  # type: ignore[arg-type]
            self.beat(name, ip)

    def beat(self, name: str, ip: str) -> None:
        # Existing conditions keep their transition time (strategic merge by type).
        self.core.patch_node_status(
            name, {"status": self.node_status(ip, name)}, _request_timeout=REQUEST_TIMEOUT_S
        )
        self.renew_lease(name)

    def renew_lease(self, name: str) -> None:
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_SECONDS,
            "renewTime": _micro_now(),
        }
        try:
            raw: Any = self.coord.read_namespaced_lease(
                name, LEASE_NS, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": LEASE_NS},
                "spec": spec,
            }
            self.coord.create_namespaced_lease(
                LEASE_NS,
                lease,  # type: ignore[arg-type]
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            return
        current: dict[str, Any] = json.loads(raw.data)
        current["spec"] = {**(current.get("spec") or {}), **spec}
        # Carries metadata.resourceVersion: a concurrent writer gets a 409
        # and the next beat reads again.
        self.coord.replace_namespaced_lease(
            name,
            LEASE_NS,
            current,  # type: ignore[arg-type]
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    def loop(self) -> None:
        while not self.stop.wait(RENEW_EVERY_S):
            for name, ip in self.nodes.items():
                with contextlib.suppress(Exception):
                    self.beat(name, ip)
