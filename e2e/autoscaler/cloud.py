"""The test cloud: process-kubelet node groups behind cluster-autoscaler's externalgrpc API.

Where it sits: harness only (tests/e2e/test_autoscaler.py, the autoscaler
benchmark). cluster-autoscaler dials the gRPC bridge built from
e2e/toolchain/autoscaler/testcloud (a process of ours, by PID, on loopback),
which forwards each call as JSON to the HTTP hook served here on loopback;
``groups`` decides the answer, this module acts: an instance is one more
``python -m e2e.kubelet`` process serving one node (its own host address,
pod address block, node-group label and provider ID), started by PID and
stopped by PID, its Node deleted with it. A spot group's node can be
reclaimed the way a node termination handler does it: taint and cordon, evict
every pod through the Eviction API (which adds the DisruptionTarget
condition, and honours PodDisruptionBudgets), delete the Node, stop the node.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.autoscaler.groups import GROUP_LABEL, CloudError, Groups, Instance
from e2e.cluster import processes
from e2e.cluster.controlplane import kubelet_argv, kubelet_env
from e2e.cluster.handle import Cluster
from e2e.cluster.layout import PROCESS_NODE_LABEL
from e2e.kubelet.nodes import CAPACITY
from e2e.localproc import free_port, listening
from e2e.polling import poll_until

BRIDGE = "autoscaler-testcloud"
RECLAIM_TAINT = "torchflex.io/e2e-spot-reclaim"
GPU_LABEL = "torchflex.io/e2e-gpu"
START_TIMEOUT_S = 30.0
EVICT_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 10.0


def bridge_binary(bin_dir: Path) -> Path:
    """The newest test-cloud bridge build.sh made (its name carries its source hash)."""
    builds = sorted(bin_dir.glob(f"{BRIDGE}-*"), key=lambda p: p.stat().st_mtime)
    if not builds:
        raise FileNotFoundError(f"no {BRIDGE} in {bin_dir}: run `make toolchain`")
    return builds[-1]


class TestCloud:
    """Start with :meth:`start`, stop with :meth:`stop` (every node it started too)."""

    __test__ = False  # not a pytest class

    def __init__(self, cluster: Cluster, groups: Groups) -> None:
        self.cluster = cluster
        self.groups = groups
        self.core = client.CoreV1Api(cluster.api_client())
        self.lock = threading.Lock()
        self.grpc_port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.timeline: list[tuple[float, str, str]] = []
        """(monotonic time, what, node): ``requested`` (the autoscaler's IncreaseSize),
        ``started`` (its process runs), ``deleted`` (by the autoscaler), ``reclaimed``."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> TestCloud:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        hook = f"http://127.0.0.1:{self.server.server_address[1]}"
        lay = self.cluster.layout
        argv = [str(bridge_binary(self.cluster.bin_dir)), f"--listen={self.address}"]
        processes.spawn(BRIDGE, [*argv, f"--hook={hook}"], lay.pids, lay.logs)
        up = poll_until(self._bridge_listens, START_TIMEOUT_S, 0.1)
        if not up:
            self.stop()
            raise RuntimeError(
                f"test cloud bridge not listening\n{processes.exit_status_hint(lay.logs, BRIDGE)}"
            )
        return self

    def _bridge_listens(self) -> bool:
        return listening("127.0.0.1", self.grpc_port)

    def stop(self) -> None:
        processes.stop(self.cluster.layout.pids, BRIDGE)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        with self.lock:
            for inst in list(self.groups.instances.values()):
                self.groups.remove(inst.name)
                self._stop_node(inst)

    def cloud_config(self, path: Path) -> Path:
        """The autoscaler's ``--cloud-config``: plain gRPC on loopback (no certificates)."""
        path.write_text(f'address: "{self.address}"\ngrpc_timeout: 10s\n')
        return path

    # -- nodes ----------------------------------------------------------------------------

    def _note(self, what: str, node: str) -> None:
        self.timeline.append((time.monotonic(), what, node))

    def _start_node(self, inst: Instance) -> None:
        lay = self.cluster.layout
        argv = [
            *kubelet_argv(lay, [inst.name]),
            f"--first-host={inst.host}",
            f"--first-pod-ip={inst.first_pod_ip}",
            f"--label={GROUP_LABEL}={inst.group}",
            f"--provider-id={inst.provider_id}",
        ]
        processes.spawn(f"cloud-{inst.name}", argv, lay.pids, lay.logs, env=kubelet_env())
        self._note("started", inst.name)

    def _stop_node(self, inst: Instance) -> None:
        # The process first (it stops its pods' processes), then the Node object.
        processes.stop(self.cluster.layout.pids, f"cloud-{inst.name}")
        with contextlib.suppress(client.ApiException):
            self.core.delete_node(inst.name, _request_timeout=REQUEST_TIMEOUT_S)

    def _list(self, fn: Any, **kwargs: Any) -> list[dict[str, Any]]:
        items = fn(_request_timeout=REQUEST_TIMEOUT_S, **kwargs).items
        out: list[dict[str, Any]] = self.core.api_client.sanitize_for_serialization(items)
        return out

    def registered(self) -> set[str]:
        return {n["metadata"]["name"] for n in self._list(self.core.list_node)}

    def reclaim(self, name: str) -> None:
        """A spot reclaim with notice, as a node termination handler does it."""
        with self.lock:
            inst = self.groups.instances[name]
            if not self.groups.spec(inst.group).spot:
                raise CloudError(f"{name} is not a spot node")
        taint = {"key": RECLAIM_TAINT, "value": "true", "effect": "NoSchedule"}
        self.core.patch_node(
            name,
            {"spec": {"unschedulable": True, "taints": [taint]}},
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        self._note("reclaimed", name)
        evicted = poll_until(lambda: self._evict_all(name), EVICT_TIMEOUT_S, 0.5)
        if not evicted:
            raise TimeoutError(f"pods of {name} not evicted in {EVICT_TIMEOUT_S:.0f}s")
        with self.lock:
            self.groups.remove(name)
        self._stop_node(inst)

    def _evict_all(self, node: str) -> bool:
        """Evict what runs on ``node``; True once nothing but finished pods is left.
        A 429 (a PodDisruptionBudget) is asked again on the next poll."""
        pods = self._list(
            self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        live = [p for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
        for pod in live:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            body: Any = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
            with contextlib.suppress(client.ApiException):
                self.core.create_namespaced_pod_eviction(
                    meta["name"], meta["namespace"], body, _request_timeout=REQUEST_TIMEOUT_S
                )
        return not live

    # -- the externalgrpc calls ------------------------------------------------------------

    def answer(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        with self.lock:
            return self._answer(method, req)

    def _answer(self, method: str, req: Mapping[str, Any]) -> dict[str, Any]:
        g = self.groups
        if method == "NodeGroups":
            return {"nodeGroups": [g.node_group(name) for name in g.specs]}
        if method == "NodeGroupForNode":
            group = g.group_of(req.get("node") or {})
            return {"nodeGroup": g.node_group(group) if group else {"id": ""}}
        if method == "NodeGroupTargetSize":
            return {"targetSize": g.target(str(req["id"]))}
        if method == "NodeGroupIncreaseSize":
            for inst in g.increase(str(req["id"]), int(req["delta"])):
                self._note("requested", inst.name)
                self._start_node(inst)
            return {}
        if method == "NodeGroupDeleteNodes":
            for inst in g.by_provider_ids(str(req["id"]), list(req.get("nodes") or [])):
                g.remove(inst.name)
                self._stop_node(inst)
                self._note("deleted", inst.name)
            return {}
        if method == "NodeGroupDecreaseTargetSize":
            group, delta = str(req["id"]), int(req["delta"])
            for inst in g.not_registered(group, delta, self.registered()):
                g.remove(inst.name)
                self._stop_node(inst)
            return {}
        if method == "NodeGroupNodes":
            return g.instances_answer(str(req["id"]))
        if method == "NodeGroupTemplateNodeInfo":
            return {"nodeInfo": template_node(g.spec(str(req["id"])).name)}
        if method == "GPULabel":
            return {"label": GPU_LABEL}
        if method in ("GetAvailableGPUTypes", "Cleanup", "Refresh"):
            return {}
        raise KeyError(method)


def template_node(group: str) -> dict[str, Any]:
    """What a new node of ``group`` will look like (the autoscaler's scale-up simulation)."""
    node = f"template-{group}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {
                "kubernetes.io/hostname": node,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                PROCESS_NODE_LABEL: "process",
                GROUP_LABEL: group,
            },
        },
        "status": {
            "capacity": CAPACITY,
            "allocatable": CAPACITY,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _handler(cloud: TestCloud) -> type[BaseHTTPRequestHandler]:
    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            method = self.path.strip("/")
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
                code, body = 200, json.dumps(cloud.answer(method, req)).encode()
            except KeyError as exc:
                code, body = 404, f"unknown {exc}".encode()
            except CloudError as exc:
                code, body = 400, str(exc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # quiet: the autoscaler's log says what it asked

    return Hook
