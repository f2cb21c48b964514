"""How many worker pods one pass may create: growing batches, a cap on Pending.

Where it sits: a pure rule of the planner's ``steps.scaling.scale`` (and
``steps.spares.keep``). Like the Job
controller's slow start, creation grows with evidence that pods start: a
pass may add at most ``max(create_batch_initial, scheduled)`` pods beyond
those still waiting for a node, so batches go initial, initial, 2x, 4x, ...
as each one is scheduled; and never more than ``max_unscheduled`` worker
pods sit unscheduled at once, whatever ``maxReplicas`` says (10,000 pods on
a one-node cluster is 10,000 objects for the API server and etcd and no
training). A pod counts as scheduled once it has a node.

A gang (``render.podgroup``) changes the evidence: the scheduler places none of a
job's pods until ``minReplicas`` of them exist, so ``at_once`` (the gang's
minimum) raises both the batch and the cap to it; without that, a job of
``minReplicas`` above the batch or the cap would wait for itself forever.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchflex_operator.model.observed import PodView
from torchflex_operator.model.settings import Settings


@dataclasses.dataclass(frozen=True)
class Budget:
    allowed: int
    """Pods this pass may create (before ``missing`` and free indices)."""
    unscheduled: int
    scheduled: int
    capped: bool
    """The cap on unscheduled pods is what holds creation back."""


def budget(workers: Sequence[PodView], settings: Settings, at_once: int = 0) -> Budget:
    active = [w for w in workers if w.active]
    unscheduled = sum(1 for w in active if not w.node_name)
    scheduled = len(active) - unscheduled
    window = max(settings.create_batch_initial, scheduled, at_once)
    cap = max(settings.max_unscheduled, at_once)
    allowed = max(0, min(window, cap) - unscheduled)
    return Budget(allowed, unscheduled, scheduled, capped=unscheduled >= cap)


def backoff_delay(streak: int, settings: Settings) -> float:
    """Replacement delay after ``streak`` consecutive replacement rounds (1, 2, 4, ... cap)."""
    if streak <= 0:
        return 0.0
    return float(min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** (streak - 1)))
