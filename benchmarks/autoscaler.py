"""Autoscaler benchmark: from a worker pod going Pending to the job training at the larger size.

Where it sits: ``python -m benchmarks.autoscaler`` (also run by ``make
bench``). On the local control plane (``e2e.cluster``) with the real
cluster-autoscaler against the test cloud of ``e2e.autoscaler`` (one spot
group, process-kubelet nodes), the real operator process and real agents
and torch workers. Each repetition applies an ElasticJob (min 1, max 2, each
worker asking for 10 of a node's 16 CPUs, so the second worker needs a new
node) and splits the time from worker 1 first seen Pending (unschedulable)
to the first step at world size 2 into:

* autoscaler = Pending -> the autoscaler's NodeGroupIncreaseSize call (its
  scan, its scale-up simulation, the gRPC round trip to the cloud);
* node start = that call -> the new Node Ready (a kubelet process starting
  and registering: the local stand-in for a VM boot, far shorter than a
  cloud's minutes);
* join = Node Ready -> the first step at world size 2, split into
  scheduling (Ready -> the pod bound: kube-scheduler's next try of the
  job's gang, see ``--scheduler-max-backoff``), pod start (bound -> Running:
  the process kubelet), agent imports (Running -> the agent's fork server
  ready: torch imported), rendezvous (-> workers started in the new round)
  and first step (-> the new worker's first step at world size 2).

Every milestone is taken from the objects' and processes' own clocks: watch
events of the Node and the pod stamped on arrival (``_autoscaler_trace``),
the cloud's stamp of the autoscaler's call, the agent's log stamps and the
worker's ``t=`` step stamp (``_autoscaler_phases``). The scheduler is run
again for the benchmark with ``podMaxBackoffSeconds`` = ``--scheduler-max-backoff``
(default: the local control plane's, ``controlplane.SCHEDULER_POD_MAX_BACKOFF_S``;
Kubernetes' default is 10) and put back afterwards.

Between repetitions the job is deleted and the autoscaler removes the idle
node (10 s unneeded time). Writes its section of ``benchmarks/RESULTS.md``
(not with ``--quick``); ``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

from benchmarks._autoscaler_phases import PHASES, log_marks, object_marks, phases, since_ready
from benchmarks._autoscaler_trace import Recorder
from benchmarks.cli import BenchCli, positive_int
from benchmarks.report import load_note, markdown_table, summarize
from e2e.autoscaler import autoscaler
from e2e.autoscaler.cloud import TestCloud
from e2e.autoscaler.groups import GROUP_LABEL, Groups, GroupSpec
from e2e.cluster import Cluster, ensure_up, restart_scheduler
from e2e.cluster.controlplane import SCHEDULER_POD_MAX_BACKOFF_S
from e2e.operator_proc import OperatorProcess
from e2e.polling import poll_until
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, apply_crd
from torchflex_contract.labels import TRAINER_CONTAINER

NAMESPACE = "bench-autoscaler"
JOB = "grow"  # grow-<run>: a new name per run, so an earlier run's logs never count
TRIAL_LIMIT_S = 300.0
SCALE_DOWN_LIMIT_S = 180.0
MAIN = ("autoscaler", "node start", "join", "total")
JOIN_SPLIT = ("scheduling", "pod start", "agent imports", "rendezvous", "first step")


def say(text: str) -> None:
    print(f"[autoscaler] {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Trial:
    marks: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Milestones as wall times (``_autoscaler_phases``); empty until the trial ends."""
    problem: str | None = None

    def parts(self) -> dict[str, float] | None:
        """Every phase's seconds, or None if a milestone is missing."""
        got = phases(self.marks)
        if any(v is None for v in got.values()):
            return None
        return {k: v for k, v in got.items() if v is not None}


def _manifest(cluster: Cluster, job_name: str) -> dict[str, Any]:
    ckpt = cluster.layout.root / "ckpt" / NAMESPACE
    ckpt.mkdir(parents=True, exist_ok=True)
    job = TrainingJob(
        job_name, ckpt, min_replicas=1, max_replicas=2, steps=100000, backoff_limit=0,
        extra_env=(("TRAIN_PRINT_TIME", "1"),),  # step lines carry the worker's t= stamp
    )  # fmt: skip
    manifest = job.manifest()
    pod_spec = manifest["spec"]["template"]["spec"]
    del pod_spec["nodeSelector"]
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "10"}}
    return manifest


def _pod_log(cluster: Cluster, pod: str) -> list[str]:
    """The new pod's container log (its only incarnation: the job has backoffLimit 0)."""
    logs = sorted(cluster.layout.pods.glob(f"{NAMESPACE}_{pod}_*/{TRAINER_CONTAINER}.log"))
    return logs[-1].read_text(errors="replace").splitlines() if logs else []


def _observe(
    cluster: Cluster, cloud: TestCloud, follower: LogFollower, rec: Recorder, job_name: str
) -> Trial:
    pod = f"{job_name}-worker-1"
    deadline = time.monotonic() + TRIAL_LIMIT_S
    while time.monotonic() < deadline:
        if any(ln.world == 2 and ln.pod == pod for ln in follower.lines("step")):
            break
        time.sleep(0.2)
    else:
        return Trial(problem=f"no step at world size 2 on {pod} in {TRIAL_LIMIT_S:.0f} s")
    # The cloud stamps its calls on the monotonic clock; every other mark is wall time.
    to_wall = time.time() - time.monotonic()
    asked = [(t, node) for t, kind, node in cloud.timeline if kind == "requested"]
    if not asked:
        return Trial(problem=f"{pod} trained at world 2 with no node requested: {cloud.timeline}")
    requested = asked[0][0] + to_wall
    # A node of the same name from the run before may still be seen until its Node
    # object is deleted: only what was seen after the request is the new node.
    node = [r for r in rec.records("node", asked[0][1]) if r[0] >= requested]
    marks = object_marks(rec.records("pod", pod), node)
    marks["requested"] = requested
    marks.update(log_marks(_pod_log(cluster, pod), world=2))
    return Trial(marks=marks)


def _cloud_nodes(cloud: TestCloud) -> bool:
    """Whether the cloud has an instance, or its Node object is still there."""
    nodes = cloud.core.list_node(label_selector=GROUP_LABEL, _request_timeout=10).items
    return bool(cloud.groups.instances or nodes)


def run_trial(cluster: Cluster, cloud: TestCloud, rep: int) -> Trial:
    cloud.timeline.clear()
    # A new name per invocation too: the pods' log folders outlive the namespace.
    job_name = f"{JOB}-{int(time.time()) % 100000}-{rep}"
    with (
        LogFollower(cluster.layout.pods, NAMESPACE) as follower,
        Recorder(cluster, NAMESPACE) as rec,
    ):
        apply(cluster, NAMESPACE, _manifest(cluster, job_name))
        try:
            trial = _observe(cluster, cloud, follower, rec, job_name)
        finally:
            cluster.kubectl("delete", f"ej/{job_name}", "-n", NAMESPACE, "--wait=true", check=False,
                            timeout=120)  # fmt: skip
    gone = poll_until(lambda: not _cloud_nodes(cloud), SCALE_DOWN_LIMIT_S, 1.0)
    if not gone and trial.problem is None:
        trial.problem = f"run {rep + 1}: idle node not removed in {SCALE_DOWN_LIMIT_S:.0f} s"
    if trial.problem is None and trial.parts() is None:
        trial.problem = f"run {rep + 1}: a milestone was not seen: {since_ready(trial.marks)}"
    return trial


def run(reps: int, max_backoff_s: int) -> list[Trial]:
    cluster = ensure_up()
    restart_scheduler(cluster, max_backoff_s)
    apply_crd(cluster)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s",
                    timeout=150)  # fmt: skip
    cluster.kubectl("create", "namespace", NAMESPACE)
    log = cluster.layout.logs / f"operator-{NAMESPACE}.log"
    op = OperatorProcess(cluster.kubeconfig, [NAMESPACE], log).start()
    cloud = TestCloud(cluster, Groups.of(GroupSpec("spot", 0, 1, spot=True))).start()
    autoscaler.start(cluster, cloud)
    trials: list[Trial] = []
    try:
        for rep in range(reps):
            trial = run_trial(cluster, cloud, rep)
            trials.append(trial)
            shown = {k: round(v, 2) for k, v in (trial.parts() or {}).items()}
            say(f"run {rep + 1}/{reps}: {shown or trial.problem}")
    finally:
        autoscaler.stop(cluster)
        cloud.stop()
        op.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        if max_backoff_s != SCHEDULER_POD_MAX_BACKOFF_S:
            restart_scheduler(cluster)  # the cluster's own setting again
    return trials


def summary(trials: list[Trial]) -> dict[str, Any]:
    done = [p for t in trials if (p := t.parts()) is not None]
    out: dict[str, Any] = {
        name: dataclasses.asdict(summarize([d[name] for d in done])) for name, _, _ in PHASES
    }
    out["runs"] = [{"phases": t.parts(), "since_ready": since_ready(t.marks)} for t in trials]
    out["problems"] = [t.problem for t in trials if t.problem]
    return out


def _table(trials: list[Trial], result: dict[str, Any], names: tuple[str, ...]) -> str:
    rows = []
    for i, t in enumerate(trials):
        parts = t.parts()
        rows.append([str(i + 1), *(f"{parts[p]:.2f}" if parts else "n/a" for p in names)])
    rows.append(["median", *(summarize_cell(result[p]) for p in names)])
    return markdown_table(["run", *(f"{p} (s)" for p in names)], rows)


def markdown(trials: list[Trial], result: dict[str, Any], max_backoff_s: int, load: str) -> str:
    problems = "\n".join(f"- {p}" for p in result["problems"])
    return (
        "From worker 1 first seen Pending (unschedulable) to the first step at world size 2,\n"
        "on the local control plane: cluster-autoscaler (1 s scan) against the test cloud's\n"
        "spot group, a node = a process-kubelet process (no VM boot), real operator, agents\n"
        "and torch workers (CPU, gloo), the job's workers in a gang (PodGroup, minCount 1).\n"
        f"kube-scheduler: podMaxBackoffSeconds {max_backoff_s}"
        f"{' (the default)' if max_backoff_s == 10 else ''}.\n"
        f"{load}\n\n"
        + _table(trials, result, MAIN)
        + "\n\nThe join (Node Ready to the first step at world size 2), phase by phase:\n"
        "scheduling = Node Ready -> the pod bound (the scheduler's next try of the gang);\n"
        "pod start = bound -> Running (the process kubelet); agent imports = Running ->\n"
        "the agent's fork server ready (torch imported); rendezvous = -> workers started\n"
        "in the new round; first step = -> the new worker's first step at world size 2.\n"
        "Watch events stamped on arrival, the agent's log stamps, the worker's t= stamp.\n\n"
        + _table(trials, result, JOIN_SPLIT)
        + ("\n\nProblems:\n" + problems if problems else "")
    )


def summarize_cell(s: dict[str, Any]) -> str:
    return "n/a" if not s["n"] else f"{s['median']:.2f} ({s['low']:.2f}-{s['high']:.2f})"


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("autoscaler", __doc__, quick_help="1 run", reps_help="runs (default 3)")
    cli.add_argument(
        "--scheduler-max-backoff", type=positive_int, default=SCHEDULER_POD_MAX_BACKOFF_S,
        metavar="S", help="kube-scheduler podMaxBackoffSeconds for this run (the local control "
        f"plane's: {SCHEDULER_POD_MAX_BACKOFF_S}; Kubernetes' default: 10)",
    )  # fmt: skip
    bench = cli.parse(argv)
    max_backoff_s = int(bench.args.scheduler_max_backoff)
    load_before = os.getloadavg()[0]
    trials = run(bench.reps(3), max_backoff_s)
    result = summary(trials)
    text = markdown(trials, result, max_backoff_s, load_note(load_before, os.getloadavg()[0]))
    bench.write_section(
        "autoscaler",
        "Autoscaler: Pending pod to training at the larger size (local control plane)",
        text,
    )  # fmt: skip
    bench.show(text, result)
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
