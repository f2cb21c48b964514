"""In-memory views of the operator's pods, Services and nodes, fed by watch events.

Where it sits: kopf's event handlers (``handlers``) call ``update`` with
each watched object; the reconciler reads one job's slice. This is the
"informer cache" of the operator: possibly stale, which is why
``expectations`` exist. Pure: no API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchflex_contract.labels import Label
from torchflex_operator.model.observed import PodView

JobKey = tuple[str, str]  # (namespace, name)


def job_key_of(obj: Mapping[str, Any]) -> JobKey | None:
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(Label.JOB_NAME)
    if not job:
        return None
    return (str(meta.get("namespace", "")), str(job))


_SEEN_UIDS_KEPT = 4096


class OwnedCache:
    """Pods and Services by owning job (from the job-name label)."""

    def __init__(self) -> None:
        self.pods: dict[JobKey, dict[str, PodView]] = {}
        self.services: dict[JobKey, set[str]] = {}
        self.network_policies: dict[JobKey, set[str]] = {}
        self._seq = 0
        self._touched: dict[JobKey, dict[str, int]] = {}
        """pod name -> sequence number of its latest watch event (see ``merge_listed``)."""
        self._seen_uids: dict[JobKey, dict[str, None]] = {}
        """UIDs the watch has shown per job, newest last (bounded): a pod created
        and deleted again before a pass ran still counts as seen by expectations."""

    def mark(self) -> int:
        """A point in the event stream, taken before a LIST is sent."""
        return self._seq

    def update_pod(self, event: str | None, pod: Mapping[str, Any]) -> JobKey | None:
        key = job_key_of(pod)
        if key is None:
            return None
        view = PodView.from_pod(pod)
        if view.uid:
            seen = self._seen_uids.setdefault(key, {})
            seen[view.uid] = None
            if len(seen) > _SEEN_UIDS_KEPT:
                del seen[next(iter(seen))]
        self._seq += 1
        self._touched.setdefault(key, {})[view.name] = self._seq
        slot = self.pods.setdefault(key, {})
        if event == "DELETED":
            if slot.get(view.name, view).uid == view.uid:
                slot.pop(view.name, None)
        else:
            slot[view.name] = view
        if not slot:
            del self.pods[key]
        return key

    def update_service(self, event: str | None, svc: Mapping[str, Any]) -> JobKey | None:
        return self._update_named(self.services, event, svc)

    def update_network_policy(self, event: str | None, obj: Mapping[str, Any]) -> JobKey | None:
        return self._update_named(self.network_policies, event, obj)

    @staticmethod
    def _update_named(
        by_job: dict[JobKey, set[str]], event: str | None, obj: Mapping[str, Any]
    ) -> JobKey | None:
        key = job_key_of(obj)
        if key is None:
            return None
        name = str((obj.get("metadata") or {}).get("name"))
        names = by_job.setdefault(key, set())
        if event == "DELETED":
            names.discard(name)
        else:
            names.add(name)
        return key

    def seen_uids(self, key: JobKey) -> frozenset[str]:
        return frozenset(self._seen_uids.get(key, {}))

    def job_pods(self, key: JobKey) -> list[PodView]:
        return list(self.pods.get(key, {}).values())

    def job_services(self, key: JobKey) -> frozenset[str]:
        return frozenset(self.services.get(key, set()))

    def job_network_policies(self, key: JobKey) -> frozenset[str]:
        return frozenset(self.network_policies.get(key, set()))

    def merge_listed(self, key: JobKey, pods: Sequence[Mapping[str, Any]], since: int) -> None:
        """Take a fresh LIST of one job's pods, sent after ``mark()`` returned ``since``.

        A pod with a watch event after the mark keeps what the watch said
        (present or deleted): the watch delivers every later change in order,
        so its view is never older for long, while the LIST may be. Every
        other pod is as listed; cached pods the LIST lacks are dropped.
        """
        recent = {n for n, seq in self._touched.get(key, {}).items() if seq > since}
        merged = {n: v for n, v in self.pods.get(key, {}).items() if n in recent}
        for view in map(PodView.from_pod, pods):
            if view.name not in recent:
                merged[view.name] = view
        if merged:
            self.pods[key] = merged
        else:
            self.pods.pop(key, None)

    def jobs_on_node(self, node: str) -> set[JobKey]:
        return {
            k for k, pods in self.pods.items() if any(p.node_name == node for p in pods.values())
        }

    def forget(self, key: JobKey) -> None:
        self.pods.pop(key, None)
        self.services.pop(key, None)
        self.network_policies.pop(key, None)
        self._touched.pop(key, None)
        self._seen_uids.pop(key, None)


class NodeCache:
    """Node name -> Ready, for telling a lost node from a slow one."""

    def __init__(self) -> None:
        self.ready: dict[str, bool] = {}
        self.synced = False

    def update(self, event: str | None, node: Mapping[str, Any]) -> tuple[str, bool]:
        """Record a node event; returns (name, changed readiness or vanished)."""
        name = str((node.get("metadata") or {}).get("name"))
        self.synced = True
        if event == "DELETED":
            return name, self.ready.pop(name, None) is not None
        conditions = (node.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        changed = self.ready.get(name) != ready
        self.ready[name] = ready
        return name, changed
