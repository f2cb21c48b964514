"""``torchflex-operator``: parse flags, configure logging and metrics, run kopf.

Where it sits: the process entry point (console script). Builds
``Settings``, the ``Kube`` client, the ``Reconciler`` and the kopf registry
(``handlers.register``), then hands control to ``kopf.run``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from torchflex_operator.settings import Settings

LOG_FORMATS = ("plain", "json")
OLDEST = "oldest"


def priority_arg(text: str) -> int | str:
    if text == OLDEST:
        return OLDEST
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or {OLDEST!r}") from None


def peering_priority(value: int | str, now_ns: int) -> int:
    """kopf pauses every peer when two share a priority: 'oldest' gives each replica
    its own, higher for earlier starts (microseconds, so ties need the same microsecond)."""
    return -(now_ns // 1000) if value == OLDEST else int(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchflex-operator",
        description="Reconciles torchflex.io/v1alpha1 ElasticJobs (elastic PyTorch training).",
    )
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
        "--peering",
        metavar="NAME",
        help="active/standby through this kopf peering object (ClusterKopfPeering, or a "
        "KopfPeering per namespace with -n); only the highest-priority live replica acts",
    )
    ha.add_argument("--standalone", action="store_true", help="no peering (single replica)")
    p.add_argument(
        "--peering-lifetime",
        type=int,
        default=60,
        metavar="S",
        help="keep-alive lifetime: a killed active replica is replaced within S seconds",
    )
    p.add_argument(
        "--priority",
        type=priority_arg,
        default=0,
        metavar="N|oldest",
        help="peering priority: the live peer with the highest one is active, the others "
        "stand by; 'oldest' ranks replicas by start time, so identical replicas of one "
        "Deployment elect the longest-running one",
    )
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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


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
    if args.peering_lifetime < 2:
        p.error("--peering-lifetime out of range")
    if args.peering and any(set(ns) & set("*?[!") for ns in args.namespace):
        p.error("--peering needs plain namespace names (no globs)")
    import kopf

    from torchflex_operator.agent_status import StatusPoller
    from torchflex_operator.handlers import register
    from torchflex_operator.kube import Kube, load_api_client
    from torchflex_operator.metrics import Metrics
    from torchflex_operator.peering import Gate, PeeringGate, own_identity
    from torchflex_operator.reconciler import Reconciler

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("torchflex_operator").setLevel(
        logging.DEBUG if args.verbose else logging.INFO
    )
    metrics = Metrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    kube = Kube(load_api_client(), on_request=lambda verb: metrics.api_requests.labels(verb).inc())
    identity = own_identity()
    priority = peering_priority(args.priority, time.time_ns())
    gate: Gate = Gate()
    if args.peering:
        scopes = list(args.namespace) if args.namespace else None
        gate = PeeringGate(kube, args.peering, scopes, identity, priority)
    reconciler = Reconciler(
        kube,
        settings_from(args),
        poller=StatusPoller(enabled=args.agent_status_poll),
        metrics=metrics,
        workers=args.workers,
        gate=gate,
    )
    registry = register(
        reconciler, watch_nodes=args.watch_nodes, peering_lifetime_s=args.peering_lifetime
    )
    kopf.run(
        registry=registry,
        namespaces=args.namespace,
        clusterwide=not args.namespace,
        standalone=args.standalone or not args.peering,
        peering_name=args.peering,
        identity=identity,  # type: ignore[arg-type]  # kopf's NewType over str
        priority=priority,
        liveness_endpoint=(
            f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
