"""ElasticJob manifests for the example training script on the local cluster.

Where it sits: shared by the e2e scenarios (``tests/e2e/``) and ``make demo``.
The job runs ``examples/train_elastic.py`` on the process node (so real
agents and real torch workers run), with a checkpoint directory every pod
mounts from the host (``hostPath``: on a real cluster this would be a
ReadWriteMany volume). The operator wraps the command in ``torchflex-agent``;
``torchrun=True`` writes the command as a plain ``torchrun`` line instead
(compatibility mode, stock torch recovery).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import Cluster
from e2e.cluster.crds import wait_established
from torchflex_contract import labels

CKPT_MOUNT = "/ckpt"
PROCESS_NODE = "tf-node-0"


@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """The knobs the scenarios turn; everything else is the example's default."""

    name: str
    ckpt_dir: Path
    min_replicas: int = 2
    max_replicas: int = 3
    replicas: int | None = None
    steps: int = 200
    step_time_s: float = 0.1
    ckpt_every: int = 10
    backend: str = "c10d"
    etcd_endpoint: str | None = None
    max_restarts: int = 3
    backoff_limit: int = 4
    min_available_timeout_s: int | None = None
    warm_spares: int = 0
    grace_s: int = 10
    torchrun: bool = False
    script: str = "examples/train_elastic.py"
    extra_env: tuple[tuple[str, str], ...] = ()
    # The process kubelet ignores the image; a real node (e2e.realnode) runs it, with
    # the script at the same relative path in its /workspace.
    image: str = "torchflex-example:local"
    node: str = PROCESS_NODE

    def command(self) -> list[str]:
        train = [
            "python", self.script,
            "--steps", str(self.steps),
            "--step-time", str(self.step_time_s),
            "--ckpt-dir", CKPT_MOUNT,
            "--ckpt-every", str(self.ckpt_every),
        ]  # fmt: skip
        if not self.torchrun:
            return train
        # What a user would write for stock torchrun; the operator only adds env.
        return [
            "torchrun",
            f"--nnodes={self.min_replicas}:{self.max_replicas}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.name}-store.$(TORCHFLEX_NAMESPACE):29400",
            f"--rdzv-id={self.name}",
            f"--max-restarts={self.max_restarts}",
            *train[1:],
        ]

    def manifest(self) -> dict[str, Any]:
        rendezvous: dict[str, Any] = {"backend": self.backend}
        if self.backend == "etcd":
            rendezvous["endpoint"] = self.etcd_endpoint
        spec: dict[str, Any] = {
            "minReplicas": self.min_replicas,
            "maxReplicas": self.max_replicas,
            "nprocPerNode": 1,
            "maxRestarts": self.max_restarts,
            "backoffLimit": self.backoff_limit,
            "cleanPodPolicy": "Running",
            "rendezvous": rendezvous,
            "template": {
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": self.node},
                    "terminationGracePeriodSeconds": self.grace_s,
                    "volumes": [
                        {
                            "name": "ckpt",
                            "hostPath": {"path": str(self.ckpt_dir), "type": "DirectoryOrCreate"},
                        }
                    ],
                    "containers": [
                        {
                            "name": labels.TRAINER_CONTAINER,
                            "image": self.image,
                            "command": self.command(),
                            "env": [{"name": k, "value": v} for k, v in self.extra_env],
                            "volumeMounts": [{"name": "ckpt", "mountPath": CKPT_MOUNT}],
                        }
                    ],
                }
            },
        }
        if self.replicas is not None:
            spec["replicas"] = self.replicas
        if self.min_available_timeout_s is not None:
            spec["minAvailableTimeoutSeconds"] = self.min_available_timeout_s
        if self.warm_spares:
            spec["warmSpares"] = self.warm_spares
        return {
            "apiVersion": labels.API_VERSION,
            "kind": labels.KIND,
            "metadata": {"name": self.name},
            "spec": spec,
        }


def role_entry(name: str, job: TrainingJob) -> dict[str, Any]:
    """One ``spec.roles`` entry running ``job``'s command, with a checkpoint of its own."""
    spec = job.manifest()["spec"]
    template = copy.deepcopy(spec["template"])
    container = template["spec"]["containers"][0]
    container["command"] = [
        f"{CKPT_MOUNT}/{name}" if arg == CKPT_MOUNT else arg for arg in container["command"]
    ]
    entry = {
        "name": name,
        "minReplicas": job.min_replicas,
        "maxReplicas": job.max_replicas,
        "nprocPerNode": 1,
        "template": template,
    }
    if job.replicas is not None:
        entry["replicas"] = job.replicas
    return entry


def roles_manifest(name: str, *roles: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A multi-role ElasticJob: ``roles`` (``role_entry``) instead of the one-group
    fields, plus ``spec`` (coupling, scaleRole, ...)."""
    base = TrainingJob(name, Path("/unused")).manifest()
    for key in ("minReplicas", "maxReplicas", "template", "nprocPerNode"):
        base["spec"].pop(key)
    base["spec"] |= {"roles": list(roles), **spec}
    return base


def apply_crd(cluster: Cluster) -> None:
    crds = Path(__file__).resolve().parents[1] / "crds"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    wait_established(
        lambda argv: cluster.kubectl(*argv, check=False, timeout=30),
        [f"{labels.PLURAL}.{labels.GROUP}"],
    )


def apply(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def get_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return cluster.get_json("elasticjob", name, "-n", namespace)


def worker_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"{labels.Label.JOB_NAME}={name},{labels.Label.ROLE}={labels.PodKind.WORKER.value}"
    out = cluster.get_json("pods", "-n", namespace, "-l", selector)
    items: list[dict[str, Any]] = out["items"]
    return items


def running_workers(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in worker_pods(cluster, namespace, name)
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    )


def job_events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    out = cluster.get_json(
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name},involvedObject.kind={labels.KIND}",
    )
    items: list[dict[str, Any]] = out["items"]
    return items
