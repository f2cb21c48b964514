"""The step that rolls a changed job spec through the members, one running pod at a time.

Where it sits: a pure step ``(Ctx, Draft) -> Draft`` of the planner's pipeline, after
scaling; which pods go is ``rules.rollout.step``'s rule.
"""

from __future__ import annotations

from torchflex_operator.model.vocabulary import EventReason, EventType
from torchflex_operator.planning.context import Ctx, Draft
from torchflex_operator.planning.rules import rollout


def roll(ctx: Ctx, d: Draft) -> Draft:
    """Replace members built from an older spec (see ``rules.rollout.step``)."""
    until = d.status.backoff_until
    victims, left = rollout.step(
        ctx.job,
        d.members,
        busy=bool(d.delete_pods),  # scale-down or failures in this very pass
        backing_off=until is not None and until > ctx.now,
    )
    for pod in victims:
        d = d.delete(pod)
    if victims:
        d = d.event(
            EventType.NORMAL,
            EventReason.ROLLING_UPDATE,
            f"job spec changed: replacing {', '.join(w.name for w in victims)}; "
            f"{left} running worker(s) left on the old spec",
        )
    return d
