"""Bounded waits and assertions shared by the e2e scenarios.

Where it sits: small helpers over ``e2e.workload`` (the API side) and
``e2e.trainlog`` (what the workers did), so each scenario reads as its story.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster import Cluster
from e2e.trainlog import (
    CheckpointWatcher,
    LogFollower,
    checkpoint_line_regressions,
    progress_violations,
)
from e2e.workload import PROCESS_NODE, get_job, job_events, worker_pods
from tests.support import wait_for


def phase(cluster: Cluster, ns: str, name: str) -> str:
    status: dict[str, Any] = get_job(cluster, ns, name).get("status") or {}
    return str(status.get("phase", ""))


TERMINAL = ("Succeeded", "Failed")


def wait_phase(cluster: Cluster, ns: str, name: str, want: str, timeout_s: float) -> None:
    """Wait for ``want``; fail at once if the job ends in the other terminal phase."""

    def reached() -> bool:
        status: dict[str, Any] = get_job(cluster, ns, name).get("status") or {}
        got = str(status.get("phase", ""))
        if got in TERMINAL and got != want:
            pytest.fail(
                f"job {name} ended {got}, expected {want}: {status.get('conditions')} "
                f"last failure: {status.get('lastFailure')}"
            )
        return got == want

    wait_for(reached, timeout_s, f"job {name} phase {want}", 0.5)


def wait_training(
    follower: LogFollower,
    past_step: int,
    timeout_s: float,
    world: int | None = None,
    after: float = 0.0,
) -> float:
    """Wait until some worker logged a step > ``past_step`` (in a group of ``world``,
    seen after ``after``); returns when it was seen (monotonic)."""

    def seen() -> float | None:
        for line in follower.lines("step"):
            if (
                line.step > past_step
                and (world is None or line.world == world)
                and line.seen > after
            ):
                return line.seen
        return None

    what = f"a step after {past_step}" + (f" with world size {world}" if world else "")
    wait_for(lambda: seen() is not None, timeout_s, what, 0.2)
    found = seen()
    assert found is not None
    return found


def wait_world(
    follower: LogFollower, world: int, after: float, timeout_s: float, min_round: int = -1
) -> float:
    """Wait for a step of a group of ``world`` seen after ``after`` in a round
    >= ``min_round`` (lines of an older round may still arrive); returns its time."""

    def seen() -> float | None:
        times = [
            ln.seen
            for ln in follower.lines("step")
            if ln.world == world and ln.seen > after and ln.round >= min_round
        ]
        return min(times) if times else None

    wait_for(lambda: seen() is not None, timeout_s, f"training at world size {world}", 0.2)
    found = seen()
    assert found is not None
    return found


def current_round(follower: LogFollower) -> int:
    return max((ln.round for ln in follower.lines("step")), default=-1)


def wait_reformed(follower: LogFollower, after_round: int, timeout_s: float) -> tuple[float, int]:
    """Wait for a step of a round later than ``after_round``; returns (seen, world size).

    Which size the group re-forms at depends on timing: if the operator's
    replacement joins within the last-call window, straight back to full size.
    """

    def first() -> tuple[float, int] | None:
        later = [ln for ln in follower.lines("step") if ln.round > after_round]
        if not later:
            return None
        line = min(later, key=lambda ln: ln.seen)
        return line.seen, line.world

    wait_for(lambda: first() is not None, timeout_s, f"training in a round after {after_round}")
    found = first()
    assert found is not None
    return found


def assert_no_step_lost(follower: LogFollower, round_at_evict: int) -> None:
    """After a worker left on SIGTERM in ``round_at_evict``: every rank stopped at the
    same step and rank 0 saved it, so the next round resumes from exactly the last
    step the old round trained (nothing lost, nothing redone)."""
    trained = max(ln.step for ln in follower.lines("step") if ln.round == round_at_evict)
    saved = [ln.step for ln in follower.lines("checkpoint") if ln.round == round_at_evict]
    assert saved and max(saved) == trained, f"trained to {trained}, saved {saved}"
    resumed = [ln.step for ln in follower.lines("resumed") if ln.round > round_at_evict]
    assert resumed and resumed[0] == trained, f"trained to {trained}, resumed from {resumed}"
    first_after = min(ln.step for ln in follower.lines("step") if ln.round > round_at_evict)
    assert first_after == trained + 1, f"steps lost or redone: next step {first_after}"


def assert_progress_sound(follower: LogFollower) -> None:
    follower.poll()
    problems = progress_violations(follower.lines())
    assert not problems, "\n".join(problems)


def assert_checkpoints_never_backwards(watcher: CheckpointWatcher, follower: LogFollower) -> None:
    """No checkpoint on disk replaced a newer one, and no pod logged a save
    behind one logged before it."""
    follower.poll()
    problems = watcher.regressions() + checkpoint_line_regressions(follower.lines())
    assert watcher.landed(), "no checkpoint was ever written"
    assert not problems, "\n".join(problems)


def pod_of_rank(follower: LogFollower, rank: int) -> str:
    """The pod whose worker trains as ``rank`` in the newest round that trained."""
    steps = follower.lines("step")
    newest = max(ln.round for ln in steps)
    pods = {ln.pod for ln in steps if ln.round == newest and ln.rank == rank}
    assert len(pods) == 1, f"rank {rank} in round {newest}: pods {sorted(pods)}"
    return pods.pop()


def wait_replaced(
    cluster: Cluster, ns: str, job: str, pod: str, *, old_uid: str, timeout_s: float
) -> float:
    """Wait until ``pod`` runs again under a new UID; returns when that was seen."""
    wait_for(
        lambda: any(
            p["metadata"]["name"] == pod
            and p["metadata"]["uid"] != old_uid
            and p.get("status", {}).get("phase") == "Running"
            for p in worker_pods(cluster, ns, job)
        ),
        timeout_s,
        f"{pod} replaced and running",
    )
    return time.monotonic()


def wait_recreated(
    cluster: Cluster, ns: str, pod: str, *, old_uid: str, timeout_s: float, what: str
) -> float:
    """Wait until the pod named ``pod`` (any role) is Running under a new UID; returns when."""

    def recreated() -> bool:
        out = cluster.kubectl(
            "get", "pod", pod, "-n", ns, "-o", "jsonpath={.metadata.uid} {.status.phase}",
            check=False,
        ).stdout.split()  # fmt: skip
        return len(out) == 2 and out[0] != old_uid and out[1] == "Running"

    wait_for(recreated, timeout_s, what)
    return time.monotonic()


def uid_of(cluster: Cluster, ns: str, pod: str) -> str:
    return str(cluster.get_json("pod", pod, "-n", ns)["metadata"]["uid"])


def event_reasons(cluster: Cluster, ns: str, name: str) -> list[str]:
    return [str(e.get("reason")) for e in job_events(cluster, ns, name)]


def wait_event(
    cluster: Cluster, ns: str, name: str, reason: str | tuple[str, ...], timeout_s: float = 30
) -> None:
    """Wait until the job has an Event of ``reason`` (or of any of several). The operator
    posts a pass's Events after the status write that carries them, so a phase or a world
    size seen in status or logs can come a moment before its Event."""
    wanted = {reason} if isinstance(reason, str) else set(reason)
    wait_for(
        lambda: wanted & set(event_reasons(cluster, ns, name)),
        timeout_s,
        f"a {' or '.join(sorted(wanted))} Event on {name}",
    )


def checkpoint_step(ckpt_dir: Path) -> int:
    """The step the newest checkpoint holds (0 if none), read with torch like the job does."""
    import torch

    path = ckpt_dir / "latest.pt"
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    return int(state["step"])


def settle(seconds: float) -> None:
    """Let the system act (only where a scenario must show that nothing happens)."""
    time.sleep(seconds)


def start_etcd_pod(cluster: Cluster, namespace: str, service: str) -> str:
    """A plain etcd v3 server pod (the pinned binary) behind a headless Service
    on the process node; returns its client endpoint. Its container env carries
    ``E2E_ETCD=<namespace>`` so a test can find (and SIGKILL) its process."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "etcd", "labels": {"app": service}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": PROCESS_NODE},
            "hostname": "etcd",
            "restartPolicy": "Always",
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "etcd",
                "image": "etcd:local",
                "command": [
                    str(cluster.bin_dir / "etcd"), "--data-dir", "/data",
                    "--listen-client-urls", "http://0.0.0.0:2379",
                    "--advertise-client-urls", f"http://{service}:2379",
                    "--listen-peer-urls", "http://127.0.0.1:2380",
                ],
                "env": [{"name": "E2E_ETCD", "value": namespace}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
        },
    }  # fmt: skip
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service},
        "spec": {"clusterIP": "None", "selector": {"app": service}, "ports": [{"port": 2379}]},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([pod, svc]))

    def running() -> bool:
        out = cluster.kubectl(
            "get", "pod", "etcd", "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
        )
        return out.stdout == "Running"

    wait_for(running, 60, "etcd pod running")
    return f"http://{service}.{namespace}:2379"
