"""Rolling a changed job spec through the workers, one running pod at a time.

Where it sits: a pure rule of the planner's ``steps.rolling``. Every
worker pod carries the hash of the spec it was built from
(``render.builders.template_hash``); a pod with another hash is out of date.
Pending out-of-date pods go at once (they hold no training state); running
ones one at a time, highest index first, and only once the previous
replacement runs: every membership change costs the group one
re-rendezvous anyway, and a broken new template then takes out one worker,
not the job. Elastic jobs keep training on the others meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchflex_operator.model.observed import PodView
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.render import builders


def outdated(pod: PodView, current: str) -> bool:
    """Built from an older spec (pods without the annotation are left alone)."""
    return pod.spec_hash is not None and pod.spec_hash != current


def step(
    job: JobSpec, workers: Sequence[PodView], *, busy: bool, backing_off: bool
) -> tuple[list[PodView], int]:
    """Pods to delete now, and how many running ones stay on the old spec after.

    ``busy``: this pass already deletes workers (scale-down, failures);
    ``backing_off``: replacements are being held back. Either pauses the
    running pods' roll; pending ones still go.
    """
    current = builders.template_hash(job)
    active = [w for w in workers if w.active]
    old = [w for w in active if outdated(w, current)]
    pending = [w for w in old if not w.running]
    running = [w for w in old if w.running]
    steady = (
        not busy
        and not backing_off
        and not pending
        and len(active) >= job.desired
        and not any(w.terminating and not w.finished for w in workers)
        and all(w.running for w in active if not outdated(w, current))
    )
    if not steady or not running:
        return pending, len(running)
    victim = max(running, key=lambda w: w.index or 0)
    return [victim], len(running) - 1
