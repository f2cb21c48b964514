"""``spec.replicas`` made concrete: absent means ``maxReplicas``, written into the job.

(With ``spec.roles``: the scale role's own ``replicas``, else its ``maxReplicas``.)

Where it sits: pure; the reconciler asks ``replicas_patch`` once per pass before
planning and, when it returns a patch, writes it with ``Kube.patch_job`` (guarded
by the resourceVersion it read) the way a mutating webhook would have on create.

Why the operator writes it: the API server's scale subresource
(``GET .../elasticjobs/NAME/scale``, what ``kubectl scale``, HPA and KEDA read)
answers 500 "the spec replicas field does not exist" while ``spec.replicas`` is
absent, and a CRD ``default:`` cannot name another field. The written value
keeps meaning "follow maxReplicas" until someone else sets it: the annotation
records the value we wrote, so a later ``maxReplicas`` edit moves it along,
while any other value (``kubectl scale``, an autoscaler, the user's manifest)
is theirs and the annotation goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchflex_contract.labels import Annotation


def replicas_patch(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that materializes ``spec.replicas``, or None when none is due."""
    spec = job.get("spec") or {}
    maximum = spec.get("maxReplicas")
    if isinstance(spec.get("roles"), list) and spec["roles"]:
        maximum = _scale_role_maximum(spec)
    if not isinstance(maximum, int) or isinstance(maximum, bool):
        return None  # the CRD requires it; an invalid job is reported by the planner
    replicas = spec.get("replicas")
    ours = ((job.get("metadata") or {}).get("annotations") or {}).get(Annotation.REPLICAS_DEFAULTED)
    follows_max = replicas is None or (ours is not None and ours == str(replicas))
    if follows_max:
        if replicas == maximum:
            return None
        return {
            "metadata": {"annotations": {Annotation.REPLICAS_DEFAULTED.value: str(maximum)}},
            "spec": {"replicas": maximum},
        }
    if ours is not None:  # someone else set spec.replicas: it is theirs from now on
        return {"metadata": {"annotations": {Annotation.REPLICAS_DEFAULTED.value: None}}}
    return None


def _scale_role_maximum(spec: Mapping[str, Any]) -> Any:
    """With ``spec.roles``, ``spec.replicas`` is the scale role's (``spec.scaleRole``, else
    the first role): absent, it follows that role's own ``replicas``, else its maximum."""
    name = spec.get("scaleRole")
    roles = [r for r in spec["roles"] if isinstance(r, Mapping)]
    chosen = next((r for r in roles if r.get("name") == name), roles[0] if roles else {})
    return chosen.get("replicas", chosen.get("maxReplicas"))
