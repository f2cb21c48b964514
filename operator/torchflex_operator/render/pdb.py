"""Voluntary disruptions: the job's PodDisruptionBudget and cluster-autoscaler's pod annotation.

Where it sits: pure, beside ``render.podgroup`` and ``builders``. A drain (``kubectl
drain``, cluster-autoscaler's scale-down, a node termination handler) evicts
through the Eviction API, which honours PodDisruptionBudgets. Each live job
owns one, named like the job, over its worker pods with ``minAvailable:
minReplicas``: an eviction that would leave fewer than ``minReplicas`` Ready
workers is refused (429) and the drain waits, while every worker above the
minimum may go; the job shrinks in place, as it does for any lost worker.
``unhealthyPodEvictionPolicy: AlwaysAllow`` lets a drain take a worker that is
not Ready (starting, or stuck) whatever the budget says: such a pod holds no
training up, and the default would keep a broken pod's node forever. Warm
spares (label ``torchflex.io/standby: "true"``) are left out of the budget:
they are not members, and a drain may take them freely.

cluster-autoscaler keeps any node running a pod of a controller it does not
know (``--skip-nodes-with-custom-controller-pods``, on by default; it knows
ReplicaSet, Job, StatefulSet, ReplicationController), so an ElasticJob's pod
would pin its node even after the job shrank. Workers carry
``safe-to-evict: "true"`` (the budget above still holds the minimum); the
store and etcd pods carry ``"false"``: evicting one ends every worker's
rendezvous, so their node stays until the job ends. A template's own value
wins (``manifests.safe_to_evict``, written by ``builders`` and
``manifests.aux_pod``). The reconciler writes the budget once per
``minReplicas`` (an idle operator sends no request; a budget deleted by hand
comes back when the operator restarts), and deletes it when the job has finished; the
owner reference has the garbage collector delete it with the job. A budget of
that name that the job does not own (a user's) is neither patched nor deleted
(``NotOursError``: the reconciler says so in a Warning Event).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchflex_contract.env import STANDBY_TRUE
from torchflex_contract.labels import Label, PodKind
from torchflex_operator.model.errors import NotOursError
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render.manifests import (
    Manifest,
    object_labels,
    owner_ref,
    role_labels,
    role_object_name,
)

API_VERSION = "policy/v1"
KIND = "PodDisruptionBudget"
# The eviction of a worker that is not Ready is never refused (see the module text).
UNHEALTHY_POLICY = "AlwaysAllow"
# The budget's fields this operator owns; a patch brings exactly these back.
_OWNED = ("minAvailable", "selector", "unhealthyPodEvictionPolicy")


def budget_name(job: JobSpec) -> str:
    """The job's budget is named like the job (``kubectl get pdb <job>``); each role of a
    multi-role job has its own, ``<job>-<role>``."""
    return role_object_name(job)


def pod_disruption_budget(job: JobSpec) -> Manifest:
    """The job's PodDisruptionBudget: at least ``minReplicas`` Ready workers through
    any eviction, owned by the job. For a role view (``JobSpec.role_view``): the role's
    pods and the role's minimum."""
    selector: Manifest = {
        "matchLabels": {
            Label.JOB_NAME.value: job.name,
            Label.ROLE.value: PodKind.WORKER.value,
            **role_labels(job),
        }
    }
    if job.warm_spares:
        # A Ready warm spare is no member: counted, it would let a drain take the
        # members below the minimum. Promoted pods read "false" and count again.
        selector["matchExpressions"] = [
            {"key": Label.STANDBY.value, "operator": "NotIn", "values": [STANDBY_TRUE]}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": budget_name(job),
            "namespace": job.namespace,
            "labels": {**object_labels(job, PodKind.WORKER), **role_labels(job)},
            "ownerReferences": [owner_ref(job)],
        },
        "spec": {
            "minAvailable": job.min_replicas,
            # The workers only (the store and etcd pods are never drained: see above).
            "selector": selector,
            "unhealthyPodEvictionPolicy": UNHEALTHY_POLICY,
        },
    }


def owned(current: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether the object names the job (by UID) among its owners."""
    refs = (current.get("metadata") or {}).get("ownerReferences") or ()
    return any(isinstance(r, Mapping) and r.get("uid") == owner_uid for r in refs)


def spec_patch(want: Mapping[str, Any], current: Mapping[str, Any]) -> Manifest | None:
    """The merge patch that brings an existing budget's owned fields to ``want``'s
    (a ``pod_disruption_budget`` manifest); None when they already match.
    ``NotOursError`` when the existing budget is not the job's."""
    meta = want["metadata"]
    if not owned(current, meta["ownerReferences"][0]["uid"]):
        raise NotOursError(
            f"a PodDisruptionBudget {meta['namespace']}/{meta['name']} exists that this "
            "ElasticJob does not own; the operator leaves it as it is (rename or delete "
            "it for the job to get its own)"
        )
    wanted, have = want.get("spec") or {}, current.get("spec") or {}
    diff = {k: wanted[k] for k in _OWNED if k in wanted and have.get(k) != wanted[k]}
    if not diff:
        return None
    if "selector" in diff:
        # A merge patch would keep a stale matchExpressions beside the new matchLabels.
        diff["selector"] = {"matchExpressions": None, **wanted["selector"]}
    return {"spec": diff}


def needs_write(job: JobSpec, written: int | None, spares_written: bool = False) -> bool:
    """Whether this process must (re)write the job's budget: it has not written one
    yet, or wrote another ``minAvailable`` (``minReplicas`` changed) or selector
    (``spares_written``: the one leaving warm spares out, ``warmSpares`` turned on
    or off). Not on every resync: an idle operator sends no request (a budget deleted
    by hand comes back when ``minReplicas`` changes or the operator restarts)."""
    return written != job.min_replicas or spares_written != bool(job.warm_spares)
