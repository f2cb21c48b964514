"""The per-job NetworkPolicy: a job's pods accept traffic only from that job.

Where it sits: a pure builder next to ``builders``; the planner asks for the
manifest when ``spec.networkPolicy.enabled`` is true (the default) and the
policy is not observed yet, and asks for its deletion when the field is
turned off. The apply layer creates it with the job as controller owner, so
it is garbage-collected with the job.

What the policy says (see docs/operations.md, "Multi-tenant clusters"):

- it selects every pod of the job (workers, store, etcd) by
  ``torchflex.io/job-name``, and restricts ingress only (egress stays open:
  training code downloads data and pushes checkpoints where it likes);
- ingress on any port from the pods of the same job in the same namespace:
  the c10d store, the managed etcd, the workers' own torch store
  (MASTER_ADDR:MASTER_PORT) and NCCL/gloo traffic all stay inside the job;
- ingress on the agents' health port only from the operator, named by
  namespace and pod labels when it runs as a pod (the chart passes both), or
  by CIDR for an operator outside the cluster. An operator running on the
  node itself needs no rule: NetworkPolicy always admits a pod's own node.

A pod in the same namespace can still carry the job's labels and so pass
the first rule: the namespace is the trust boundary, as it is for
Kubernetes itself (whoever may create pods there may create this one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchflex_contract import env, labels
from torchflex_contract.labels import Label
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.manifests import owner_ref

Manifest = dict[str, Any]

API_VERSION = "networking.k8s.io/v1"
KIND = "NetworkPolicy"


def policy_name(job: str) -> str:
    return labels.network_policy_name(job)


def _operator_peers(
    namespace: str | None, pod_labels: Mapping[str, str], cidrs: tuple[str, ...]
) -> list[Manifest]:
    peers: list[Manifest] = []
    if namespace and pod_labels:
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "podSelector": {"matchLabels": dict(pod_labels)},
            }
        )
    peers.extend({"ipBlock": {"cidr": cidr}} for cidr in cidrs)
    return peers


def network_policy(job: JobSpec, settings: Settings) -> Manifest:
    """The job's NetworkPolicy, owned by the job (garbage-collected with it)."""
    own_pods = {"podSelector": {"matchLabels": {Label.JOB_NAME.value: job.name}}}
    ingress: list[Manifest] = [{"from": [own_pods]}]
    peers = _operator_peers(
        settings.operator_namespace, dict(settings.operator_pod_labels), settings.operator_cidrs
    )
    if peers:
        ingress.append(
            {
                "from": peers,
                "ports": [{"protocol": "TCP", "port": env.DEFAULT_HEALTH_PORT}],
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": policy_name(job.name),
            "namespace": job.namespace,
            "labels": {
                Label.JOB_NAME.value: job.name,
                Label.MANAGED_BY.value: labels.MANAGED_BY_VALUE,
            },
            "ownerReferences": [owner_ref(job)],
        },
        "spec": {
            "podSelector": {"matchLabels": {Label.JOB_NAME.value: job.name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
