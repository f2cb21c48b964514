"""Scenarios 10-14 (issue 11): members and the store go silent; a job ends while
rank 0 still saves.

Spot nodes rarely die cleanly: a VM freezes, a node drops off the network,
and nothing closes its sockets. Each scenario stages such a fault on the
real process tree or link of a pod (``e2e.kubelet.faults``, found through the
process kubelet's own records), with the real operator and real agents and
torch workers, and checks what a user relies on: no checkpoint ever goes
backwards (every checkpoint that lands on disk is recorded), training goes
on, and ``Succeeded`` means the final model is there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.kubelet import faults, records
from e2e.operator_proc import sigkill_pod_processes, wait_gone
from e2e.trainlog import CheckpointWatcher, LogFollower, parse_text
from e2e.workload import TrainingJob, apply, get_job, worker_pods
from tests.e2e.checks import (
    TERMINAL,
    assert_checkpoints_never_backwards,
    assert_progress_sound,
    checkpoint_step,
    current_round,
    event_reasons,
    pod_of_rank,
    uid_of,
    wait_event,
    wait_phase,
    wait_recreated,
    wait_reformed,
    wait_replaced,
    wait_training,
    wait_world,
)
from tests.support import wait_for
from torchflex_contract import labels

# Whole training runs on a 2-core machine: more than the suite's default limit.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture()
def watcher(ckpt_dir: Path) -> Iterator[CheckpointWatcher]:
    with CheckpointWatcher(ckpt_dir) as w:
        yield w


def _saves(log: Path) -> list[tuple[int, int]]:
    """(round, step) of every checkpoint one pod's log says it saved, in order."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = parse_text(text, log.parent.name)
    return [(ln.round, ln.step) for ln in lines if ln.kind == "checkpoint"]


def _report(what: str, seconds: float) -> None:
    # Shown with -s and in the junit output: what the scenario measured.
    print(f"[measured] {what}: {seconds:.1f} s")


@pytest.mark.usefixtures("operator_proc")
@pytest.mark.parametrize(
    ("name", "cut_network"), [("frozen", False), ("cutoff", True)], ids=["frozen", "cut-off"]
)
def test_silent_member_is_replaced_and_the_group_grows_back(
    cluster: Cluster,
    namespace: str,
    follower: LogFollower,
    watcher: CheckpointWatcher,
    ckpt_dir: Path,
    *,
    name: str,
    cut_network: bool,
) -> None:
    """A member goes silent (frozen, or cut off the network); survivors re-form,
    the operator replaces the pod, the group grows back and the job finishes
    with nothing lost."""
    # Long enough that the replacement (verdict, grace period, a new pod
    # importing torch) joins before the survivors alone finish the job.
    steps = 400
    job = TrainingJob(name, ckpt_dir, min_replicas=2, max_replicas=3, steps=steps)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 20, 240, world=3)
    # Not rank 0: the writer of checkpoints stays with the survivors here
    # (a silent rank 0 is the wake-up scenario below).
    victim = pod_of_rank(follower, 1)
    old_uid = uid_of(cluster, namespace, victim)
    round_at_fault = current_round(follower)

    frozen: faults.Frozen | None = None
    cut: records.PodRecord | None = None
    if cut_network:
        cut = faults.cut_pod_network(cluster.layout.pods, namespace, victim)
    else:
        frozen = faults.freeze_pod(cluster.layout.pods, namespace, victim)
    t_fault = time.monotonic()
    try:
        seen, world = wait_reformed(follower, round_at_fault, 90)
        assert world in (2, 3)
        _report(f"{name}: survivors training again after the fault", seen - t_fault)
        replaced = wait_replaced(cluster, namespace, name, victim, old_uid=old_uid, timeout_s=60)
        _report(f"{name}: silent pod replaced and Running", replaced - t_fault)
        back = wait_world(follower, 3, t_fault, 180, min_round=round_at_fault + 1)
        _report(f"{name}: group back at world size 3", back - t_fault)
    finally:
        if frozen is not None:
            faults.thaw(frozen)
        if cut is not None:
            faults.restore_pod_network(cut)
    wait_phase(cluster, namespace, name, "Succeeded", 400)

    assert_checkpoints_never_backwards(watcher, follower)
    assert_progress_sound(follower)
    assert checkpoint_step(ckpt_dir) == steps
    status = get_job(cluster, namespace, name)["status"]
    assert status["replacements"] >= 1
    wait_event(cluster, namespace, name, "FencedPod")


@pytest.mark.usefixtures("operator_proc")
def test_store_frozen_then_a_worker_killed_training_resumes(
    cluster: Cluster,
    namespace: str,
    follower: LogFollower,
    watcher: CheckpointWatcher,
    ckpt_dir: Path,
) -> None:
    name, steps = "stfrz", 200
    job = TrainingJob(name, ckpt_dir, min_replicas=2, max_replicas=3, steps=steps)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 20, 240, world=3)
    store = labels.store_pod_name(name)
    store_uid = uid_of(cluster, namespace, store)

    frozen = faults.freeze_pod(cluster.layout.pods, namespace, store)
    t_freeze = time.monotonic()
    try:
        # With the store silent, a member dies: the group can only re-form
        # once the agents have a store again. The store is not thawed here:
        # the operator has to replace it.
        victim = pod_of_rank(follower, 1)
        pids = sigkill_pod_processes(namespace, victim)
        assert pids and wait_gone(pids), f"{victim}'s processes did not die"
        replaced = wait_recreated(
            cluster, namespace, store, old_uid=store_uid, timeout_s=120,
            what="the frozen store pod replaced and running",
        )  # fmt: skip
        _report(f"{name}: store replaced and Running", replaced - t_freeze)
        resumed = wait_training(follower, 0, 180, after=time.monotonic())
        _report(f"{name}: training again after the store froze", resumed - t_freeze)
    finally:
        faults.thaw(frozen)
    wait_phase(cluster, namespace, name, "Succeeded", 400)

    assert_checkpoints_never_backwards(watcher, follower)
    assert checkpoint_step(ckpt_dir) == steps
    reasons = event_reasons(cluster, namespace, name)
    assert "StoreUnreachable" in reasons, reasons


@pytest.mark.usefixtures("operator_proc")
def test_job_succeeds_only_after_rank_0_saved_the_final_model(
    cluster: Cluster,
    namespace: str,
    follower: LogFollower,
    watcher: CheckpointWatcher,
    ckpt_dir: Path,
) -> None:
    name, steps = "final", 60
    job = TrainingJob(
        name,
        ckpt_dir,
        min_replicas=2,
        max_replicas=3,
        steps=steps,
        script="tests/e2e/final_model_train.py",
        extra_env=(("FINAL_SAVE_S", "6"),),
    )
    apply(cluster, namespace, job.manifest())
    final = ckpt_dir / "final.pt"

    def ended() -> str:
        got = str((get_job(cluster, namespace, name).get("status") or {}).get("phase", ""))
        # Checked at the first sight of the terminal phase, before anything
        # else can happen: Succeeded must already have the file.
        if got == "Succeeded":
            assert final.exists(), "job Succeeded while rank 0 was still saving the final model"
        return got if got in TERMINAL else ""

    wait_for(ended, 400, f"job {name} finished", 0.2)
    assert ended() == "Succeeded", get_job(cluster, namespace, name).get("status")
    follower.poll()
    saved = [ln for ln in follower.lines() if ln.kind == "step" and ln.step == steps]
    assert saved, "training never reached the last step"
    # The pod that held rank 0 finished on its own (exit 0), never stopped
    # by the cleanup while it saved.
    rank0 = pod_of_rank(follower, 0)
    pod = next(p for p in worker_pods(cluster, namespace, name) if p["metadata"]["name"] == rank0)
    term = pod["status"]["containerStatuses"][0]["state"].get("terminated") or {}
    assert term.get("exitCode") == 0, pod["status"]
    assert_checkpoints_never_backwards(watcher, follower)
    assert checkpoint_step(ckpt_dir) == steps


@pytest.mark.usefixtures("operator_proc")
def test_frozen_rank0_woken_after_the_group_reformed_never_writes_over_it(
    cluster: Cluster,
    namespace: str,
    follower: LogFollower,
    watcher: CheckpointWatcher,
    ckpt_dir: Path,
) -> None:
    name, steps = "wake", 200
    # A long grace period: the operator's delete must not SIGKILL the frozen
    # pod before the scenario wakes it (the SIGTERM waits, pending, as on a
    # frozen VM).
    job = TrainingJob(name, ckpt_dir, min_replicas=2, max_replicas=3, steps=steps, grace_s=60)
    apply(cluster, namespace, job.manifest())
    wait_training(follower, 30, 240, world=3)
    victim = pod_of_rank(follower, 0)
    round_at_freeze = current_round(follower)

    frozen = faults.freeze_pod(cluster.layout.pods, namespace, victim)
    t_freeze = time.monotonic()
    frozen_step = max(
        (ln.step for ln in follower.lines("checkpoint") if ln.pod == victim), default=0
    )
    # This very pod's log (its replacement will have the same name).
    victim_log = (
        cluster.layout.pods
        / f"{namespace}_{victim}_{frozen.record.uid}"
        / f"{labels.TRAINER_CONTAINER}.log"
    )
    try:
        wait_reformed(follower, round_at_freeze, 90)
        # The live group checkpoints past what the frozen rank 0 holds ...
        wait_for(
            lambda: any(
                ln.step > frozen_step and ln.round > round_at_freeze and ln.seen > t_freeze
                for ln in follower.lines("checkpoint")
            ),
            90,
            f"the re-formed group saving a checkpoint past step {frozen_step}",
        )
    finally:
        # ... and only then does the frozen member wake up, with its old
        # state, its pending SIGTERM and a collective that can never finish.
        saves_before = _saves(victim_log)
        woken = faults.thaw(frozen)
    t_thaw = time.monotonic()
    assert woken > 0, "the frozen member was gone before it could be woken"
    _report(f"{name}: thawed after", t_thaw - t_freeze)
    wait_for(
        lambda: not any(records.is_alive(p) for p in frozen.procs),
        90,
        "the woken member's processes ending",
    )

    # Saves from the round it was frozen in: its old state. (Once fenced, the
    # woken agent may rejoin in a new round and save that round's state.)
    stale = [
        (rnd, step)
        for rnd, step in _saves(victim_log)[len(saves_before) :]
        if rnd <= round_at_freeze
    ]
    assert not stale, f"the woken member saved its old state: (round, step) {stale}"
    wait_phase(cluster, namespace, name, "Succeeded", 400)
    assert_checkpoints_never_backwards(watcher, follower)
    assert checkpoint_step(ckpt_dir) == steps
    assert get_job(cluster, namespace, name)["status"]["phase"] == "Succeeded"
