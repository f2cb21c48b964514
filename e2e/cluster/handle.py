"""A handle on a running local cluster, for tests, the demo and benchmarks.

Where it sits: returned by ``lifecycle.ensure_up`` and by the pytest
``cluster`` fixture. It only reads ``cluster.json`` and talks to the API
server on loopback (through kubectl or the Python client). The harness
tests stop and start single daemons (the API server, the kubelet) through
it, by the PID and command line ``processes`` recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import processes
from e2e.cluster.controlplane import kubelet_env
from e2e.cluster.layout import (
    KWOK_NODE_ANNOTATION,
    KWOK_TAINT_KEY,
    REPO_ROOT,
    Layout,
)


class Cluster:
    def __init__(self, layout: Layout, info: dict[str, Any]) -> None:
        self.layout = layout
        self.info = info

    @classmethod
    def load(cls, layout: Layout) -> Cluster:
        return cls(layout, json.loads(layout.info.read_text()))

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path) -> Cluster:
        """Attach to a cluster started elsewhere (``make cluster``)."""
        layout = Layout(kubeconfig.resolve().parent)
        return cls.load(layout)

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def process_node(self) -> str:
        return str(self.info["nodes"][0])

    @property
    def process_nodes(self) -> list[str]:
        return [str(n) for n in self.info["nodes"]]

    @property
    def bin_dir(self) -> Path:
        return Path(self.info["bin_dir"])

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = os.pathsep.join(
            [str(self.layout.bin), str(REPO_ROOT / ".venv" / "bin"), env.get("PATH", "")]
        )
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(  # noqa: PLW1510 - the caller decides via check
            ["kubectl", *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out

    def get_json(self, *args: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return data

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig), client_configuration=None)

    def ready(self) -> bool:
        out = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        return out.returncode == 0

    def node_ready(self, name: str) -> bool:
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def wait_nodes_ready(self, names: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(names)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending if not self.node_ready(n)]
            if pending:
                time.sleep(0.5)
        if pending:
            raise TimeoutError(f"nodes not Ready after {timeout_s:.0f}s: {pending}")

    def kwok_nodes(self, count: int, prefix: str = "kwok-node") -> list[str]:
        """Create ``count`` fake nodes managed by kwok (pods run without processes)."""
        names = [f"{prefix}-{i}" for i in range(count)]
        docs = [_kwok_node(n) for n in names]
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        return names

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--wait=false")

    def daemon_alive(self, name: str) -> bool:
        """The daemon recorded as ``name`` still runs (same PID, same command line)."""
        return processes.alive(self.layout.pids, name)

    def daemon_pid(self, name: str) -> int:
        return processes.recorded(self.layout.pids, name)[0]

    def stop_daemon(self, name: str, grace_s: float = 10.0) -> list[str]:
        """SIGTERM (then SIGKILL) one daemon by its recorded PID; returns its
        command line for :meth:`start_daemon`."""
        argv = processes.recorded(self.layout.pids, name)[1]
        processes.stop(self.layout.pids, name, grace_s)
        return argv

    def start_daemon(self, name: str, argv: list[str]) -> int:
        """Start a daemon again with the same command line and record it."""
        return processes.spawn(name, argv, self.layout.pids, self.layout.logs, env=kubelet_env())


def _kwok_node(name: str) -> dict[str, Any]:
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
        },
        "spec": {"taints": [{"key": KWOK_TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]},
        "status": {"allocatable": resources, "capacity": resources},
    }
