"""Apply a pass's decisions through ``kube``: the ``Plan``, then the PodGroup and budget
writes (``planning.scheduling``), and the Events the status carries.

Where it sits: called by the ``Reconciler`` (``runtime.reconcile``) after ``plan``.
Status first (serialised once and patched only where it differs from what the API
holds; it carries the failure bookkeeping, guarded by resourceVersion), then the
NetworkPolicy (a job's store never listens unprotected), Services, pod creates,
promotions and deletes, then Events: a pass cut short leaves them pending in the
status for the next one. A refused create is remembered (``runtime.memory``) for the
next pass to plan from; what was created or deleted is expected (``expectations``)
until the watch shows it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from torchflex_contract import labels
from torchflex_operator.kube import Kube
from torchflex_operator.model.errors import (
    AccessDeniedError,
    ConflictError,
    NotOursError,
    PermanentError,
    RefusedError,
    RetryableError,
)
from torchflex_operator.model.observed import PodView, Refusal
from torchflex_operator.model.plan import Plan
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import EventReason, EventType
from torchflex_operator.planning.rules import events
from torchflex_operator.planning.scheduling import Scheduling, Written
from torchflex_operator.render import pdb
from torchflex_operator.runtime.cache import JobKey
from torchflex_operator.runtime.expectations import Expectations
from torchflex_operator.runtime.memory import JobMemory
from torchflex_operator.runtime.metrics import Metrics

log = logging.getLogger(__name__)


class Applier:
    def __init__(
        self,
        kube: Kube,
        memory: JobMemory,
        expectations: Expectations,
        metrics: Metrics,
        rights_refused: Callable[[JobKey, AccessDeniedError], None],
    ) -> None:
        self.kube = kube
        self.memory = memory
        self.expectations = expectations
        self.metrics = metrics
        self.rights_refused = rights_refused

    async def pod_group(self, key: JobKey, job: JobSpec, manifest: Mapping[str, Any]) -> None:
        """Create the job's PodGroup (before its pods: a pod naming a group that is not
        there waits) or bring its ``minCount`` to a changed ``minReplicas``."""
        await self.kube.apply_pod_group(manifest)
        record = self.memory.record(key)
        written = record.written.get(job.role, Written())
        record.written[job.role] = dataclasses.replace(written, gang=job.min_replicas)

    async def budget(
        self,
        key: JobKey,
        obj: Mapping[str, Any],
        job: JobSpec,
        writes: Scheduling,
        now: dt.datetime,
    ) -> None:
        """Write the job's PodDisruptionBudget, or delete a finished job's. A budget the
        API refuses, or one of that name the job does not own, is said in a Warning
        Event and the pass goes on: the job runs without it (tried again each pass)."""
        record = self.memory.record(key)
        written = record.written.get(job.role, Written())
        try:
            if writes.delete_budget:
                await self.kube.delete_disruption_budget(
                    job.namespace, pdb.budget_name(job), job.uid
                )
                record.written[job.role] = dataclasses.replace(
                    written, budget=None, budget_deleted=True
                )
            elif writes.budget is not None:
                await self.kube.apply_disruption_budget(writes.budget)
                record.written[job.role] = dataclasses.replace(
                    written,
                    budget=job.min_replicas,
                    budget_spares=bool(job.warm_spares),
                    budget_deleted=False,
                )
                record.budget_refused = ""
        except (NotOursError, RefusedError, AccessDeniedError) as exc:
            message = f"PodDisruptionBudget {pdb.budget_name(job)} not written: {exc}"
            log.warning("%s/%s: %s", *key, message)
            if record.budget_refused != message and await self.event(
                obj, EventType.WARNING, EventReason.BUDGET_NOT_APPLIED, message, now
            ):
                record.budget_refused = message

    async def apply(
        self, key: JobKey, obj: Mapping[str, Any], result: Plan, now: dt.datetime
    ) -> None:
        namespace, name = key
        status = JobStatus() if result.status is None else result.status
        # Serialised once, written once, and only when it differs from what the API holds.
        patch = {} if result.status is None else status.to_patch(obj.get("status") or {})
        if patch:
            rv = str(obj["metadata"].get("resourceVersion", ""))
            try:
                fresh = await self.kube.patch_job_status(namespace, name, rv, patch)
            except ConflictError:
                self.memory.synced.discard(key)  # planned from a stale job: re-read, re-plan
                raise
            self.memory.objects[key] = fresh
        # The policy first: a job's store never listens unprotected.
        for policy in result.create_network_policies:
            await self.kube.create_network_policy(policy)
        for policy_name in result.delete_network_policies:
            await self.kube.delete_network_policy(namespace, policy_name)
        refused = self.memory.record(key).refusals
        await self._create(key, result, refused, now)
        for spare in result.promote_pods:  # before creates' errors can cut the pass short
            await self.kube.set_pod_metadata(
                namespace,
                spare.name,
                spare.uid,
                new_labels={labels.Label.STANDBY.value: "false"},
                new_annotations={labels.Annotation.STANDBY.value: "false"},
            )
            self.expectations.expect_promoted(key, spare.uid, now)
        for reason in result.replacements:
            self.metrics.pods_replaced.labels(reason.value).inc()
        for victim in result.delete_pods:
            if await self.kube.delete_pod(
                namespace, victim.name, victim.uid, force=victim.force, grace_s=victim.grace_s
            ):
                self.metrics.pods_deleted.labels("force" if victim.force else "graceful").inc()
            self.expectations.expect_deleted(key, victim.uid, now, forced=victim.force)
        # Events go out after the status write that carries them (events.py): a
        # pass cut short here leaves them pending in the status for the next one.
        posted = self.memory.record(key).posted
        for event in events.due(status, frozenset(posted)):
            if await self.event(obj, event.type, event.reason, event.message, now):
                posted.add(event.id)
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
        posted &= {e.id for e in status.pending_events or ()}
        if result.delete_job:
            await self.kube.delete_job(namespace, name, str(obj["metadata"].get("uid", "")))

    async def _create(
        self, key: JobKey, result: Plan, refused: dict[str, Refusal], now: dt.datetime
    ) -> None:
        """Services, then pods; a refused create is remembered, not raised."""
        for svc in result.create_services:
            try:
                await self.kube.create_service(svc)
            except RefusedError as exc:
                refused[svc["metadata"]["name"]] = _refused("Service", svc, exc, now)
                continue
            refused.pop(svc["metadata"]["name"], None)
        for manifest in result.create_pods:
            try:
                uid = await self.kube.create_pod(manifest)
            except RefusedError as exc:
                # Not this pass's failure: the next pass makes it a condition, an
                # Event, and fails the job if the refusal cannot go away.
                refused[manifest["metadata"]["name"]] = _refused("Pod", manifest, exc, now)
                continue
            refused.pop(manifest["metadata"]["name"], None)
            view = PodView.from_pod(
                {**manifest, "metadata": {**manifest["metadata"], "uid": uid or ""}}
            )
            self.expectations.expect_created(key, view, now)
            if uid is not None:
                role = manifest["metadata"]["labels"][labels.Label.ROLE]
                self.metrics.pods_created.labels(role).inc()

    async def event(
        self, obj: Mapping[str, Any], etype: str, reason: str, message: str, now: dt.datetime
    ) -> bool:
        """Post one Event; False when it should be tried again (it stays pending)."""
        try:
            await self.kube.post_event(obj, etype, reason, message, now)
        except AccessDeniedError as exc:
            meta = obj.get("metadata") or {}
            self.rights_refused((meta.get("namespace", ""), meta.get("name", "")), exc)
            return False
        except RetryableError as exc:
            log.warning("could not post event %s (kept for the next pass): %s", reason, exc)
            return False
        except PermanentError as exc:  # the API will never take this one: drop it
            log.warning("could not post event %s: %s", reason, exc)
        return True


def _refused(
    kind: str, manifest: Mapping[str, Any], exc: RefusedError, now: dt.datetime
) -> Refusal:
    log.warning("%s: %s", exc, exc.server_message)
    return Refusal(kind, manifest["metadata"]["name"], exc.code, exc.server_message, now)
