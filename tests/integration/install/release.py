"""Helm releases of the chart on the local control plane, for the install tests.

Where it sits: used by ``tests/integration/install/test_*.py``. The operator
pod of a release runs for real under the process kubelet: the Deployment's
command from the project's virtualenv, in its own network namespace, with the
projected ServiceAccount token and in-cluster config, so the API server
enforces the chart's RBAC. Its output is read from the kubelet's pod log files
(``kubectl logs`` is not wired here).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import Cluster
from tests.support import wait_for
from torchflex_contract import env, labels
from torchflex_operator.runtime.leader import LEASE_NOT_RELEASED
from torchflex_operator.runtime.reconcile import RIGHTS_WITHDRAWN

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "torchflex"
INSTANCE = "app.kubernetes.io/instance"
# What a forbidden call looks like in kopf's and the client's logs: a 403 status as a word
# of its own (not digits inside a timestamp, a number, or a UID such as "...-6486025db403":
# that false match made the HA install test flaky), the reason, or kopf's fallback warnings.
FORBIDDEN = re.compile(r"(?<![\w.])403(?!\w)|[Ff]orbidden|Not enough permissions")
STOPPING = "Operator is stopping"
# "<namespace>/<name>" as the operator's messages write an object.
_NS_REF = re.compile(r"(?<=\s)([a-z0-9][-a-z0-9]{0,62})/[a-z0-9]")
# Namespaced kinds a release may create, and cluster-scoped ones.
NAMESPACED_KINDS = (
    "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets"
)
CLUSTER_KINDS = "clusterroles,clusterrolebindings"


def _warning_or_plain(line: str) -> bool:
    """A JSON log line at severity warning; plain lines (``logFormat: plain`` prints the
    message only) carry no level to check."""
    if not line.startswith("{"):
        return True
    try:
        # kopf's JSON format writes the level as "warn".
        return str(json.loads(line).get("severity", "")).lower() in ("warn", "warning")
    except ValueError:
        return False


class Release:
    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = f"tf-{uuid.uuid4().hex[:6]}"
        self.fullname = f"{self.name}-torchflex"
        self.selector = f"{INSTANCE}={self.name},app.kubernetes.io/component=operator"
        self._home = tempfile.TemporaryDirectory(prefix="tf-helm-")
        # Namespaces the test made: a 403 there always counts.
        self.own_namespaces = {namespace}
        self._marks: dict[Path, int] | None = None

    def helm(self, *args: str, values: dict[str, Any] | None = None) -> str:
        extra: list[str] = []
        if values is not None:
            vfile = Path(self._home.name) / f"values-{uuid.uuid4().hex[:6]}.yaml"
            vfile.write_text(yaml.safe_dump(values))
            extra = ["-f", str(vfile)]
        env = dict(self.cluster.env)
        env.update(HOME=self._home.name, HELM_CACHE_HOME=self._home.name)
        env.update(HELM_CONFIG_HOME=self._home.name, HELM_DATA_HOME=self._home.name)
        out = subprocess.run(
            [str(self.cluster.layout.bin / "helm"), *args, "--namespace", self.namespace, *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
            check=False,
        )
        assert out.returncode == 0, f"helm {' '.join(args)}: {out.stderr}"
        return out.stdout

    def install(self, values: dict[str, Any]) -> str:
        return self.helm(
            "install", self.name, str(CHART), "--wait", "--timeout", "120s", values=values
        )

    def upgrade(self, values: dict[str, Any]) -> str:
        return self.helm(
            "upgrade", self.name, str(CHART), "--wait", "--timeout", "120s", values=values
        )

    def uninstall(self) -> None:
        if self._marks is None:
            self.mark()
        self.helm("uninstall", self.name, "--wait", "--timeout", "120s")

    def close(self) -> None:
        """Best-effort cleanup after a failed test (the test itself uninstalls)."""
        listed = self.cluster.kubectl(
            "get", "secret", "-n", self.namespace, "-l", f"name={self.name},owner=helm", check=False
        )
        if self.name in listed.stdout:
            helm = str(self.cluster.layout.bin / "helm")
            subprocess.run(
                [helm, "uninstall", self.name, "-n", self.namespace, "--wait", "--timeout", "60s"],
                env={**self.cluster.env, "HOME": self._home.name},
                capture_output=True,
                timeout=90,
                check=False,
            )
        self._home.cleanup()

    # -- observing the operator -------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.get_json("pods", "-n", self.namespace, "-l", self.selector)
        return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]

    def running_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if p.get("status", {}).get("phase") == "Running"]

    def wait_running(self, count: int, timeout_s: float = 90) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.running_pods()) == count == len(self.pods()), timeout_s,
                 f"{count} running operator pod(s) of {self.name}")  # fmt: skip
        return self.running_pods()

    def log_files(self) -> list[Path]:
        """Operator logs of every pod this release ever ran (its namespace is the test's own)."""
        return sorted(
            self.cluster.layout.pods.glob(f"{self.namespace}_{self.fullname}-*/operator.log")
        )

    def log(self, pod: dict[str, Any]) -> str:
        meta = pod["metadata"]
        path = (
            self.cluster.layout.pods
            / f"{self.namespace}_{meta['name']}_{meta['uid']}"
            / "operator.log"
        )
        return path.read_text(errors="replace") if path.exists() else ""

    def mark(self) -> None:
        """Remember where every log ends now: lines after it belong to the rights-withdrawn
        window (``uninstall`` calls this before helm starts deleting the RBAC)."""
        self._marks = {f: f.stat().st_size for f in self.log_files()}

    def _lines(self, before_mark: bool) -> list[str]:
        files = self.log_files()
        assert files, f"no operator log under {self.cluster.layout.pods}"
        lines: list[str] = []
        for f in files:
            data = f.read_bytes()
            cut = self._marks.get(f, len(data)) if self._marks is not None else len(data)
            part = data[:cut] if before_mark else data[cut:]
            lines += part.decode(errors="replace").splitlines()
        return lines

    def forbidden_lines(self) -> list[str]:
        """Log lines of a denied call during the operator's working life (before ``mark``),
        except creates refused in another test's namespace that is being deleted (the API
        answers 403 "being terminated" there, not RBAC)."""
        lines = [line for line in self._lines(before_mark=True) if FORBIDDEN.search(line)]
        return [line for line in lines if not self._in_dying_namespace(line)]

    def withdrawn_window(self) -> tuple[list[str], list[str]]:
        """After ``mark``: (the operator's rights-withdrawn warnings, every other line of a
        denied call that is not the stopping leader's refused release of its Lease)."""
        warnings: list[str] = []
        other: list[str] = []
        for f in self.log_files():
            stopping = False
            cut = (self._marks or {}).get(f, 0)
            text = f.read_bytes()[cut:].decode(errors="replace")
            for line in text.splitlines():
                stopping = stopping or STOPPING in line
                if RIGHTS_WITHDRAWN in line:
                    (warnings if _warning_or_plain(line) else other).append(line)
                elif FORBIDDEN.search(line) and not (stopping and LEASE_NOT_RELEASED in line):
                    other.append(line)
        return warnings, other

    def _in_dying_namespace(self, line: str) -> bool:
        mentioned = set(_NS_REF.findall(line))
        if not mentioned or mentioned & self.own_namespaces:
            return False
        for ns in mentioned:
            out = self.cluster.kubectl("get", "namespace", ns, "-o", "json", check=False)
            if (
                out.returncode == 0
                and json.loads(out.stdout)["status"].get("phase") != "Terminating"
            ):
                return False
        return True

    def leftovers(self) -> list[str]:
        """Every object still labelled with this release, anywhere."""
        names: list[str] = []
        for kinds, scope in ((NAMESPACED_KINDS, ["-A"]), (CLUSTER_KINDS, [])):
            out = self.cluster.kubectl(
                "get", kinds, *scope, "-l", f"{INSTANCE}={self.name}", "-o", "name"
            )
            names += out.stdout.split()
        return names

    def lease(self) -> dict[str, Any]:
        """The spec of the release's leader-election Lease; {} while there is none."""
        out = self.cluster.kubectl(
            "get", "lease", self.fullname, "-n", self.namespace, "-o", "json", check=False
        )
        return dict(json.loads(out.stdout).get("spec") or {}) if out.returncode == 0 else {}

    def can_i(self, verb: str, resource: str, namespace: str, account: str | None = None) -> bool:
        """``resource`` may name a subresource as ``plural.group/sub``."""
        user = f"system:serviceaccount:{self.namespace}:{account or self.fullname}"
        resource, _, sub = resource.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        out = self.cluster.kubectl(
            "auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", user, check=False
        )
        return out.stdout.strip() == "yes"


# The releases run the operator with ``--agent-command env``: worker pods then run the
# training command as given (``env -- python ...``), so these tests exercise the chart and
# the operator, not the agent (which has its own tests). With an etcd endpoint given, no
# store pod is made; nothing dials it.
TEST_OPERATOR = {"agentCommand": "env"}
# Reads the env the operator injected (a KeyError, and so a failed job, if it did not).
HELLO = f"import os; print('hello from replica', os.environ[{env.REPLICA_INDEX!r}])"


def hello_job(cluster: Cluster, name: str) -> dict[str, Any]:
    """A one-pod ElasticJob whose worker really runs on the process node and exits 0."""
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 1,
            "rendezvous": {"backend": "etcd", "endpoint": "http://127.0.0.1:2379"},
            "template": {
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": cluster.process_node},
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "local",
                            "command": [
                                "python",
                                "-c",
                                HELLO,
                            ],
                        }
                    ],
                }
            },
        },
    }


def apply_job(cluster: Cluster, namespace: str, job: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))


def job_phase(cluster: Cluster, namespace: str, name: str) -> str | None:
    obj = cluster.get_json("elasticjob", name, "-n", namespace)
    phase = obj.get("status", {}).get("phase")
    return str(phase) if phase else None


def job_pods(cluster: Cluster, namespace: str, name: str) -> list[str]:
    out = cluster.kubectl(
        "get", "pods", "-n", namespace, "-o", "json", "-l", f"{labels.Label.JOB_NAME}={name}"
    )
    return [p["metadata"]["name"] for p in json.loads(out.stdout)["items"]]


def wait_succeeded(cluster: Cluster, namespace: str, name: str, timeout_s: float = 90) -> None:
    wait_for(lambda: job_phase(cluster, namespace, name) == "Succeeded", timeout_s,
             f"ElasticJob {namespace}/{name} Succeeded")  # fmt: skip
