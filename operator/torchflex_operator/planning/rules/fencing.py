"""Acting on the group's verdict: silent members and a silent store.

Where it sits: pure rules the planner's steps (``steps.fence``, ``steps.store``) and
``runtime.agent_status`` call with the agents' reports
(``Observed.reports``, ``Observed.unanswered``). The operator does not judge
liveness itself (the process kubelet runs no probes, and a probe only sees
its own pod); the agents do, by heartbeats and presence links, and say so in
their reports:

* ``lost_pods`` / ``lost_round``: a live agent's group declared these pods'
  members lost when round ``lost_round`` went stale. A named pod whose own
  agent does not answer ``GET /status``, or answers from a round no newer
  than ``lost_round``, is fenced (unless this very pod was ever seen
  reporting a newer round: it is a replacement that joined after the loss,
  whatever it says now): deleted with a short grace period (a
  frozen process ignores SIGTERM and dies by the kubelet's SIGKILL when the
  grace ends) and replaced. Its loss is infrastructure, never counted
  against ``backoffLimit``.
* ``store_error``: an agent cannot reach its rendezvous store. Any such
  report makes the ``RendezvousStoreReachable`` condition False; when most
  answering agents report it and errors have lasted longer than a bound
  while the store pod runs, that pod has stopped serving and is replaced.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence

from torchflex_contract.progress import AgentReport
from torchflex_operator.model.observed import PodView


@dataclasses.dataclass(frozen=True)
class LostMember:
    pod: PodView
    round: int
    reporter: str
    silent: bool
    """True: its agent did not answer; False: it answered from a stale round."""

    @property
    def message(self) -> str:
        how = (
            "its agent does not answer /status"
            if self.silent
            else f"its agent still reports round <= {self.round}"
        )
        return (
            f"pod {self.pod.name}'s member was declared lost in rendezvous round "
            f"{self.round} (reported by {self.reporter}) and {how}"
        )


def verdicts(reports: Mapping[str, AgentReport]) -> dict[str, tuple[int, str]]:
    """Pod name -> (newest round it was declared lost in, the reporting pod)."""
    out: dict[str, tuple[int, str]] = {}
    for reporter, report in sorted(reports.items()):
        if report.lost_round < 0:
            continue
        for name in report.lost_pods:
            if name == reporter:
                continue
            known = out.get(name)
            if known is None or report.lost_round > known[0]:
                out[name] = (report.lost_round, reporter)
    return out


def lost_members(
    workers: Sequence[PodView],
    reports: Mapping[str, AgentReport],
    unanswered: frozenset[str],
    first_seen: Mapping[str, dt.datetime],
    rounds_seen: Mapping[str, int] | None = None,
) -> list[LostMember]:
    """Running workers the group declared lost and that did not prove otherwise.

    A verdict names a pod, and pod names are reused: only a pod created
    before the operator first saw the verdict (``first_seen``) can be the
    member it is about. Its replacement, silent while it starts or reporting
    no round yet while it joins, is never taken for it. The operator may see
    a verdict only after it replaced the pod (a killed pod is replaced at
    once, the survivors' reports come with the next poll): a pod that was
    ever seen in a round newer than the loss (``rounds_seen``) joined after
    it and is not the lost member either, even once it falls silent (its
    agent exited at the end of the job, before its pod shows it); nor is one
    whose agent answers that it was never in a round (a replacement joining).
    """
    named = verdicts(reports)
    joined = rounds_seen or {}
    out: list[LostMember] = []
    for pod, (lost_round, reporter) in ((w, named[w.name]) for w in workers if w.name in named):
        seen = first_seen.get(pod.name)
        if not pod.running or seen is None or pod.created is None or pod.created >= seen:
            continue
        if joined.get(pod.name, -1) > lost_round:
            continue
        if pod.name in unanswered:
            out.append(LostMember(pod, lost_round, reporter, silent=True))
            continue
        own = reports.get(pod.name)
        # An agent that reports no round at all (-1) was never a member of one: a
        # replacement still joining (created before the verdict reached us), not the
        # lost member, whose agent keeps the round it last trained in.
        if own is not None and 0 <= own.round <= lost_round:
            out.append(LostMember(pod, lost_round, reporter, silent=False))
        # No answer recorded and not asked: unknown, the poller asks it next.
    return out


def suspects(reports: Mapping[str, AgentReport]) -> frozenset[str]:
    """Pods named lost by some report: the status poller asks these first."""
    return frozenset(
        name for report in reports.values() if report.lost_round >= 0 for name in report.lost_pods
    )


@dataclasses.dataclass(frozen=True)
class StoreHealth:
    reporting: int
    """Active workers with a live report."""
    blind: tuple[tuple[str, str], ...]
    """(pod, store_error) of the agents that cannot reach the store."""

    @property
    def unreachable(self) -> bool:
        return bool(self.blind)

    @property
    def majority_blind(self) -> bool:
        """Most answering agents are blind: the group's verdict on the store itself.

        Not all: an agent that just started (a replacement) has not tried the
        store yet and reports no error; one blind agent of two is as likely
        its own network's problem.
        """
        return 2 * len(self.blind) > self.reporting

    @property
    def message(self) -> str:
        pod, error = self.blind[0]
        return (
            f"{len(self.blind)} of {self.reporting} reporting agent(s) cannot reach the "
            f"rendezvous store ({pod}: {error[-300:]})"
        )


def store_health(workers: Sequence[PodView], reports: Mapping[str, AgentReport]) -> StoreHealth:
    live = [(w.name, reports[w.name]) for w in workers if w.active and w.name in reports]
    blind = tuple((name, r.store_error) for name, r in live if r.store_error)
    return StoreHealth(len(live), blind)
