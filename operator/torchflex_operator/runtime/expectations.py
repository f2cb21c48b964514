"""Expectations: what this operator did that its watch cache has not shown yet.

Where it sits: the apply layer records every pod create and delete here; the
reconciler overlays them on the cached pods before planning, so a pass that
runs before the watch event arrives still sees the pod it just created (and
never creates it twice) or the pod it just deleted as terminating (and a
spare it just promoted as a member). An
expectation ends when the cache catches up, or after a timeout (the cache
may have missed an event; then the API's 409/404 keep us safe). Keyed by
the job's ``JobKey`` (namespace, name), as the cache and work queue are. Pure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from torchflex_operator.model.observed import PodView
from torchflex_operator.runtime.cache import JobKey

TIMEOUT = dt.timedelta(seconds=60)


@dataclasses.dataclass
class _JobExpectations:
    created: dict[str, tuple[PodView, dt.datetime]] = dataclasses.field(default_factory=dict)
    """pod name -> (synthetic pending view, when)"""
    deleted: dict[str, tuple[bool, dt.datetime]] = dataclasses.field(default_factory=dict)
    """pod uid -> (forced, when)"""
    promoted: dict[str, dt.datetime] = dataclasses.field(default_factory=dict)
    """pod uid -> when its standby annotation was patched to false (``planning.steps.spares``)"""


class Expectations:
    def __init__(self) -> None:
        self._jobs: dict[JobKey, _JobExpectations] = {}

    def expect_created(self, job: JobKey, view: PodView, now: dt.datetime) -> None:
        self._jobs.setdefault(job, _JobExpectations()).created[view.name] = (view, now)

    def expect_deleted(self, job: JobKey, uid: str, now: dt.datetime, *, forced: bool) -> None:
        self._jobs.setdefault(job, _JobExpectations()).deleted[uid] = (forced, now)

    def expect_promoted(self, job: JobKey, uid: str, now: dt.datetime) -> None:
        self._jobs.setdefault(job, _JobExpectations()).promoted[uid] = now

    def forget(self, job: JobKey) -> None:
        self._jobs.pop(job, None)

    def pending(self, job: JobKey) -> int:
        exp = self._jobs.get(job)
        return 0 if exp is None else len(exp.created) + len(exp.deleted) + len(exp.promoted)

    def overlay(
        self,
        job: JobKey,
        cached: list[PodView],
        now: dt.datetime,
        seen_uids: frozenset[str] = frozenset(),
    ) -> list[PodView]:
        """Cached pods corrected by unmet expectations; drops met or expired ones.

        ``seen_uids``: every pod UID the watch has shown for the job. A created
        pod the watch already showed is met even if it is gone again (deleted
        before this pass): re-adding it would hide the loss until the timeout.
        """
        exp = self._jobs.get(job)
        if exp is None:
            return cached
        by_name = {p.name: p for p in cached}
        by_uid = {p.uid: p for p in cached}
        out = list(cached)
        for name, (view, when) in list(exp.created.items()):
            seen = by_name.get(name)
            if (
                (seen is not None and (not view.uid or seen.uid == view.uid))
                or (view.uid and view.uid in seen_uids)
                or now - when > TIMEOUT
            ):
                del exp.created[name]
            elif seen is None:
                out.append(view)
        for uid, (forced, when) in list(exp.deleted.items()):
            seen = by_uid.get(uid)
            met = seen is None or (seen.terminating and not forced)
            if met or now - when > TIMEOUT:
                del exp.deleted[uid]
            elif seen is not None and not seen.terminating:
                out = [dataclasses.replace(p, deletion=now) if p.uid == uid else p for p in out]
        for uid, when in list(exp.promoted.items()):
            # A pass before the watch shows the patch must not promote the pod again.
            seen = by_uid.get(uid)
            if seen is None or not seen.standby or now - when > TIMEOUT:
                del exp.promoted[uid]
            else:
                out = [dataclasses.replace(p, standby=False) if p.uid == uid else p for p in out]
        if not exp.created and not exp.deleted and not exp.promoted:
            del self._jobs[job]
        return out
