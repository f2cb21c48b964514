"""``make demo``: elastic training on the local control plane, a node death, recovery.

Where it sits: the project's main job, on top of ``e2e.cluster`` (the real
control plane + process kubelet), ``e2e.operator_proc`` (the operator as its
own process), ``e2e.workload`` (the example job) and ``e2e.trainlog`` (what
the workers print). It says what it does at each stage, shows ``kubectl get
ej`` and the step/loss lines live, SIGKILLs one worker pod's agent and
workers (a machine dying), reports how long the survivors took to train
again and the group to grow back, and ends with the job ``Succeeded``.
Every wait is bounded; on any failure it prints where to look and exits 1.
``--nodes real`` (``make demo NODES=real``) tells the same story on a real
node with the project's images (``e2e.demo_real``).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from e2e import demo_real, hostfiles
from e2e.cluster import Cluster, ensure_up
from e2e.cluster.layout import state_dir
from e2e.operator_proc import OperatorProcess, sigkill_pod_processes
from e2e.trainlog import LogFollower, progress_violations
from e2e.workload import TrainingJob, apply, apply_crd, get_job
from torchflex_operator.model.vocabulary import ConditionType, Phase

NAMESPACE = "torchflex-demo"
JOB = "demo"


class DemoError(RuntimeError):
    """A stage did not reach its goal in time."""


def say(text: str) -> None:
    print(f"\033[1m[demo]\033[0m {text}", flush=True)


class Demo:
    """The story; ``job``, ``pod_logs`` and ``kill`` say where it runs (the process
    kubelet, or a real node: e2e.demo_real)."""

    def __init__(
        self,
        cluster: Cluster,
        job: TrainingJob,
        timeout_s: float,
        *,
        pod_logs: Path,
        kill: Callable[[str], list[str]],
        start_limit_s: float = 240,
    ) -> None:
        self.cluster = cluster
        self.job = job
        self.steps = job.steps
        self.deadline = time.monotonic() + timeout_s
        self.kill = kill
        self.start_limit_s = start_limit_s
        # An earlier run's pods' logs may still be there (a real kubelet removes them later).
        self.follower = LogFollower(pod_logs, NAMESPACE, skip_existing=True)
        self._last_table = ""
        self._last_step_shown = 0

    # -- live view ---------------------------------------------------------
    def show(self) -> None:
        table = self.cluster.kubectl("get", "ej", JOB, "-n", NAMESPACE, check=False).stdout
        # Shown when a column other than AGE (the last) changes.
        rows = table.strip().splitlines()
        key = "\n".join(row.rsplit(None, 1)[0] for row in rows if row.strip())
        if rows and key != self._last_table:
            print("  " + "\n  ".join(rows), flush=True)
            self._last_table = key
        steps = [s for s in self.follower.lines("step") if s.rank == 0]
        if steps and steps[-1].step >= self._last_step_shown + 10:
            s = steps[-1]
            print(f"  rank 0: step={s.step} loss={s.loss:.4f} world={s.world}", flush=True)
            self._last_step_shown = s.step

    def wait(self, what: str, done: object, limit_s: float) -> float:
        """Poll ``done()`` while showing progress; returns when it became true."""
        assert callable(done)
        end = min(self.deadline, time.monotonic() + limit_s)
        while time.monotonic() < end:
            self.show()
            if done():
                return time.monotonic()
            # The table's PHASE column: a failed job ends the demo now, not at the limit.
            if Phase.FAILED in self._last_table.split():
                self.fail_with_reason()
            time.sleep(0.2)
        raise DemoError(f"timed out waiting for {what}")

    def fail_with_reason(self) -> None:
        conds = get_job(self.cluster, NAMESPACE, JOB)["status"].get("conditions") or []
        failed = [c for c in conds if c.get("type") == ConditionType.FAILED]
        why = failed[0].get("message", "") if failed else ""
        raise DemoError(f"the job ended {self.phase()}: {why}")

    def phase(self) -> str:
        status = get_job(self.cluster, NAMESPACE, JOB).get("status") or {}
        return str(status.get("phase", ""))

    def first_step_after(self, t: float, world: int, min_round: int = -1) -> float | None:
        times = [
            s.seen
            for s in self.follower.lines("step")
            if s.world == world and s.seen > t and s.round >= min_round
        ]
        return min(times) if times else None

    # -- the story ---------------------------------------------------------
    def run(self) -> None:
        say(
            f"3/6 applying ElasticJob '{JOB}': min 2, max 3 pods, c10d rendezvous, "
            f"{self.steps} steps of examples/train_elastic.py, checkpoint every 10 steps"
        )
        apply(self.cluster, NAMESPACE, self.job.manifest())
        t_apply = time.monotonic()
        t_world3 = self.wait(
            "3 workers training",
            lambda: self.first_step_after(t_apply, 3) is not None,
            self.start_limit_s,
        )
        say(
            f"4/6 training with world size 3 ({t_world3 - t_apply:.1f} s after apply, "
            "pods started, one rendezvous, torch imported)"
        )
        self.wait("step 40", lambda: self.follower.last_step() >= 40, 120)

        victim = f"{JOB}-worker-1"
        say(f"5/6 killing {victim}: SIGKILL of its agent and workers, like a machine dying")
        round_at_kill = max(s.round for s in self.follower.lines("step"))
        killed = self.kill(victim)
        t_kill = time.monotonic()
        if not killed:
            raise DemoError(f"found no processes of {victim}")
        at_step = self.follower.last_step()

        def reformed() -> tuple[float, int] | None:
            later = [s for s in self.follower.lines("step") if s.round > round_at_kill]
            first = min(later, key=lambda s: s.seen) if later else None
            return (first.seen, first.world) if first else None

        self.wait("the survivors training again", lambda: reformed() is not None, 120)
        seen, world = reformed() or (t_kill, 0)
        recovered = seen - t_kill
        say(
            f"    re-formed and trained again at world size {world} {recovered:.2f} s after "
            f"the kill (killed at step {at_step}; resumed from the last checkpoint)"
        )
        if world < 3:
            new_round, shown = round_at_kill + 1, "operator replaced the pod; world size 3 again"
            # On a busy machine the survivors can finish every step before the
            # replacement has imported torch: then there is no regrow to show.
            t_back = self.wait(
                "the replacement pod joining (world size 3)",
                lambda: (
                    self.first_step_after(t_kill, 3, new_round) is not None
                    or Phase.SUCCEEDED in self._last_table.split()
                ),
                180,
            )
            joined = self.first_step_after(t_kill, 3, new_round)
            regrow = (joined or t_back) - t_kill
            if joined is not None:
                say(f"    {shown} {regrow:.1f} s after the kill")
            else:
                say(
                    f"    the survivors finished all {self.steps} steps {regrow:.1f} s after the "
                    "kill, before the replacement pod started training (a busy machine)"
                )
        else:
            regrow = recovered
            say(
                "    the operator's replacement pod joined within the last-call window, so the "
                "group re-formed straight at full size"
            )

        self.wait("the job to finish", lambda: Phase(self.phase() or "Pending").finished, 600)
        if self.phase() != Phase.SUCCEEDED:
            self.fail_with_reason()
        self.follower.poll()
        problems = progress_violations(self.follower.lines())
        status = get_job(self.cluster, NAMESPACE, JOB)["status"]
        say(
            f"6/6 job Succeeded at step {self.follower.last_step()}: "
            f"{status.get('replacements', 0)} pod replaced, {status.get('failures', 0)} "
            f"counted failure(s), rendezvous round {status.get('rendezvousRound')}"
        )
        rounds = sorted({s.round for s in self.follower.lines("step")})
        say(f"    rounds that trained: {rounds}; recovery {recovered:.2f} s; regrow {regrow:.1f} s")
        if problems:
            raise DemoError("training invariants broken: " + "; ".join(problems))
        say("    no step trained twice at once, no resume behind a checkpoint")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--timeout", type=float, default=900, help="overall limit in seconds")
    p.add_argument("--keep", action="store_true", help="leave the demo namespace in place")
    p.add_argument(
        "--nodes",
        choices=["process", "real"],
        default="process",
        help="where the pods run: the process kubelet (default) or a real node (kubelet + "
        "containerd, the project's images; e2e.demo_real)",
    )
    args = p.parse_args(argv)
    hostfiles.ensure_loopback_names()  # torch's peer-name lookups on the host stay in the file
    if args.steps < 60:
        p.error("--steps must be >= 60 (the kill happens at step 40)")

    t0 = time.monotonic()
    nodes = "a process kubelet" if args.nodes == "process" else "a real node (kubelet + containerd)"
    say(
        f"1/6 local control plane (real kube-apiserver, etcd, scheduler, controller-manager "
        f"and {nodes}) in {state_dir()}"
    )
    cluster = ensure_up()
    real = None
    if args.nodes == "real":
        say("    the real node, the local registry, the project's images from docker/ (buildah)")
        real = demo_real.prepare(cluster)
        say(f"    operator image {demo_real.describe(real.operator)}")
        say(f"    agent image {demo_real.describe(real.agent)}")
    say(f"    ready in {time.monotonic() - t0:.0f} s; KUBECONFIG={cluster.kubeconfig}")
    apply_crd(cluster)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")
    cluster.kubectl("create", "namespace", NAMESPACE)
    ckpt = cluster.layout.root / "ckpt" / NAMESPACE
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    job = TrainingJob(JOB, ckpt, min_replicas=2, max_replicas=3, steps=args.steps)
    stop: Callable[[], None]
    if real is None:
        say("2/6 installing the ElasticJob CRD and starting torchflex-operator")
        log = cluster.layout.logs / "operator-demo.log"
        op = OperatorProcess(cluster.kubeconfig, [NAMESPACE], log).start()
        say(f"    operator pid {op.proc.pid if op.proc else '?'}, log {log}")
        stop, logs = op.stop, f"operator log: {log}; pod logs: {cluster.layout.pods}/{NAMESPACE}_*"
        demo = Demo(cluster, job, args.timeout, pod_logs=cluster.layout.pods, kill=kill_processes)
    else:
        say(f"2/6 installing the ElasticJob CRD and torchflex-operator: helm install, {NAMESPACE}")
        demo_real.checkpoint_dir(ckpt)
        release = demo_real.OperatorRelease(cluster, NAMESPACE, real.operator)
        release.install()
        stop = release.uninstall
        logs = f"operator: kubectl logs -n {NAMESPACE} deploy/{demo_real.RELEASE}; pod logs: "
        logs += str(real.node.paths.pod_logs)
        job = dataclasses.replace(job, image=real.agent.reference, node=real.node.name)
        pod_logs = real.node.paths.pod_logs

        def kill(pod: str) -> list[str]:
            assert real is not None
            return demo_real.kill_pod_containers(cluster, real.node, NAMESPACE, pod)

        # The first start pulls the agent image (GBs) onto the node.
        demo = Demo(cluster, job, args.timeout, pod_logs=pod_logs, kill=kill, start_limit_s=600)
    rc = 0
    try:
        with demo.follower:
            _wait_sa(cluster)
            demo.run()
    except (DemoError, KeyboardInterrupt) as exc:
        rc = 1
        say(f"FAILED: {exc}")
        say(f"    {logs}")
    finally:
        stop()
        if not args.keep:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    say(
        f"done in {time.monotonic() - t0:.0f} s; the cluster stays up for the next run "
        f"(make cluster-down stops it)"
    )
    return rc


def kill_processes(pod: str) -> list[str]:
    """The process kubelet's pod: SIGKILL its agent and workers."""
    return [str(pid) for pid in sigkill_pod_processes(NAMESPACE, pod)]


def _wait_sa(cluster: Cluster) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise DemoError(f"no default ServiceAccount in {NAMESPACE}")


if __name__ == "__main__":
    sys.exit(main())
