"""When a job is done: every member of the final round exited 0.

Where it sits: a pure rule of the planner (``steps.outcome`` asks ``judge``
before anything else once a worker pod has exited 0). The facts come from
the pods themselves: each agent's final report (its termination message)
carries the round it last trained in, the number of nodes in that round and
its node rank, so the operator knows which ranks of the final round are
done whatever pod index held them. torchrun's rule is the same in spirit
(the job ends when every agent has ended); here a pod not yet on a node
does not hold the job open, and one still waiting to join holds it only
until its agent sees the job closed in the store and exits (a polled
report's round never excuses a running pod: reports lag the rendezvous).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from torchflex_contract.progress import AgentReport
from torchflex_operator.model.observed import PodView
from torchflex_operator.planning.rules.failures import succeeded


class Outcome(enum.Enum):
    COMPLETING = "Completing"
    """Some member exited 0; others may still be working (rank 0 saving): wait."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    """Nothing runs any more and a member of the final round never exited 0."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    message: str
    waiting_for: tuple[str, ...] = ()
    """Pods still running that may be members of the final round."""


def _member_report(pod: PodView, reports: Mapping[str, AgentReport]) -> AgentReport | None:
    report = reports.get(pod.name)
    if report is None or report.round < 0 or report.nodes <= 0 or report.node_rank < 0:
        return None
    return report


def _may_be_member(pod: PodView) -> bool:
    """A live worker on a node could still be in the final round.

    Its polled report cannot rule that out: polls lag by seconds, so a report
    of an older round is as likely stale (a member that re-formed since) as it
    is a waiter's. Waiting costs little: a waiter sees the job closed in the
    store and exits within one wait slice. A pod not yet on a node cannot be
    a member.
    """
    return pod.active and bool(pod.node_name)


def judge(workers: Sequence[PodView], reports: Mapping[str, AgentReport]) -> Verdict | None:
    """None while no worker pod has exited 0; else where completion stands."""
    done = [w for w in workers if succeeded(w)]
    if not done:
        return None
    finals = {w.name: r for w in done if (r := _member_report(w, reports)) is not None}
    if not finals:
        # Not run under our agent (no report): torchrun's rule, wait for every pod.
        live = tuple(w.name for w in workers if _may_be_member(w))
        if live:
            return Verdict(
                Outcome.COMPLETING,
                f"worker {done[0].name} exited 0; waiting for {len(live)} running worker "
                f"pod(s) to end: {', '.join(live)}",
                live,
            )
        return Verdict(Outcome.SUCCEEDED, f"worker {done[0].name} exited 0; no worker runs")
    final = max(r.round for r in finals.values())
    nodes = max(r.nodes for r in finals.values() if r.round == final)
    ranks = {r.node_rank for r in finals.values() if r.round == final}
    missing = sorted(set(range(nodes)) - ranks)
    if not missing:
        return Verdict(
            Outcome.SUCCEEDED, f"all {nodes} member(s) of rendezvous round {final} exited 0"
        )
    live = tuple(w.name for w in workers if _may_be_member(w))
    ranks_text = ", ".join(str(r) for r in missing)
    if live:
        return Verdict(
            Outcome.COMPLETING,
            f"{len(ranks)} of {nodes} member(s) of rendezvous round {final} exited 0; "
            f"waiting for node rank(s) {ranks_text} (running: {', '.join(live)})",
            live,
        )
    return Verdict(
        Outcome.FAILED,
        f"{len(ranks)} of {nodes} member(s) of rendezvous round {final} exited 0, but node "
        f"rank(s) {ranks_text} ended without exiting 0 and no worker runs any more",
    )
