"""``make demo``: elastic training on the local control plane, a node death, recovery.

Where it sits: the project's main job, on top of ``e2e.cluster`` (the real
control plane + process kubelet), ``e2e.operator_proc`` (the operator as its
own process), ``e2e.workload`` (the example job) and ``e2e.trainlog`` (what
the workers print). It says what it does at each stage, shows ``kubectl get
ej`` and the step/loss lines live, SIGKILLs one worker pod's agent and
workers (a machine dying), reports how long the survivors took to train
again and the group to grow back, and ends with the job ``Succeeded``.
Every wait is bounded; on any failure it prints where to look and exits 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

from e2e.cluster import Cluster, ensure_up
from e2e.cluster.layout import state_dir
from e2e.operator_proc import OperatorProcess, sigkill_pod_processes
from e2e.trainlog import LogFollower, progress_violations
from e2e.workload import TrainingJob, apply, apply_crd, get_job
from torchflex_operator.vocabulary import ConditionType, Phase

NAMESPACE = "torchflex-demo"
JOB = "demo"


class DemoError(RuntimeError):
    """A stage did not reach its goal in time."""


def say(text: str) -> None:
    print(f"\033[1m[demo]\033[0m {text}", flush=True)


class Demo:
    def __init__(self, cluster: Cluster, steps: int, timeout_s: float) -> None:
        self.cluster = cluster
        self.steps = steps
        self.deadline = time.monotonic() + timeout_s
        self.ckpt = cluster.layout.root / "ckpt" / NAMESPACE
        self.follower = LogFollower(cluster.layout.pods, NAMESPACE)
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
            time.sleep(0.2)
        raise DemoError(f"timed out waiting for {what}")

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
        job = TrainingJob(JOB, self.ckpt, min_replicas=2, max_replicas=3, steps=self.steps)
        apply(self.cluster, NAMESPACE, job.manifest())
        t_apply = time.monotonic()
        t_world3 = self.wait(
            "3 workers training", lambda: self.first_step_after(t_apply, 3) is not None, 240
        )
        say(
            f"4/6 training with world size 3 ({t_world3 - t_apply:.1f} s after apply, "
            "pods started, one rendezvous, torch imported)"
        )
        self.wait("step 40", lambda: self.follower.last_step() >= 40, 120)

        victim = f"{JOB}-worker-1"
        say(f"5/6 killing {victim}: SIGKILL of its agent and workers, like a machine dying")
        round_at_kill = max(s.round for s in self.follower.lines("step"))
        pids = sigkill_pod_processes(NAMESPACE, victim)
        t_kill = time.monotonic()
        if not pids:
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
            new_round = round_at_kill + 1
            t_back = self.wait(
                "the replacement pod joining (world size 3)",
                lambda: self.first_step_after(t_kill, 3, new_round) is not None,
                180,
            )
            regrow = (self.first_step_after(t_kill, 3, new_round) or t_back) - t_kill
            say(f"    operator replaced the pod; world size 3 again {regrow:.1f} s after the kill")
        else:
            regrow = recovered
            say(
                "    the operator's replacement pod joined within the last-call window, so the "
                "group re-formed straight at full size"
            )

        self.wait("the job to finish", lambda: Phase(self.phase() or "Pending").finished, 600)
        if self.phase() != Phase.SUCCEEDED:
            conds = get_job(self.cluster, NAMESPACE, JOB)["status"].get("conditions") or []
            failed = [c for c in conds if c.get("type") == ConditionType.FAILED]
            why = failed[0].get("message", "") if failed else ""
            raise DemoError(f"the job ended {self.phase()}: {why}")
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
    args = p.parse_args(argv)
    if args.steps < 60:
        p.error("--steps must be >= 60 (the kill happens at step 40)")

    t0 = time.monotonic()
    say(
        f"1/6 local control plane (real kube-apiserver, etcd, scheduler, controller-manager "
        f"and a process kubelet) in {state_dir()}"
    )
    cluster = ensure_up()
    say(f"    ready in {time.monotonic() - t0:.0f} s; KUBECONFIG={cluster.kubeconfig}")
    say("2/6 installing the ElasticJob CRD and starting torchflex-operator")
    apply_crd(cluster)
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s")
    cluster.kubectl("create", "namespace", NAMESPACE)
    ckpt = cluster.layout.root / "ckpt" / NAMESPACE
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    log = cluster.layout.logs / "operator-demo.log"
    op = OperatorProcess(cluster.kubeconfig, [NAMESPACE], log).start()
    say(f"    operator pid {op.proc.pid if op.proc else '?'}, log {log}")
    demo = Demo(cluster, args.steps, args.timeout)
    rc = 0
    try:
        with demo.follower:
            _wait_sa(cluster)
            demo.run()
    except (DemoError, KeyboardInterrupt) as exc:
        rc = 1
        say(f"FAILED: {exc}")
        say(f"    operator log: {log}; pod logs: {cluster.layout.pods}/{NAMESPACE}_*")
    finally:
        op.stop()
        if not args.keep:
            cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    say(
        f"done in {time.monotonic() - t0:.0f} s; the cluster stays up for the next run "
        f"(make cluster-down stops it)"
    )
    return rc


def _wait_sa(cluster: Cluster) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0:
            return
        time.sleep(0.2)
    raise DemoError(f"no default ServiceAccount in {NAMESPACE}")


if __name__ == "__main__":
    sys.exit(main())
