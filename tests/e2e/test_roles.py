"""Multi-role jobs (spec.roles, both couplings) on the local control plane.

Real operator process, real agents and torch workers (CPU, gloo) on the process
kubelet: two roles each run ``examples/train_elastic.py`` in a rendezvous of their own
(``<rdzv-id>.<role>``), both through the job's one store pod. The trainer role is the
completion role: its final round exiting 0 completes the job, and the readers, still
running, are stopped. A reader's death re-forms the readers only, and ``kubectl scale``
(the scale role: reader) adds a reader only, promoting the readers' warm spare. A
frozen reader is fenced and replaced without the trainers noticing. A Joint job
(``examples/roles/ps_rpc.py``: a parameter server and two trainers over RPC) re-forms
every role when one member dies, resumes from the server's checkpoint, and completes
when its final joint round does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.kubelet import faults
from e2e.operator_proc import OperatorProcess, sigkill_pod_processes, wait_gone
from e2e.trainlog import Line, LogFollower
from e2e.workload import (
    CKPT_MOUNT,
    TrainingJob,
    apply,
    get_job,
    job_events,
    role_entry,
    roles_manifest,
    worker_pods,
)
from tests.e2e.checks import uid_of, wait_phase
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)


def role_pods(cluster: Cluster, namespace: str, name: str, role: str) -> list[dict[str, Any]]:
    return [
        p
        for p in worker_pods(cluster, namespace, name)
        if p["metadata"]["name"].startswith(f"{name}-{role}-")
    ]


def test_two_independent_roles_train_and_the_completion_role_completes_the_job(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    trainer = TrainingJob("duo", ckpt_dir, min_replicas=2, max_replicas=2, steps=60)
    # The readers would train far longer: they are stopped when the trainers are done.
    reader = TrainingJob("duo", ckpt_dir, min_replicas=1, max_replicas=3, replicas=1, steps=100000)
    manifest = roles_manifest("duo", role_entry("trainer", trainer), role_entry("reader", reader))
    apply(cluster, namespace, manifest)

    wait_phase(cluster, namespace, "duo", "Succeeded", 300)

    steps = follower.lines("step")
    trainers = [s for s in steps if s.pod.startswith("duo-trainer-")]
    readers = [s for s in steps if s.pod.startswith("duo-reader-")]
    # Each role trained in a group of its own size: two trainers, one reader.
    assert {s.world for s in trainers} == {2}, sorted({(s.pod, s.world) for s in trainers})
    assert {s.rank for s in trainers if s.step == 60} == {0, 1}
    assert readers and {s.world for s in readers} == {1}
    assert max(s.step for s in readers) < 100000
    status = get_job(cluster, namespace, "duo")["status"]
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == "True", succeeded
    assert [r["name"] for r in status["roles"]] == ["trainer", "reader"]
    # The readers are stopped (cleanPodPolicy Running): none is left running.
    wait_for(
        lambda: all(
            p.get("status", {}).get("phase") in ("Succeeded", "Failed")
            or p["metadata"].get("deletionTimestamp")
            for p in role_pods(cluster, namespace, "duo", "reader")
        ),
        60,
        "no reader pod left running",
    )


def role_steps(follower: LogFollower, role: str) -> list[Line]:
    return [s for s in follower.lines("step") if s.pod.startswith(f"duo-{role}-")]


def two_of_each_training(follower: LogFollower) -> tuple[int, int]:
    """Wait until two trainers and two readers train; the trainers' and readers' rounds."""
    wait_for(
        lambda: (
            any(s.world == 2 for s in role_steps(follower, "trainer"))
            and any(s.world == 2 for s in role_steps(follower, "reader"))
        ),
        240,
        "trainers and readers training, two of each",
    )
    trainer_round = max(s.round for s in role_steps(follower, "trainer"))
    return trainer_round, max(s.round for s in role_steps(follower, "reader"))


def test_a_reader_killed_re_forms_the_readers_only_and_scale_adds_a_reader(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    # Trainers long enough (60 s at full speed) for a kill and a scale to happen first.
    trainer = TrainingJob("duo", ckpt_dir, min_replicas=2, max_replicas=2, steps=600)
    reader = TrainingJob("duo", ckpt_dir, min_replicas=1, max_replicas=3, steps=100000)
    readers = role_entry("reader", reader) | {"warmSpares": 1}  # a spare of the readers only
    manifest = roles_manifest(
        "duo", role_entry("trainer", trainer), readers, scaleRole="reader", replicas=2
    )
    apply(cluster, namespace, manifest)
    trainer_round, reader_round = two_of_each_training(follower)

    pids = sigkill_pod_processes(namespace, "duo-reader-1")
    assert pids and wait_gone(pids), "the reader's agent and worker still alive"
    # The readers re-form in a later round of their own ...
    wait_for(
        lambda: any(s.round > reader_round for s in role_steps(follower, "reader")),
        120,
        f"readers training in a round after {reader_round}",
    )
    # ... and kubectl scale (scaleRole: reader) adds a reader, no trainer: the readers'
    # warm spare, promoted.
    wait_for(
        lambda: get_job(cluster, namespace, "duo")["status"].get("warmSpares") == 1,
        120,
        "the readers' warm spare running",
    )
    cluster.kubectl("scale", "ej", "duo", "-n", namespace, "--replicas=3")
    wait_for(
        lambda: "SparePromoted" in [e["reason"] for e in job_events(cluster, namespace, "duo")],
        60,
        "the readers' spare promoted",
    )
    assert any(
        p["metadata"]["name"] == "duo-reader-2"
        for p in role_pods(cluster, namespace, "duo", "reader")
    )
    assert sorted(
        p["metadata"]["name"] for p in role_pods(cluster, namespace, "duo", "trainer")
    ) == [
        "duo-trainer-0",
        "duo-trainer-1",
    ]
    wait_phase(cluster, namespace, "duo", "Succeeded", 300)
    # The trainers never left their first round: a reader's death is not theirs.
    trained = role_steps(follower, "trainer")
    assert {s.round for s in trained} == {trainer_round}
    assert {s.rank for s in trained if s.step == 600} == {0, 1}
    status = get_job(cluster, namespace, "duo")["status"]
    assert status["lastFailure"]["pod"] == "duo-reader-1", status.get("lastFailure")


def test_a_frozen_reader_is_fenced_and_replaced_while_the_trainers_train_on(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    """SIGSTOP of a reader pod's whole process tree (a frozen node): the readers declare
    it lost and re-form without it, the operator fences and replaces the pod, and the
    trainers' round, processes and step sequence never move."""
    trainer = TrainingJob("duo", ckpt_dir, min_replicas=2, max_replicas=2, steps=600)
    reader = TrainingJob("duo", ckpt_dir, min_replicas=1, max_replicas=3, replicas=2,
                         steps=100000)  # fmt: skip
    manifest = roles_manifest("duo", role_entry("trainer", trainer), role_entry("reader", reader))
    apply(cluster, namespace, manifest)
    trainer_round, reader_round = two_of_each_training(follower)
    old_uid = uid_of(cluster, namespace, "duo-reader-1")
    frozen = faults.freeze_pod(cluster.layout.pods, namespace, "duo-reader-1")
    try:
        wait_for(
            lambda: any(
                s.round > reader_round and s.pod == "duo-reader-0"
                for s in role_steps(follower, "reader")
            ),
            120,
            f"the surviving reader training in a round after {reader_round}",
        )
        # The frozen pod is fenced (deleted); while it is still terminating its
        # replacement takes the next free index.
        wait_for(
            lambda: any(
                p["metadata"]["uid"] != old_uid
                and p["metadata"]["name"] != "duo-reader-0"
                and p.get("status", {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                for p in role_pods(cluster, namespace, "duo", "reader")
            ),
            120,
            "a replacement reader running",
        )
    finally:
        faults.thaw(frozen)
    wait_phase(cluster, namespace, "duo", "Succeeded", 300)
    trained = role_steps(follower, "trainer")
    assert {s.round for s in trained} == {trainer_round}
    for rank in (0, 1):
        steps = [s.step for s in trained if s.rank == rank]
        assert steps[0] <= 1 and steps == list(range(steps[0], 601)), (rank, steps[:3], steps[-3:])
    status = get_job(cluster, namespace, "duo")["status"]
    assert status["replacements"] >= 1, status
    assert "FencedPod" in [e["reason"] for e in job_events(cluster, namespace, "duo")]


PS_SCRIPT = "examples/roles/ps_rpc.py"


def ps_role_entry(name: str, replicas: int, steps: int, ckpt_dir: Path) -> dict[str, Any]:
    """One role of the parameter-server example (Joint), the server's checkpoint on the
    job's hostPath; RPC (TensorPipe) on the pod's own interface, no name lookup."""
    job = TrainingJob("joint", ckpt_dir, min_replicas=replicas, max_replicas=replicas)
    entry = role_entry(name, job)
    container = entry["template"]["spec"]["containers"][0]
    container["command"] = [
        "python", PS_SCRIPT, "--steps", str(steps), "--step-time", "0.2",
        "--ckpt-dir", f"{CKPT_MOUNT}/ps", "--ckpt-every", "5",
    ]  # fmt: skip
    container["env"] = [{"name": "TP_SOCKET_IFNAME", "value": "eth0"}]
    return entry


def lines_of(follower: LogFollower, kind: str, role: str) -> list[Line]:
    return [s for s in follower.lines(kind) if s.pod.startswith(f"joint-{role}-")]


def replacement_events(cluster: Cluster, namespace: str, pod: str) -> set[str]:
    """Reasons of the joint job's Events that replaced ``pod`` (PodFailed, FencedPod).

    A SIGKILLed member's pod is replaced on whichever the operator sees first: the pod
    ended (PodFailed, counted) or a peer's report of its member lost with no agent
    answering (FencedPod, not counted: the freeze path, which cannot tell the two
    apart). Which one is a race the test does not control, so counts follow the Event."""

    def seen() -> set[str]:
        return {
            str(e["reason"])
            for e in job_events(cluster, namespace, "joint")
            if e.get("reason") in ("PodFailed", "FencedPod") and pod in str(e.get("message"))
        }

    # The operator posts a pass's Events just after the status write that carries them.
    wait_for(lambda: bool(seen()), 30, f"a PodFailed or FencedPod Event for {pod}")
    return seen()


def test_a_joint_job_re_forms_every_role_resumes_from_the_server_s_checkpoint_and_completes(
    cluster: Cluster,
    namespace: str,
    operator_proc: OperatorProcess,
    follower: LogFollower,
    ckpt_dir: Path,
) -> None:
    """Joint (the RFC's parameter server over RPC): one group across roles. SIGKILL of
    the server re-forms every role, the new server resumes from its checkpoint and the
    trainers go on from the step after it (counted as the replacement's Event says); a
    trainer's SIGKILL later re-forms every role again; the job completes once every
    member of the final joint round (server and trainers) exited 0."""
    steps = 150
    manifest = roles_manifest(
        "joint",
        ps_role_entry("trainer", 2, steps, ckpt_dir),
        ps_role_entry("ps", 1, steps, ckpt_dir),
        coupling="Joint",
    )
    apply(cluster, namespace, manifest)

    wait_for(
        lambda: any(c.step >= 10 for c in lines_of(follower, "checkpoint", "ps")),
        300,
        "the server's checkpoint of step 10",
    )
    trained = lines_of(follower, "step", "trainer")
    assert trained and {s.world for s in trained} == {3}, sorted({s.world for s in trained})
    first_round = max(s.round for s in trained)
    saved = max(c.step for c in lines_of(follower, "checkpoint", "ps"))
    pids = sigkill_pod_processes(namespace, "joint-ps-0")
    assert pids and wait_gone(pids), "the server's agent and worker still alive"

    # Every role re-forms: the trainers (whose processes were not touched) train again
    # in a later round, from the step after the checkpoint the new server loaded.
    wait_for(
        lambda: any(s.round > first_round for s in lines_of(follower, "step", "trainer")),
        240,
        f"trainers training in a round after {first_round}",
    )
    loaded = [r.step for r in lines_of(follower, "resumed", "ps")]
    assert loaded and all(r >= saved and r % 5 == 0 for r in loaded), (loaded, saved)
    after = [s for s in lines_of(follower, "step", "trainer") if s.round > first_round]
    resumed = min(s.step for s in after) - 1
    assert resumed in loaded, (sorted({s.step for s in after})[:5], loaded)
    ps_seen = replacement_events(cluster, namespace, "joint-ps-0")
    status = get_job(cluster, namespace, "joint")["status"]
    assert status["lastFailure"]["pod"] == "joint-ps-0", status.get("lastFailure")
    ps_counted = int("PodFailed" in ps_seen)
    assert status["failures"] == ps_counted, (ps_seen, status)

    # A trainer's death re-forms every role again; the job still completes.
    second_round = max(s.round for s in lines_of(follower, "step", "trainer"))
    wait_for(
        lambda: any(
            s.round >= second_round and s.step >= resumed + 10
            for s in lines_of(follower, "step", "trainer")
        ),
        120,
        "trainers 10 steps past the resume",
    )
    pids = sigkill_pod_processes(namespace, "joint-trainer-1")
    assert pids and wait_gone(pids), "the trainer's agent and worker still alive"
    wait_phase(cluster, namespace, "joint", "Succeeded", 360)

    status = get_job(cluster, namespace, "joint")["status"]
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert "all 3 member(s) of rendezvous round" in succeeded["message"], succeeded
    # Counted or not as for the server: the count follows the Event (replacement_events).
    trainer_seen = replacement_events(cluster, namespace, "joint-trainer-1")
    assert trainer_seen, "no PodFailed or FencedPod Event for joint-trainer-1"
    want = ps_counted + ("PodFailed" in trainer_seen)
    assert status["failures"] == want, (ps_seen, trainer_seen, status)
    assert status["lastFailure"]["pod"] == "joint-trainer-1", status["lastFailure"]
    assert [r["name"] for r in status["roles"]] == ["trainer", "ps"]
    last = [s for s in lines_of(follower, "step", "trainer") if s.step == steps]
    assert len({s.rank for s in last}) == 2 and {s.world for s in last} == {3}, last
