"""Recovery benchmark on the local control plane: a pod dies, the operator replaces it.

Where it sits: ``python -m benchmarks.recovery_cluster`` (also run by ``make
bench``). The cluster-level twin of ``benchmarks.recovery`` (process level):
the same 3-node job (min 2, max 3, one CPU/gloo worker per pod running
``examples/train_elastic.py``, a step every 100 ms) as an ElasticJob on the
local control plane (``e2e.cluster``: real API server, scheduler, the real
``torchflex-operator`` process, pods as real processes on the process
kubelet), under ``torchflex-agent`` and under a plain ``torchrun`` command
(c10d, default and tuned settings; the job's store pod serves its
rendezvous), in one run; ``torchflex-spare`` is the torchflex job with one
warm spare pod (``spec.warmSpares: 1``), whose join promotes that waiting pod
instead of starting one. Each repetition is one job:

1. apply it at ``replicas: 2``; wait until both pods train at world size 2
   (and, with a spare, until the spare's agent waits for promotion);
2. scale-up join: ``kubectl scale ej/NAME --replicas=3``; join = from the
   request (and from the new pod first seen Running) to the first step at
   world size 3 on every pod. Each run also prints its ``join phases``
   (seconds from the request: the new pod created, bound and Running as the
   watch saw them, then its agent's fork server spawned and ready, joining,
   round formed, workers started, from the agent's log stamps;
   ``_cluster_logs.join_phases``). If the join never completes, the job is
   replaced by a fresh one at ``replicas: 3`` so the kill still runs;
3. kill: SIGKILL one pod's agent and workers (``--kill sigkill``, a machine
   dying: the kubelet reports the pod Failed) or force-delete the pod
   (``--kill delete``); never the pod holding worker rank 0;
4. recovery = from the kill to the first step of the re-formed group on
   every survivor (``benchmarks._cluster_logs`` defines it); regrow = from
   the kill to the first step at world size 3 with the operator's
   replacement pod on every pod.

Writes its section of ``benchmarks/RESULTS.md`` (not with ``--quick``);
``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from typing import Any

from benchmarks._cluster_job import (
    BenchJob,
    ClusterJob,
    PodWatch,
    bench_job,
)
from benchmarks._cluster_logs import (
    STANDBY_WAITING,
    all_at_world,
    current_rank,
    first_new_group_step,
    group_formed_at,
    join_phases,
    training_at,
)
from benchmarks._cluster_report import FLAVORS, Trial, markdown, summary
from benchmarks._proc_logs import pick_victim
from benchmarks.cli import BenchCli
from benchmarks.report import phases_line
from e2e.cluster import Cluster, ensure_up
from e2e.operator_proc import OperatorProcess, sigkill_pod_processes
from e2e.polling import poll_until
from e2e.workload import apply_crd

NAMESPACE = "bench-recovery-cluster"
_SHORT = {"torchflex": "tf", "torchflex-spare": "tfs", "torchrun-tuned": "trt",
          "torchrun-default": "trd"}  # fmt: skip
_START_TIMEOUT = 180.0
_JOIN_TIMEOUT = {"torchrun-default": 90.0}
# Stock torchrun needs ~46 s on a quiet machine; past 120 s it counts as a timeout.
_RECOVER_TIMEOUT = {"torchrun-default": 120.0}
_REGROW_TIMEOUT = {"torchrun-default": 90.0}
_TIMEOUT = 60.0
"""Any other launcher's limit for each wait."""
_WARM_STEPS = 5


def say(text: str) -> None:
    print(f"[recovery_cluster] {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Context:
    cluster: Cluster
    watch: PodWatch
    kill: str
    trace: bool


def _start(ctx: Context, flavor: str, name: str, replicas: int) -> ClusterJob:
    ckpt = ctx.cluster.layout.root / "ckpt" / NAMESPACE / name
    shutil.rmtree(ckpt, ignore_errors=True)
    job: BenchJob = bench_job(flavor, name, ckpt, replicas)
    cj = ClusterJob(ctx.cluster, NAMESPACE, job, ctx.watch)
    cj.apply()
    return cj


def _wait_world(cj: ClusterJob, n: int, after: float, timeout: float) -> bool:
    def ready() -> bool:
        pods = cj.pods()
        return len(pods) == n and training_at(cj.events(pods), n, after, _WARM_STEPS)

    return bool(poll_until(ready, timeout, 0.2))


def _join(ctx: Context, cj: ClusterJob, trial: Trial) -> bool:
    before = set(cj.pods())
    t_scale = time.time()
    cj.scale(3)

    def joined() -> float | None:
        pods = cj.pods()
        return all_at_world(cj.events(pods), t_scale, 3) if len(pods) == 3 else None

    # A promoted spare ran long before the request: only a new pod's own marks count.
    spare = trial.flavor == "torchflex-spare"

    timeout = _JOIN_TIMEOUT.get(trial.flavor, _TIMEOUT)
    poll_until(lambda: joined() is not None, timeout, 0.2)
    done = joined()
    pods = cj.pods()
    new = [(p, uid) for p, uid in pods.items() if p not in before]
    running = ctx.watch.running_since(*new[0]) if new and not spare else None
    if running is not None:
        trial.new_pod_running_s = running - t_scale
    if new:
        marks = {} if spare else ctx.watch.marks(*new[0])
        trial.join_phases = join_phases(marks, cj.logs.lines(*new[0]), t_scale)
    if done is None:
        trial.problems.append(f"join: no step at world size 3 on all 3 pods within {timeout:.0f} s")
        if ctx.trace:
            _trace(cj, pods)
        return False
    trial.join_s = done - t_scale
    if running is not None:
        trial.join_from_running_s = done - running
    return True


def _wait_spare(cj: ClusterJob, timeout: float) -> bool:
    """Wait until the job's warm spare waits for promotion (its imports done)."""

    def waiting() -> bool:
        spares = cj.pods(spares=True)
        return len(spares) == 1 and any(
            STANDBY_WAITING.search(line)
            for pod, uid in spares.items()
            for line in cj.logs.lines(pod, uid)
        )

    return bool(poll_until(waiting, timeout, 0.2))


def _kill(ctx: Context, cj: ClusterJob, trial: Trial) -> None:
    pods = cj.pods()
    events = cj.events(pods)
    names = sorted(pods)
    victim = names[pick_victim([current_rank(events[p], 3) for p in names])]
    survivors = {p: uid for p, uid in pods.items() if p != victim}
    if ctx.kill == "delete":
        t_kill = time.time()
        cj.cluster.kubectl(
            "delete", "pod", victim, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false"
        )
    else:
        pids = sigkill_pod_processes(NAMESPACE, victim)
        t_kill = time.time()  # the kills themselves take microseconds after the /proc scan
        if not pids:
            trial.problems.append(f"found no processes of {victim}")
            return
    timeout = _RECOVER_TIMEOUT.get(trial.flavor, _TIMEOUT)
    poll_until(lambda: group_formed_at(cj.events(survivors), t_kill) is not None, timeout, 0.2)
    surv_events = cj.events(survivors)
    done = group_formed_at(surv_events, t_kill)
    if done is None:
        trial.problems.append(f"recovery: timed out (no re-formed group within {timeout:.0f} s)")
        if ctx.trace:
            _trace(cj, survivors)
        return
    trial.recovery_s = done - t_kill
    firsts = [first_new_group_step(ev, t_kill) for ev in surv_events.values()]
    trial.reformed_world = max(f.world for f in firsts if f is not None)

    def regrown() -> float | None:
        now = cj.pods()
        if len(now) != 3 or now.get(victim) in (None, pods[victim]):
            return None
        return group_formed_at(cj.events(now), t_kill, world=3)

    timeout = _REGROW_TIMEOUT.get(trial.flavor, _TIMEOUT)
    poll_until(lambda: regrown() is not None, timeout, 0.2)
    back = regrown()
    if back is None:
        trial.problems.append(f"regrow: not at world size 3 within {timeout:.0f} s of recovery")
        if ctx.trace:
            _trace(cj, cj.pods())
        return
    trial.regrow_s = back - t_kill


def _trace(cj: ClusterJob, pods: dict[str, str]) -> None:
    for pod, uid in sorted(pods.items()):
        for line in cj.logs.tail(pod, uid):
            say(f"   {pod}: {line[:160]}")


def run_trial(ctx: Context, flavor: str, rep: int) -> Trial:
    trial = Trial(flavor)
    name = f"rc-{_SHORT[flavor]}-{rep}"
    cj = _start(ctx, flavor, name, replicas=2)
    try:
        if not _wait_world(cj, 2, 0.0, _START_TIMEOUT):
            trial.problems.append(f"the job did not train at world size 2 within {_START_TIMEOUT}s")
            return trial
        if flavor == "torchflex-spare" and not _wait_spare(cj, _START_TIMEOUT):
            trial.problems.append(f"no warm spare waiting within {_START_TIMEOUT}s")
            return trial
        if not _join(ctx, cj, trial):
            # Kill on a fresh job that starts at full size instead.
            if not cj.delete():
                trial.problems.append(f"{cj.name}'s pods still there after deletion")
            cj = _start(ctx, flavor, f"{name}-full", replicas=3)
            trial.fresh_job = True
            if not _wait_world(cj, 3, 0.0, _START_TIMEOUT):
                trial.problems.append("the fresh job did not train at world size 3")
                return trial
        elif not _wait_world(cj, 3, time.time(), 60):
            trial.problems.append("the group of 3 stopped training after the join")
            return trial
        _kill(ctx, cj, trial)
        return trial
    finally:
        if not cj.delete():
            trial.problems.append(f"{cj.name}'s pods still there 90 s after deletion")


def _prepare(cluster: Cluster) -> None:
    apply_crd(cluster)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s",
                    timeout=150)  # fmt: skip
    cluster.kubectl("create", "namespace", NAMESPACE)
    ok = poll_until(
        lambda: (
            cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0
        ),
        30,
        0.5,
    )
    if not ok:
        raise RuntimeError(f"no default ServiceAccount in {NAMESPACE}")


def run(flavors: list[str], reps: dict[str, int], kill: str, trace: bool) -> list[Trial]:
    cluster = ensure_up()
    _prepare(cluster)
    log = cluster.layout.logs / f"operator-{NAMESPACE}.log"
    op = OperatorProcess(cluster.kubeconfig, [NAMESPACE], log).start()
    say(f"operator log {log}; pod logs {cluster.layout.pods}/{NAMESPACE}_*")
    limit = sum(reps.values()) * 900.0
    trials: list[Trial] = []
    try:
        with PodWatch(cluster, NAMESPACE, limit) as watch:
            ctx = Context(cluster, watch, kill, trace)
            for flavor in flavors:
                for rep in range(reps[flavor]):
                    trial = run_trial(ctx, flavor, rep)
                    trials.append(trial)
                    say(f"{flavor} run {rep + 1}/{reps[flavor]}: {trial.line()}")
                    if any(v is not None for v in trial.join_phases.values()):
                        phases = phases_line(trial.join_phases)
                        say(f"   join phases (s from the scale request): {phases}")
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    return trials


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("recovery_cluster", __doc__, quick_help="1 run each",
                   reps_help="runs per launcher (default 3)")  # fmt: skip
    cli.add_subset("--flavors", FLAVORS)
    cli.add_argument(
        "--kill",
        choices=("sigkill", "delete"),
        default="sigkill",
        help="SIGKILL the pod's processes (default) or force-delete the pod",
    )
    cli.add_argument("--trace", action="store_true", help="print log tails when a wait fails")
    bench = cli.parse(argv)
    args = bench.args
    reps = {f: bench.reps(3) for f in args.flavors}
    trials = run(args.flavors, reps, args.kill, args.trace)
    result: dict[str, Any] = summary(trials)
    text = markdown(trials, result, args.kill)
    bench.write_section(
        "recovery_cluster",
        "Recovery after a pod's death (local control plane, operator involved)",
        text,
    )
    bench.show(text, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
