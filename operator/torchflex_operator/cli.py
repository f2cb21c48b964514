"""``torchflex-operator``: parse flags, configure logging and metrics, run kopf.

Where it sits: the process entry point (console script). Builds
``Settings``, the ``Kube`` client, the leader gate (``leader``: a Lease with
``--lease``, always open with ``--standalone``), the ``Reconciler`` and the
kopf registry (``handlers.register``), then hands control to ``kopf.run``
(standalone: kopf's own peering is not used).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from torchflex_operator.model.settings import Settings
from torchflex_operator.planning.lease import Timing

LOG_FORMATS = ("plain", "json")
OLDEST = "oldest"


def priority_arg(text: str) -> int | str:
    if text == OLDEST:
        return OLDEST
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or {OLDEST!r}") from None


# The namespace of the pod we run in (the Lease's default namespace).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    timing: Timing


def lease_config(args: argparse.Namespace, pod_namespace: str | None) -> LeaseConfig | None:
    """The Lease to elect on (None: standalone); ``ValueError`` says what is wrong.

    ``--peering NAME`` (deprecated) means ``--lease NAME``; ``--peering-lifetime``
    (deprecated) means ``--lease-duration``. Unset timings scale with the lease
    duration like client-go's defaults (15 s / 10 s / 2 s).
    """
    name = args.lease or args.peering
    if not name:
        return None
    namespace = args.lease_namespace or pod_namespace
    if namespace is None and len(args.namespace) == 1 and not set(args.namespace[0]) & set("*?[!"):
        namespace = args.namespace[0]
    if not namespace:
        raise ValueError("--lease needs --lease-namespace when not running in a pod")
    duration = args.lease_duration or args.peering_lifetime or 15
    scaled = Timing.scaled(duration)
    timing = Timing(
        duration,
        args.renew_deadline or scaled.renew_deadline_s,
        args.retry_period or scaled.retry_period_s,
    )
    if problems := timing.problems():
        raise ValueError("leader election timing: " + "; ".join(problems))
    return LeaseConfig(namespace, name, timing)


def deprecations(args: argparse.Namespace) -> list[str]:
    """Warnings for the kopf-peering flags of earlier releases (still accepted)."""
    out = []
    if args.peering:
        out.append(
            f"--peering is deprecated: use --lease {args.peering}; leader election now uses "
            "that coordination.k8s.io Lease, kopf's peering objects are not used any more"
        )
    if args.peering_lifetime is not None:
        out.append("--peering-lifetime is deprecated: use --lease-duration")
    if args.priority is not None:
        out.append(
            "--priority is deprecated and ignored: the first replica to take the Lease "
            "holds it until it stops (what --priority oldest did)"
        )
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchflex-operator",
        description="Reconciles torchflex.io/v1alpha1 ElasticJobs (elastic PyTorch training).",
    )
    _scope_and_election(p)
    p.add_argument("--log-format", choices=LOG_FORMATS, default="plain")
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics; 0 = off")
    p.add_argument("--health-port", type=int, default=8081, help="liveness /healthz; 0 = off")
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    p.add_argument(
        "--agent-status-poll",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="poll agents' GET /status on pod IPs for world size and round",
    )
    p.add_argument(
        "--watch-nodes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch Nodes to force-delete pods stuck on lost nodes (needs nodes list/watch)",
    )
    p.add_argument("--agent-command", default=Settings.agent_command)
    p.add_argument("--etcd-image", default=Settings.etcd_image)
    p.add_argument("--backoff-base", type=float, default=Settings.backoff_base_s, metavar="S")
    p.add_argument("--backoff-cap", type=float, default=Settings.backoff_cap_s, metavar="S")
    p.add_argument("--resync", type=float, default=Settings.resync_s, metavar="S")
    p.add_argument(
        "--force-delete-after",
        type=float,
        default=Settings.force_delete_after_s,
        metavar="S",
        help="wait past a pod's grace period on a lost node before force-deleting it",
    )
    p.add_argument(
        "--progress-interval",
        type=positive_float,
        default=Settings.progress_write_s,
        metavar="S",
        help="write a job's status at most this often when only training progress changed",
    )
    p.add_argument(
        "--max-pending-pods",
        type=positive_int,
        default=Settings.max_unscheduled,
        metavar="N",
        help="worker pods per job that may wait for a node at once (creation pauses beyond)",
    )
    p.add_argument(
        "--create-batch",
        type=positive_int,
        default=Settings.create_batch_initial,
        metavar="N",
        help="worker pods a job's first pass may create; later passes add as many as started",
    )
    netpol = p.add_argument_group("the operator as seen by each job's NetworkPolicy")
    netpol.add_argument(
        "--operator-pod-namespace",
        metavar="NS",
        help="namespace of the operator's own pods (with --operator-pod-label)",
    )
    netpol.add_argument(
        "--operator-pod-label",
        action="append",
        default=[],
        type=label_arg,
        metavar="KEY=VALUE",
        help="a label of the operator's own pods (repeatable)",
    )
    netpol.add_argument(
        "--operator-cidr",
        action="append",
        default=[],
        metavar="CIDR",
        help="source range of an operator running outside the cluster (repeatable)",
    )
    return p


def _scope_and_election(p: argparse.ArgumentParser) -> None:
    """The namespaces watched, and leader election."""
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable; globs allowed)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    ha = p.add_mutually_exclusive_group()
    ha.add_argument(
        "--lease",
        metavar="NAME",
        help="active/standby through this coordination.k8s.io Lease: only its holder "
        "reconciles, the other replicas stand by and take it over when it is not renewed",
    )
    ha.add_argument(
        "--standalone", action="store_true", help="no leader election (one replica; default)"
    )
    ha.add_argument("--peering", metavar="NAME", help="deprecated: --lease NAME")
    election = p.add_argument_group("leader election (with --lease)")
    election.add_argument(
        "--lease-namespace",
        metavar="NS",
        help="namespace of the Lease (default: the operator pod's own namespace)",
    )
    election.add_argument(
        "--lease-duration",
        type=positive_int,
        metavar="S",
        help="a standby takes over a lease not renewed for S seconds (default 15)",
    )
    election.add_argument(
        "--renew-deadline",
        type=positive_float,
        metavar="S",
        help="the holder stops reconciling when it could not renew for S seconds "
        "(default 2/3 of the lease duration)",
    )
    election.add_argument(
        "--retry-period",
        type=positive_float,
        metavar="S",
        help="the holder renews, a standby reads, every S seconds (default 2/15 of the "
        "lease duration)",
    )
    election.add_argument(
        "--peering-lifetime", type=positive_int, metavar="S", help="deprecated: --lease-duration"
    )
    election.add_argument(
        "--priority", type=priority_arg, metavar="N|oldest", help="deprecated; ignored"
    )


def _positive(text: str, convert: type[float], what: str) -> float:
    try:
        value = convert(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return int(_positive(text, int, "a whole number >= 1"))


def positive_float(text: str) -> float:
    return _positive(text, float, "a number > 0")


def label_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        agent_command=args.agent_command,
        etcd_image=args.etcd_image,
        backoff_base_s=args.backoff_base,
        backoff_cap_s=args.backoff_cap,
        resync_s=args.resync,
        force_delete_after_s=args.force_delete_after,
        progress_write_s=args.progress_interval,
        max_unscheduled=args.max_pending_pods,
        create_batch_initial=args.create_batch,
        operator_namespace=args.operator_pod_namespace,
        operator_pod_labels=tuple(args.operator_pod_label),
        operator_cidrs=tuple(args.operator_cidr),
    )


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)  # exits 2 with a usage line on bad flags
    for flag in ("metrics_port", "health_port", "workers"):
        if getattr(args, flag) < 0 or (flag == "workers" and args.workers < 1):
            p.error(f"--{flag.replace('_', '-')} out of range")
    pod_namespace = POD_NAMESPACE_FILE.read_text().strip() if POD_NAMESPACE_FILE.exists() else None
    try:
        lease = lease_config(args, pod_namespace)
    except ValueError as exc:
        p.error(str(exc))
    import kopf

    from torchflex_operator.kube import Kube, load_api_client
    from torchflex_operator.runtime import logsetup
    from torchflex_operator.runtime.agent_status import StatusPoller
    from torchflex_operator.runtime.handlers import register
    from torchflex_operator.runtime.leader import Gate, LeaseGate, own_identity
    from torchflex_operator.runtime.metrics import Metrics
    from torchflex_operator.runtime.reconcile import Reconciler

    logsetup.configure(verbose=args.verbose, json=args.log_format == "json")
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    kube = Kube(load_api_client(), on_request=metrics.api_request)
    for warning in deprecations(args):
        logging.getLogger(__name__).warning("%s", warning)
    gate: Gate = Gate()
    if lease is not None:
        gate = LeaseGate(kube, lease.namespace, lease.name, own_identity(), lease.timing)
    kube.may_write = lambda: gate.active  # a pass still running when the lead is lost stops
    reconciler = Reconciler(
        kube,
        settings_from(args),
        poller=StatusPoller(enabled=args.agent_status_poll),
        metrics=metrics,
        workers=args.workers,
        gate=gate,
    )
    registry = register(reconciler, watch_nodes=args.watch_nodes)
    kopf.run(
        registry=registry,
        namespaces=args.namespace,
        clusterwide=not args.namespace,
        # kopf's watches run on every replica; our leader gate decides who reconciles.
        standalone=True,
        liveness_endpoint=(
            f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
