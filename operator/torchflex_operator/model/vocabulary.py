"""The closed vocabulary of ElasticJob status: phases, condition types and
reasons, and Kubernetes Event reasons.

Where it sits: the planner writes only these values; docs/api.md documents
them; nothing else in the operator spells a phase, condition or reason as a
bare string. tests/unit/test_vocabulary.py holds all three to that: every
word used, documented, and spelled out nowhere else in product code.
"""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """``status.phase``: one word for where the job is."""

    PENDING = "Pending"
    """Started, fewer than ``minReplicas`` workers running yet."""
    RUNNING = "Running"
    """At least ``minReplicas`` worker pods running (not: training; see ``TRAINING``)."""
    RESTARTING = "Restarting"
    """Was running, fell below ``minReplicas``; waiting for replacements."""
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(enum.StrEnum):
    """``status.conditions[].type``."""

    MIN_AVAILABLE = "MinAvailable"
    """True while at least ``minReplicas`` workers are running."""
    TRAINING = "Training"
    """True while the agents report a completed rendezvous with workers running
    (since: its ``lastTransitionTime``); False says what they do instead."""
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    COMPLETE = "Complete"
    """batch/v1 Job's word for success (``kubectl wait --for=condition=Complete``):
    set with ``Succeeded``, the same reason and message."""
    FAILED = "Failed"
    AT_DESIRED_SIZE = "AtDesiredSize"
    """True while ``desiredReplicas`` workers run; False says why not (see docs/api.md)."""
    STORE_REACHABLE = "RendezvousStoreReachable"
    """False while agents report that they cannot reach the rendezvous store."""
    CHILDREN_ACCEPTED = "ChildrenAccepted"
    """False while the API server refuses a pod or Service the job needs."""


class Reason(enum.StrEnum):
    """``status.conditions[].reason`` and ``status.lastFailure.reason``."""

    # MinAvailable
    MIN_REPLICAS_RUNNING = "MinReplicasRunning"
    BELOW_MIN_REPLICAS = "BelowMinReplicas"
    # MinAvailable, AtDesiredSize and Training once no pod runs on purpose
    JOB_FINISHED = "JobFinished"
    """The job succeeded or failed: nothing runs any more."""
    # Training
    WORKERS_TRAINING = "WorkersTraining"
    AGENTS_STARTING = "AgentsStarting"
    """Worker pods run, but no agent has completed a rendezvous yet (importing, joining)."""
    RENDEZVOUSING = "Rendezvousing"
    """The latest round is over; agents are forming the next one (a scale, a lost member)."""
    WORKERS_RESTARTING = "WorkersRestarting"
    """A worker failed: the agents stop the group and restart it in place."""
    NO_WORKERS_RUNNING = "NoWorkersRunning"
    # Suspended (and MinAvailable, AtDesiredSize, Training while suspended)
    SUSPENDED_BY_USER = "SuspendedByUser"
    RESUMED = "Resumed"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    """Queued in Kueue (``render.workload``): no pods until its Workload is admitted."""
    EVICTED_BY_KUEUE = "EvictedByKueue"
    """Kueue evicted or preempted its Workload: pods stopped gracefully, checkpoint kept."""
    # Succeeded
    WORKER_GROUP_SUCCEEDED = "WorkerGroupSucceeded"
    # Failed
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    MIN_AVAILABLE_TIMEOUT = "MinAvailableTimeout"
    FINAL_ROUND_INCOMPLETE = "FinalRoundIncomplete"
    """A member of the final round exited 0, another ended without exiting 0."""
    COMPLETION_HANG = "CompletionHang"
    """As ``FinalRoundIncomplete``, because a member's workers were still in the script
    past the agent's completion grace after another member finished (``hungWorkers``)."""
    BAD_COMMAND = "BadCommand"
    """The training command cannot be started (agent exit 127): retrying cannot help."""
    CHILD_REJECTED = "ChildRejected"
    """The API server rejected a pod or Service as invalid (400/422): it cannot go away."""
    # AtDesiredSize
    DESIRED_SIZE_RUNNING = "DesiredSizeRunning"
    STARTING = "Starting"
    SCALING_UP = "ScalingUp"
    PENDING_CAP_REACHED = "PendingCapReached"
    BACKING_OFF = "BackingOff"
    COMPLETING = "Completing"
    # RendezvousStoreReachable
    STORE_REACHABLE = "StoreReachable"
    STORE_UNREACHABLE = "StoreUnreachable"
    # ChildrenAccepted (and AtDesiredSize while a create is refused)
    ACCEPTED = "Accepted"
    CREATE_REFUSED = "CreateRefused"
    # lastFailure.reason: why a worker pod ended (see failures.py)
    USER_ERROR = "UserError"
    INFRA_ERROR = "InfraError"
    OOM_KILLED = "OOMKilled"
    PREEMPTED = "Preempted"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    POD_DELETED = "PodDeleted"
    """Deleted (by the operator, a user or a controller) without platform evidence."""
    MEMBER_LOST = "MemberLost"
    """Fenced: the group declared the pod's member lost and its agent went silent."""
    BAD_NODE = "BadNode"
    """Its agent's node check failed (a wrong or far too slow matmul) before it joined:
    not counted; its node is avoided and the pod replaced elsewhere."""
    HANG = "Hang"
    """No training progress anywhere for the hang timeout: the agents recorded every
    rank's stack and restarted the workers (the pod and rank name the one that stopped)."""


class EventReason(enum.StrEnum):
    """``reason`` of the Kubernetes Events the operator posts on the job."""

    CREATED_POD = "CreatedPod"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    ROLLING_UPDATE = "RollingUpdate"
    REPLACED_POD = "ReplacedPod"
    POD_FAILED = "PodFailed"
    PREEMPTED = "Preempted"
    NODE_LOST = "NodeLost"
    FORCE_DELETED = "ForceDeletedPod"
    BACKING_OFF = "BackingOff"
    STORE_CREATED = "StoreCreated"
    RENDEZVOUS_HOST_LOST = "RendezvousHostLost"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    ADMITTED = "Admitted"
    EVICTED_BY_KUEUE = "EvictedByKueue"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TTL_EXPIRED = "TTLExpired"
    COMPLETING = "Completing"
    FENCED_POD = "FencedPod"
    WORKER_HUNG = "WorkerHung"
    """A worker would not exit (teardown or completion hang): its agent ended it and
    reported its stack (``status.hungWorkers``; Warning)."""
    STRAGGLER_DETECTED = "StragglerDetected"
    """A member's workers are much slower than the others' (``status.stragglers``; Warning)."""
    STRAGGLER_REPLACED = "StragglerReplaced"
    """``stragglerPolicy: Replace`` deleted a straggler's pod and keeps the job off its node
    (``status.avoidedNodes``; Warning)."""
    HANG_DETECTED = "HangDetected"
    """The job made no progress for the hang timeout: the rank that stopped is named and
    every rank's stack is in ``status.lastFailure`` (Warning)."""
    STORE_UNREACHABLE = "StoreUnreachable"
    STORE_REACHABLE = "StoreReachable"
    REPLACING_STORE = "ReplacingStore"
    CREATE_REFUSED = "CreateRefused"
    PENDING_CAP_REACHED = "PendingCapReached"
    INVALID_SPEC = "InvalidSpec"
    """The spec passed the CRD schema but not ``JobSpec.parse`` (Warning; no pass runs)."""
    BUDGET_NOT_APPLIED = "DisruptionBudgetNotApplied"
    """The job's PodDisruptionBudget could not be written (Warning; the job runs without it)."""
    SPARE_PROMOTED = "SparePromoted"
    """A warm spare became a member: its standby annotation was set to false
    (``planning.steps.spares``)."""


class GangScheduling(enum.StrEnum):
    """``status.gangScheduling``: whether the job's minimum is placed as one gang
    (``render.podgroup``)."""

    ENABLED = "Enabled"
    """The cluster serves PodGroups: the job owns one with a gang policy of ``minReplicas``."""
    UNAVAILABLE = "Unavailable"
    """No ``scheduling.k8s.io/v1beta1`` PodGroups: pods are placed one by one, as before."""


class AutoscalerAnnotation(enum.StrEnum):
    """cluster-autoscaler's pod annotation the operator writes (``render.pdb``)."""

    SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
    """``"true"`` on workers: a pod of a custom controller otherwise blocks scale-down of
    its node (``--skip-nodes-with-custom-controller-pods``, default on); ``"false"`` on
    the store and etcd pods, whose loss ends every worker's rendezvous."""


class KueueLabel(enum.StrEnum):
    """Kueue's label keys the operator reads on an ElasticJob or writes on its
    Workload (``render.workload``)."""

    QUEUE_NAME = "kueue.x-k8s.io/queue-name"
    """The LocalQueue: a job labelled with it runs only while its Workload is admitted."""
    PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
    """A WorkloadPriorityClass: its value is the Workload's priority (preemption)."""
    JOB_UID = "kueue.x-k8s.io/job-uid"
    """On the Workload: the job's UID, which Kueue names in its messages and metrics."""


class KueueCondition(enum.StrEnum):
    """Kueue's Workload condition types the operator reads and writes (``render.workload``)."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"


class KueueConditionReason(enum.StrEnum):
    """Reasons of the Workload conditions the operator writes, as Kueue's own job
    controllers write them (``render.workload.release_patch``, ``finished_patch``)."""

    EVICTED = "Evicted"
    """Requeued's reason when Kueue's Evicted condition named none."""
    PENDING = "Pending"
    """QuotaReserved=False once the reservation is given back."""
    NO_RESERVATION = "NoReservation"
    """Admitted=False once the reservation is given back."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    """Finished=True's reason: how the job ended."""


class KueueEvictionReason(enum.StrEnum):
    """Reasons of Kueue's ``Evicted`` after which its job controllers say ``Requeued=True``."""

    PREEMPTED = "Preempted"
    NODE_FAILURES = "NodeFailures"


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"
