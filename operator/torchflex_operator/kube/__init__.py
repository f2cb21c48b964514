"""The one place that talks to the Kubernetes API (besides kopf's own watches): ``Kube``.
May import: ``render``, ``model``, ``torchflex_contract`` and the Kubernetes client."""

# ``runtime`` (reconcile, apply, admission, leader) holds a ``Kube``; nothing else in the
# operator imports the Kubernetes client (an import-linter contract). ``transport.py``:
# the client, the call wrapper and the typed errors; ``scheduling.py``: PodGroups,
# PodDisruptionBudgets and Kueue Workloads; ``calls.py``: the job, pods, Services,
# NetworkPolicies, Events, Leases.

from torchflex_operator.kube.calls import Kube
from torchflex_operator.kube.transport import COMPONENT, load_api_client

__all__ = ["COMPONENT", "Kube", "load_api_client"]
