"""The accounted-pods ledger and the replacement back-off, kept in one place.

Where it sits: between ``planning.context`` and the steps that handle ended pods
(``steps.failed``, ``steps.fence``, ``steps.spares``). ``status.accountedPods``
remembers the UIDs of pods whose end was already handled, so a failure is counted,
reported and backed off once however many passes see the pod; each step asks
``fresh`` which pods are new to it and ``account`` records them. A run of failures
holds replacements back 1, 2, 4, ... s (``back_off``, ``rules.pacing``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from torchflex_operator.model.observed import PodView
from torchflex_operator.model.vocabulary import EventReason, EventType
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import pacing


def accounted(d: Draft) -> tuple[str, ...]:
    """UIDs of the pods whose end this job has already handled."""
    return d.status.accounted_pods or ()


def fresh(d: Draft, pods: Sequence[PodView]) -> list[PodView]:
    """Those of ``pods`` whose end is not handled yet."""
    known = set(accounted(d))
    return [p for p in pods if p.uid not in known]


def account(ctx: Ctx, d: Draft, uids: Iterable[str], *, live_only: bool = False) -> Draft:
    """Record ``uids`` as handled, keeping the newest ``accounted_pods_kept``; with
    ``live_only``, forget UIDs of pods that are gone (the list stays bounded by live pods)."""
    kept = list(accounted(d))
    kept += [u for u in uids if u not in kept]
    if live_only:
        live = {p.uid for p in ctx.obs.pods}
        kept = [u for u in kept if u in live]
    return d.with_status(accounted_pods=tuple(kept[-ctx.settings.accounted_pods_kept :]))


def back_off(ctx: Ctx, d: Draft) -> Draft:
    """Hold replacements back: 1, 2, 4, ... s while failures keep coming (``pacing``)."""
    last = ctx.since(d.status.last_replacement_time)
    streak = d.status.replacement_streak or 0
    streak = streak + 1 if last is not None and last < 2 * ctx.settings.backoff_cap_s else 1
    delay = pacing.backoff_delay(streak, ctx.settings)
    until = ctx.now + dt.timedelta(seconds=delay)
    d = d.with_status(
        replacement_streak=streak,
        last_replacement_time=ctx.stamp,
        backoff_until=until.replace(microsecond=0),
    )
    return d.event(
        EventType.NORMAL,
        EventReason.BACKING_OFF,
        f"replacing failed pods in {delay:.0f}s (replacement streak {streak})",
    )
