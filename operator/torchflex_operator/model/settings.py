"""Operator-wide tunables (from CLI flags), shared by planner and builders.

Where it sits: built once by ``cli`` (or a test) and passed down; pure data.
"""

from __future__ import annotations

import dataclasses

from torchflex_operator.model.vocabulary import GangScheduling


@dataclasses.dataclass(frozen=True)
class Settings:
    agent_command: str = "torchflex-agent"
    """Entrypoint the trainer command is wrapped with (must be on the image's PATH)."""
    etcd_image: str = "quay.io/coreos/etcd:v3.6.5"
    etcd_command: str = "etcd"
    node_loss_toleration_s: int = 30
    """tolerationSeconds injected for not-ready/unreachable taints (template wins)."""
    force_delete_after_s: float = 30.0
    """Extra wait after a pod's grace period before force-deleting it from a lost node."""
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    resync_s: float = 300.0
    """Slow resync: a full pass per live job this often even without events. It reads
    only the watch-fed caches, so an idle job costs no API request."""
    accounted_pods_kept: int = 64
    """How many handled failed-pod UIDs status remembers (must exceed maxReplicas' churn)."""
    create_batch_initial: int = 16
    """Worker pods the first pass may create; later passes add as many as have a node."""
    max_unscheduled: int = 64
    """Worker pods that may wait for a node at once (``pacing``)."""
    fence_grace_s: int = 5
    """Grace period when deleting a pod the group declared lost, or a silent store pod."""
    store_replace_after_s: float = 20.0
    """Store errors reported this long, by most answering agents now: the store pod is replaced."""
    completion_silence_s: float = 60.0
    """A completing job's awaited pod whose agent does not answer this long is fenced."""
    progress_write_s: float = 5.0
    """A status change that is only training progress is written at most this often."""
    refusal_retry_s: float = 10.0
    """After the API refused a create with a 403 (admission), wait this long to retry."""
    queue_poll_s: float = 10.0
    """A queued job (``render.workload``) re-reads its Workload at least this often: admission and
    eviction are seen even where the Workload watch could not start (Kueue installed
    after the operator)."""
    operator_namespace: str | None = None
    """Where the operator's own pods run (``--operator-pod-namespace``): with
    ``operator_pod_labels`` it names the operator in each job's NetworkPolicy."""
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    operator_cidrs: tuple[str, ...] = ()
    """Source ranges of an operator outside the cluster, admitted to the agents' health port."""
    gang_scheduling: GangScheduling | None = None
    """Not a flag: what the reconciler found the API serves (``render.podgroup``); None until
    it asked.
    ``ENABLED`` links worker pods to their job's PodGroup."""
