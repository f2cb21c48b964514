"""Goodput with one slow node: torchflex's straggler policy on and off, and torchrun.

Where it sits: ``python -m benchmarks.straggler`` (also run by ``make bench``).
Local control plane (``e2e.cluster``: real API server and scheduler, the real
``torchflex-operator``, pods as processes on the process kubelet). The job: min
2, max 3 pods, one CPU/gloo worker each running ``tests/e2e/stall_train.py``
(the example's loop with a wider model, ``WIDTH=384``, and no pacing, so each
step is compute-bound). Each launcher, one job at a time:

1. apply it; wait until all 3 pods train at world size 3, then measure the
   steps per second over ``--baseline`` seconds;
2. put one pod's whole process tree under a CPU quota of 0.1 CPU
   (``e2e.throttle``: a cgroup, as a container's CPU limit), never the pod
   holding rank 0, for ``--window`` seconds;
3. goodput over the window: new steps (past the highest step before the
   window: steps redone after a restart from a checkpoint do not count), and
   samples (each new step times the world size it ran at).

Launchers: ``torchflex-replace`` (``stragglerPolicy: Replace``: the slow pod is
named, deleted, its node avoided, and the job trains on at world 2),
``torchflex-ignore`` (named only, the default), ``torchrun`` (a plain
``torchrun`` command under the operator; nothing sees the straggler).

Writes its section of ``benchmarks/RESULTS.md`` (not with ``--quick``);
``--json`` prints one JSON object.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cli import BenchCli
from benchmarks.report import markdown_table
from e2e import throttle
from e2e.cluster import Cluster, ensure_up
from e2e.kubelet import records
from e2e.operator_proc import OperatorProcess
from e2e.polling import poll_until
from e2e.trainlog import LogFollower
from e2e.workload import TrainingJob, apply, apply_crd

FLAVORS = ("torchflex-replace", "torchflex-ignore", "torchrun")
NAMESPACE = "bench-straggler"
SCRIPT = "tests/e2e/stall_train.py"
CPUS = 0.1
_START_TIMEOUT = 300.0


@dataclasses.dataclass
class Trial:
    flavor: str
    baseline_sps: float | None = None
    window_steps: int = 0
    window_samples: int = 0
    window_s: float = 0.0
    world_after: int | None = None
    problem: str | None = None

    @property
    def sps(self) -> float | None:
        return self.window_steps / self.window_s if self.window_s else None


def _job(flavor: str, name: str, ckpt: Path) -> dict[str, Any]:
    job = TrainingJob(
        name,
        ckpt,
        min_replicas=2,
        max_replicas=3,
        steps=1_000_000,
        step_time_s=0.0,
        ckpt_every=500,
        max_restarts=100,
        script=SCRIPT,
        torchrun=flavor == "torchrun",
        extra_env=(("WIDTH", "384"),),
    )
    manifest = job.manifest()
    if flavor == "torchflex-replace":
        manifest["spec"]["stragglerPolicy"] = "Replace"
    return manifest


def _top(follower: LogFollower) -> int:
    return max((ln.step for ln in follower.lines("step")), default=0)


def run_trial(cluster: Cluster, flavor: str, baseline: float, window: float) -> Trial:
    trial = Trial(flavor)
    name = flavor.replace("torchflex-", "tf-")
    ckpt = cluster.layout.root / "ckpt" / NAMESPACE / name
    ckpt.mkdir(parents=True, exist_ok=True)
    with LogFollower(cluster.layout.pods, NAMESPACE, skip_existing=True) as follower:
        apply(cluster, NAMESPACE, _job(flavor, name, ckpt))
        try:
            at3 = lambda: any(ln.world == 3 for ln in follower.lines("step"))  # noqa: E731
            if not poll_until(at3, _START_TIMEOUT, 0.5):
                trial.problem = "never trained at world 3"
                return trial
            time.sleep(5.0)
            s0, t0 = _top(follower), time.monotonic()
            time.sleep(baseline)
            trial.baseline_sps = (_top(follower) - s0) / (time.monotonic() - t0)
            slow = _victim(follower, name)
            tree = records.pod_tree(records.find(cluster.layout.pods, NAMESPACE, slow))
            before, start = _top(follower), time.monotonic()
            with throttle.throttled([p.pid for p in tree], cpus=CPUS):
                time.sleep(window)
                trial.window_s = time.monotonic() - start
            new: dict[int, int] = {}
            for ln in follower.lines("step"):
                if ln.step > before and ln.seen <= start + trial.window_s:
                    new[ln.step] = max(new.get(ln.step, 0), ln.world)
            trial.window_steps = len(new)
            trial.window_samples = sum(new.values())
            trial.world_after = new[max(new)] if new else None
            return trial
        finally:
            cluster.kubectl("delete", "elasticjob", name, "-n", NAMESPACE, "--wait=true",
                            "--timeout=120s", check=False, timeout=150)  # fmt: skip


def _victim(follower: LogFollower, name: str) -> str:
    """A pod training at world 3 that does not hold rank 0."""
    lines = [ln for ln in follower.lines("step") if ln.world == 3]
    newest = max(ln.round for ln in lines)
    pods = sorted({ln.pod for ln in lines if ln.round == newest and ln.rank != 0})
    return pods[-1] if pods else f"{name}-worker-1"


def markdown(trials: list[Trial], window: float) -> str:
    rows = []
    for t in trials:
        if t.problem:
            rows.append([t.flavor, "n/a", "n/a", "n/a", "n/a", t.problem])
            continue
        base = t.baseline_sps or 0.0
        sps = t.sps or 0.0
        rows.append([
            t.flavor, f"{base:.1f}", f"{sps:.1f}", f"{t.window_samples}",
            str(t.world_after or "n/a"), f"{sps / base:.2f}" if base else "n/a",
        ])  # fmt: skip
    table = markdown_table(
        ["launcher", "steps/s before (all fast)", f"steps/s over {window:.0f} s, one pod slow",
         "samples (steps x world) in the window", "world size at the end",
         "goodput kept (steps/s)"],
        rows,
    )  # fmt: skip
    return f"""{table}

The job: min 2, max 3 pods, one worker each (`{SCRIPT}` with `WIDTH=384` and no step
pacing, so every step is compute-bound; gloo on CPU), on the local control plane with
the real operator. After the steps per second at world 3 are measured, one pod (never
rank 0's) runs under a CPU quota of {CPUS} CPU (a cgroup with CFS bandwidth control, as a
container's CPU limit) for the window. Goodput counts each step past the highest step
before the window once (steps redone after a restart from a checkpoint do not count);
samples weigh each step by the world size it ran at. `torchflex-replace`:
`stragglerPolicy: Replace` (the agents name the pod once its forwards take 2x the
others' for three 10 s windows, the operator deletes it and avoids its node; the group
re-forms at world 2 and its replacement stays Pending on this one-node cluster);
`torchflex-ignore`: the default (named in status only); `torchrun`: a plain `torchrun`
command (c10d, `--max-restarts 100`) under the operator. The last column is the window's
steps per second over the rate before it."""


def main(argv: list[str] | None = None) -> int:
    cli = BenchCli("straggler", __doc__, quick_help="a 60 s window", reps_help="unused")
    cli.add_subset("--flavors", FLAVORS)
    cli.add_argument("--window", type=float, default=120.0, help="seconds one pod is slow")
    cli.add_argument("--baseline", type=float, default=20.0, help="seconds measured before")
    bench = cli.parse(argv)
    args = bench.args
    window = 60.0 if bench.quick else args.window
    if (why := throttle.available()) is not None:
        print(f"[straggler] cannot throttle here: {why}", file=sys.stderr)
        return 1
    cluster = ensure_up()
    apply_crd(cluster)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    log = cluster.layout.logs / f"operator-{NAMESPACE}.log"
    op = OperatorProcess(cluster.kubeconfig, [NAMESPACE], log).start()
    trials = []
    try:
        for flavor in args.flavors:
            trial = run_trial(cluster, flavor, args.baseline, window)
            trials.append(trial)
            print(f"[straggler] {flavor}: {trial}", file=sys.stderr, flush=True)
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    body = markdown(trials, window)
    bench.write_section("straggler", "Goodput with one slow node (local control plane)", body)
    bench.show(body, {"trials": [dataclasses.asdict(t) for t in trials]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
