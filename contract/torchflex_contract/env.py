"""Environment variables the operator injects and the agent reads.

Where it sits: the operator's pod builder sets these on the ``trainer``
container; the agent's CLI uses each as the default of the matching flag, so
``torchflex-agent -- cmd`` in a pod needs no flags at all.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "TORCHFLEX_"

JOB_NAME: Final = "TORCHFLEX_JOB_NAME"
NAMESPACE: Final = "TORCHFLEX_NAMESPACE"
POD_NAME: Final = "TORCHFLEX_POD_NAME"
POD_IP: Final = "TORCHFLEX_POD_IP"
REPLICA_INDEX: Final = "TORCHFLEX_REPLICA_INDEX"

NNODES: Final = "TORCHFLEX_NNODES"
"""``MIN:MAX`` or ``N``, like torchrun's ``--nnodes``."""
NPROC_PER_NODE: Final = "TORCHFLEX_NPROC_PER_NODE"
"""``auto`` | ``gpu`` | ``cpu`` | a positive integer."""
RDZV_BACKEND: Final = "TORCHFLEX_RDZV_BACKEND"
"""A ``rendezvous_backends.RendezvousBackend``: ``c10d`` | ``etcd`` | ``memory`` (tests only)."""
RDZV_ENDPOINT: Final = "TORCHFLEX_RDZV_ENDPOINT"
"""``host:port``; for etcd a comma-separated list of ``[http[s]://]host:port``."""
RDZV_ID: Final = "TORCHFLEX_RDZV_ID"
"""Unique per job (namespace, name and uid); never torchrun's default ``none``."""
RDZV_JOIN_TIMEOUT: Final = "TORCHFLEX_RDZV_JOIN_TIMEOUT"
RDZV_LAST_CALL: Final = "TORCHFLEX_RDZV_LAST_CALL"
RDZV_TLS_DIR: Final = "TORCHFLEX_RDZV_TLS_DIR"
"""Directory holding ``ca.crt``, ``tls.crt``, ``tls.key`` for an etcd endpoint."""
MAX_RESTARTS: Final = "TORCHFLEX_MAX_RESTARTS"
MONITOR_INTERVAL: Final = "TORCHFLEX_MONITOR_INTERVAL"
HEALTH_PORT: Final = "TORCHFLEX_HEALTH_PORT"
GPU_LIMIT: Final = "TORCHFLEX_GPU_LIMIT"
"""The container's ``nvidia.com/gpu`` limit (resourceFieldRef), when set."""
TERMINATION_GRACE: Final = "TORCHFLEX_TERMINATION_GRACE"
"""Seconds the agent gives workers to checkpoint after SIGTERM."""
STANDBY_FILE: Final = "TORCHFLEX_STANDBY_FILE"
"""Path of a file that reads ``true`` while the pod is a warm spare: its agent
prewarms (fork server, store connection) but does not join the rendezvous until
the file reads anything else. The operator sets it on spare pods only, to a
downward-API projection of the pod's ``torchflex.io/standby`` annotation
(``labels.Annotation.STANDBY``), so promoting a spare is one annotation patch."""
STANDBY_VOLUME: Final = "torchflex-podinfo"
"""Name of the spare pod's downward-API volume holding ``STANDBY_FILE``."""
STANDBY_MOUNT_DIR: Final = "/etc/torchflex/podinfo"
STANDBY_FILE_NAME: Final = "standby"
STANDBY_TRUE: Final = "true"
"""The only content of ``STANDBY_FILE`` that keeps an agent waiting."""

DEFAULT_HEALTH_PORT: Final = 29410
DEFAULT_STORE_PORT: Final = 29400
DEFAULT_JOIN_TIMEOUT_S: Final = 600.0
DEFAULT_LAST_CALL_S: Final = 1.0
DEFAULT_MONITOR_INTERVAL_S: Final = 0.1
RDZV_TLS_MOUNT: Final = "/etc/torchflex/rdzv-tls"
"""Where the operator mounts ``rendezvous.tlsSecretName`` (value of ``RDZV_TLS_DIR``)."""

TERMINATION_LOG: Final = "TORCHFLEX_TERMINATION_LOG"
"""Overrides where the agent writes its final report (default ``/dev/termination-log``)."""
HEARTBEAT_INTERVAL: Final = "TORCHFLEX_HEARTBEAT_INTERVAL"
"""Seconds between an agent's liveness heartbeats while its round runs."""
LIVENESS_TIMEOUT: Final = "TORCHFLEX_LIVENESS_TIMEOUT"
"""Seconds without heartbeat progress (watcher's own clock) before a peer counts as lost."""
STOP_GRACE: Final = "TORCHFLEX_STOP_GRACE"
"""Seconds workers get after SIGTERM on a membership change before SIGKILL."""
ROLE: Final = "TORCHFLEX_ROLE"
"""The training role this agent's workers belong to (``--role``, torchrun's flag);
unset on a job without ``spec.roles``, whose one role is ``roles.DEFAULT_ROLE``."""
COUPLING: Final = "TORCHFLEX_COUPLING"
"""A ``roles.Coupling``: ``Independent`` (each role its own rendezvous) or ``Joint``
(one rendezvous across roles, torchrun ``--role`` ranks). Unset: ``Independent``."""
ROLE_SIZES: Final = "TORCHFLEX_ROLE_SIZES"
"""Every role of the job in spec order, ``name=MIN:MAX`` joined by ``,``
(``roles.format_role_sizes``); unset on a job without ``spec.roles``."""
JOB_SCOPED_ROLES: Final = "TORCHFLEX_JOB_SCOPED_ROLES"
"""The roles of an Independent job with ``failureScope: Job``, joined by ``,``: when one
of their rounds ends for anything but growth, every other role re-forms too
(``RestartReason.ROLE_FAILED``). Unset or empty: none."""
PREWARM: Final = "TORCHFLEX_PREWARM"
"""``auto`` (default): fork Python workers from a warm fork server; ``off``: plain spawn."""

# Set by the agent in every worker's env (not by the operator):
FENCE_FILE: Final = "TORCHFLEX_FENCE_FILE"
"""Path of the agent's lease file (``torchflex_agent.fence``): the worker's round is
current while the file names that round and its CLOCK_MONOTONIC deadline is ahead."""
ROUND: Final = "TORCHFLEX_ROUND"
"""The rendezvous round the worker was started for (decimal)."""
ERROR_FILE: Final = "TORCHFLEX_ERROR_FILE"
"""Where the worker bootstrap records an uncaught exception (JSON: ``type``,
``message``, ``frames``, ``timestamp``); per worker and round, and the same
path as torch's ``TORCHELASTIC_ERROR_FILE``, so ``@record`` scripts land there too."""
FINISHED_FILE: Final = "TORCHFLEX_FINISHED_FILE"
"""Where the fork server's worker bootstrap writes, the moment the script's code
returned, its exit code and the time (JSON: ``code``, ``timestamp``, ``pid``): the
agent's proof that a worker still alive after it is hung in its own teardown."""
STACK_FILE: Final = "TORCHFLEX_STACK_FILE"
"""Where a forked worker's ``faulthandler`` appends every thread's Python stack when
the agent sends it ``STACK_SIGNAL`` (a hang report). Exists only once armed."""
STACK_SIGNAL_OFFSET: Final = 4
"""The stack-dump signal is ``SIGRTMIN + STACK_SIGNAL_OFFSET``: a real-time signal no
training library claims (SIGUSR1/2 are often a scheduler's)."""
KEPT_GROUPS_ATTR: Final = "torchflex_kept_process_groups"
"""Not a variable: the attribute of ``torch.distributed.distributed_c10d`` holding the
process groups a forked worker keeps until it exits (``zygote.keep_process_groups``);
the state API empties it to free a group it leaves."""
TEARDOWN_GRACE: Final = "TORCHFLEX_TEARDOWN_GRACE"
"""Seconds a worker whose script returned may take to exit before the agent records its
stack and kills it (a teardown hang; its exit code is the script's)."""
COMPLETION_GRACE: Final = "TORCHFLEX_COMPLETION_GRACE"
"""Seconds a member's workers may run on after another member of the round finished
the job before the agent records their stacks and ends them (``docs/api.md``)."""
HANG_TIMEOUT: Final = "TORCHFLEX_HANG_TIMEOUT"
"""Seconds without training progress anywhere in the job before the agents declare a
hang (``spec.hangTimeoutSeconds``; 0 turns detection off). Unset: derived from the
job's own step times (``torchflex_agent.loop.logic.stall``)."""
NODE_CHECK: Final = "TORCHFLEX_NODE_CHECK"
"""``on``: before its first join the agent checks its node's devices (a timed matmul,
checked against the CPU) and compares the figure with its peers' (``loop.preflight``);
``off`` (default) skips it."""
PULSE_FILE: Final = "TORCHFLEX_PULSE_FILE"
"""Per worker: the small binary record its bootstrap's hooks keep current (steps,
last activity, forward time, a declared pause; ``torchflex_agent.pulse``)."""
ROLES_FILE: Final = "TORCHFLEX_ROLES_FILE"
"""Per agent: a JSON file the agent replaces atomically with every role's current
round, world size and members (``torchflex_agent.roles``)."""
SERVICE_PORT: Final = "TORCHFLEX_SERVICE_PORT"
"""Per worker: a free port it may serve on, published to the other roles in the
roles file."""
ROLE_RANKS: Final = "TORCHFLEX_ROLE_RANKS"
"""Joint coupling: every role's global ranks, ``trainer:0-3,ps:4-4``."""
PROGRESS_FILE: Final = "TORCHFLEX_PROGRESS_FILE"
"""Where the ``LOCAL_RANK`` 0 worker reports training progress
(``torchflex_agent.progress``): one file per agent, replaced atomically."""
STATE_DIR: Final = "TORCHFLEX_STATE_DIR"
"""The agent's in-memory folder (``/dev/shm``) where workers using the opt-in state API
(``torchflex_agent.state``) keep a fenced copy of their last completed step; one per
agent, kept across rounds, removed when the agent exits."""

DEFAULT_HEARTBEAT_INTERVAL_S: Final = 0.2
DEFAULT_LIVENESS_TIMEOUT_S: Final = 1.5
DEFAULT_STOP_GRACE_S: Final = 3.0
DEFAULT_TEARDOWN_GRACE_S: Final = 30.0
DEFAULT_COMPLETION_GRACE_S: Final = 300.0
MIN_HANG_TIMEOUT_S: Final = 10
"""The shortest hang timeout (``HANG_TIMEOUT``) besides 0 (off): below it a slow step
would read as a hang. The CRD and the agent's flag refuse less."""
MAX_HANG_TIMEOUT_S: Final = 86_400
POD_GRACE_DEFAULT_S: Final = 30
"""Kubernetes' ``terminationGracePeriodSeconds`` of a pod whose template sets none."""
TERMINATION_GRACE_MARGIN_S: Final = 5
"""What the operator holds back from a pod's grace period (``TERMINATION_GRACE``) so
the agent exits before the kubelet's SIGKILL."""
DEFAULT_TERMINATION_GRACE_S: Final = float(POD_GRACE_DEFAULT_S - TERMINATION_GRACE_MARGIN_S)
"""The agent's own default: what the operator gives a pod with Kubernetes' default grace."""
DEFAULT_MAX_RESTARTS: Final = 3
DEFAULT_ETCD_PORT: Final = 2379
