"""Failure scope ``Job``: when another role's re-form must re-form this role too.

Where it sits: pure decisions for ``loop.roster``, whose thread reads every other
role's newest round (``RoundRecords.peek_round``) each second. For each role named
by ``--job-scoped-roles`` (``failureScope: Job``) it keeps a ``ScopeWatch`` and asks
``judge`` whether that role's rounds ended since the last look for anything but
growth; if one did, the roster ends this agent's own round with
``RestartReason.ROLE_FAILED``, so its role re-forms (not a counted failure: the
failure was the other role's, and counted there).

What counts as the role failing: a round of it ending with a stale mark other than
``MemberJoined`` (a member failed, was lost, left or hung, or the store was lost),
or ending with no mark at all (every member gone at once). Growth alone
(``MemberJoined``) does not: a Job-scoped role that scales up re-forms itself only.
A role seen for the first time is judged from then on: what ended before this
agent looked is history (its own round formed after it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from torchflex_agent.rendezvous.logic import StaleMark
from torchflex_contract.progress import RestartReason

GROWTH: frozenset[RestartReason] = frozenset({RestartReason.MEMBER_JOINED})
"""Stale reasons that end a round without anything failing."""


@dataclasses.dataclass(frozen=True)
class ScopeWatch:
    """What this agent has judged of one Job-scoped role's rounds."""

    current: int
    """The role's newest formed round last seen (-1: none yet)."""
    judged: bool
    """Whether the end of ``current`` was judged already (or is history)."""


@dataclasses.dataclass(frozen=True)
class Ended:
    """A round of the watched role that ended for a failure: this role re-forms."""

    round: int
    reason: str
    """The round's stale reason, or ``gone`` when it ended with no mark."""
    detail: str

    def describe(self, role: str) -> str:
        why = self.reason + (f": {self.detail}" if self.detail else "")
        return f"role {role} (failureScope Job) ended its round {self.round}: {why}"


def first_sight(round_no: int, formed: bool, stale: bool) -> ScopeWatch:
    """The watch of a role first seen with ``round_no`` its newest round (``formed``:
    it has members), ended already (``stale``) or not: an end seen now is history."""
    return ScopeWatch(round_no if formed else -1, stale or not formed)


def to_read(watch: ScopeWatch, round_no: int, formed: bool, stale: bool) -> list[int]:
    """The rounds whose stale marks ``judge`` needs: the round last seen if a newer one
    formed since or it ended, and the newer one if it ended already."""
    if not formed:
        return []
    rounds = []
    if watch.current >= 0 and not watch.judged and (round_no > watch.current or stale):
        rounds.append(watch.current)
    if round_no > watch.current and stale:
        rounds.append(round_no)
    return rounds


def judge(
    watch: ScopeWatch,
    round_no: int,
    formed: bool,
    stale: bool,
    marks: Mapping[int, StaleMark | None],
) -> tuple[ScopeWatch, Ended | None]:
    """The watch after a look at the role's newest round (``round_no``; ``formed``: it
    has members; ``stale``: it ended), and the first of its rounds that ended for a
    failure (None: none did). ``marks`` holds the marks ``to_read`` named (None:
    unmarked: a round superseded without one lost every member at once)."""
    if not formed:
        return watch, None
    ended: Ended | None = None
    for k in to_read(watch, round_no, formed, stale):
        mark = marks.get(k)
        if mark is None:
            if k == round_no:
                continue  # ended, its mark not visible yet: judged on the next look
            ended = ended or Ended(k, "gone", "a newer round formed without a stale mark")
        elif mark.reason not in GROWTH:
            ended = ended or Ended(k, mark.reason.value, mark.detail)
    seen_end = stale and marks.get(round_no) is not None
    if round_no > watch.current:
        return ScopeWatch(round_no, seen_end), ended
    if round_no == watch.current:
        return ScopeWatch(watch.current, watch.judged or seen_end), ended
    return watch, ended
