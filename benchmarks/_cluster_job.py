"""One ElasticJob on the local control plane, watched closely, for ``benchmarks.recovery_cluster``.

Where it sits: the I/O half of the cluster-level recovery benchmark, over the
e2e machinery (``e2e.cluster``, ``e2e.workload``, ``e2e.operator_proc``). A
:class:`ClusterJob` applies the example job (``torchflex-agent`` or a plain
``torchrun`` command), reads every pod incarnation's container log as it
grows (the process kubelet keeps ``<ns>_<pod>_<uid>/trainer.log``), and a
:class:`PodWatch` records when each pod incarnation was first seen Running
(a watch on the API server, not polling). The arithmetic is in
``benchmarks._cluster_logs``.

Rules it keeps: it talks to the API server on loopback only, signals only the
processes of the pods it created (by PID, through ``e2e.operator_proc``),
and every wait and every server loop is bounded in time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks._cluster_logs import Event, parse_events
from benchmarks._proc_job import TORCHRUN_CONF, TORCHRUN_ENV
from e2e.cluster import Cluster
from e2e.polling import poll_until
from e2e.trainlog import FileTail
from e2e.workload import TrainingJob, apply
from torchflex_contract import labels

# Long enough to outlast any repetition: the job is deleted after measuring.
_STEPS = 100_000


@dataclasses.dataclass(frozen=True)
class BenchJob(TrainingJob):
    """``TrainingJob`` plus torchrun's ``--rdzv-conf`` (the "tuned" settings)."""

    rdzv_conf: str = ""

    def command(self) -> list[str]:
        cmd = super().command()
        if self.torchrun and self.rdzv_conf:
            at = next(i for i, a in enumerate(cmd) if a.startswith("--max-restarts"))
            cmd.insert(at, f"--rdzv-conf={self.rdzv_conf}")
        return cmd


def bench_job(flavor: str, name: str, ckpt: Path, replicas: int) -> BenchJob:
    """The benchmark's 3-node job (min 2, max 3) for ``flavor``, starting at ``replicas``.

    Settings match the process-level benchmark (``benchmarks._proc_job``):
    torchrun gets 100 restarts and ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
    "tuned" adds its fastest ``--rdzv-conf``; ``torchflex-spare`` is
    ``torchflex`` with one warm spare pod (``spec.warmSpares: 1``).
    """
    torchrun = flavor.startswith("torchrun")
    env = [("TRAIN_PRINT_TIME", "1"), ("OMP_NUM_THREADS", "1"), ("PYTHONWARNINGS", "ignore")]
    if torchrun:
        env += sorted(TORCHRUN_ENV.items())
    return BenchJob(
        name,
        ckpt,
        min_replicas=2,
        max_replicas=3,
        replicas=replicas,
        steps=_STEPS,
        step_time_s=0.1,
        ckpt_every=10,
        max_restarts=100,
        backoff_limit=20,
        grace_s=3,
        torchrun=torchrun,
        extra_env=tuple(env),
        rdzv_conf=TORCHRUN_CONF["tuned"] if flavor == "torchrun-tuned" else "",
        warm_spares=1 if flavor == "torchflex-spare" else 0,
    )


@dataclasses.dataclass(frozen=True)
class PodState:
    uid: str
    phase: str
    deleting: bool
    standby: bool
    """A warm spare (annotation ``torchflex.io/standby: "true"``): not a member yet."""


class PodWatch:
    """A namespace's pods as the API server shows them (list + watch in a thread).

    Keeps each pod's latest state and when each incarnation (name, uid) was
    first seen at all, bound to a node and Running, so the benchmark's waits
    never poll the API server.
    """

    def __init__(self, cluster: Cluster, namespace: str, limit_s: float) -> None:
        self._cluster = cluster
        self._ns = namespace
        self._deadline = time.monotonic() + limit_s
        self._lock = threading.Lock()
        self._pods: dict[str, PodState] = {}
        self._running: dict[tuple[str, str], float] = {}
        self._created: dict[tuple[str, str], float] = {}
        self._bound: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")

    def __enter__(self) -> PodWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def running_since(self, pod: str, uid: str) -> float | None:
        """Wall time the incarnation was first seen Running (None: not yet)."""
        with self._lock:
            return self._running.get((pod, uid))

    def marks(self, pod: str, uid: str) -> dict[str, float | None]:
        """When the incarnation was first seen (``created``), with a node (``bound``), Running."""
        key = (pod, uid)
        with self._lock:
            return {
                "created": self._created.get(key),
                "bound": self._bound.get(key),
                "running": self._running.get(key),
            }

    def pods(self, prefix: str) -> dict[str, PodState]:
        with self._lock:
            return {n: s for n, s in self._pods.items() if n.startswith(prefix)}

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.CoreV1Api(self._cluster.api_client())
        # Each list + watch lasts at most ~5 s; the loop ends with the run.
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            w = watch.Watch()
            try:
                listed = api.list_namespaced_pod(self._ns, _request_timeout=10)
                with self._lock:
                    self._pods = {}
                for pod in listed.items:
                    self._saw("ADDED", pod)
                version = listed.metadata.resource_version if listed.metadata else None
                for ev in w.stream(
                    api.list_namespaced_pod,
                    self._ns,
                    resource_version=version,
                    timeout_seconds=5,
                    _request_timeout=10,
                ):
                    self._saw(str(ev["type"]), ev["object"])
                    if self._stop.is_set():
                        w.stop()
            except Exception:  # a dropped watch or an expired version: list again
                self._stop.wait(0.5)

    def _saw(self, kind: str, pod: Any) -> None:
        name, uid = str(pod.metadata.name), str(pod.metadata.uid)
        phase = str(pod.status.phase) if pod.status is not None else ""
        now = time.time()
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
                return
            standby = (pod.metadata.annotations or {}).get(labels.Annotation.STANDBY) == "true"
            deleting = pod.metadata.deletion_timestamp is not None
            self._pods[name] = PodState(uid, phase, deleting, standby)
            self._created.setdefault((name, uid), now)
            if pod.spec is not None and pod.spec.node_name:
                self._bound.setdefault((name, uid), now)
            if phase == "Running":
                self._running.setdefault((name, uid), now)


class LogTail:
    """The parsed step/``resumed`` lines of every pod incarnation of one job, read incrementally."""

    def __init__(self, pods_dir: Path, namespace: str, job: str) -> None:
        self._dir = pods_dir
        self._glob = f"{namespace}_{job}-worker-*_*"
        self._tail = FileTail()
        self._events: dict[tuple[str, str], list[Event]] = {}
        self._texts: dict[tuple[str, str], list[str]] = {}

    @staticmethod
    def _key(pod_dir: Path) -> tuple[str, str]:
        # <ns>_<pod>_<uid>: neither a namespace nor a pod name holds "_".
        _, pod, uid = pod_dir.name.split("_", 2)
        return pod, uid

    def poll(self) -> None:
        if not self._dir.is_dir():
            return
        for log in sorted(self._dir.glob(f"{self._glob}/{labels.TRAINER_CONTAINER}.log")):
            lines = self._tail.new_lines(log)
            if not lines:
                continue
            key = self._key(log.parent)
            self._texts.setdefault(key, []).extend(lines)
            self._events.setdefault(key, []).extend(parse_events(lines))

    def events(self, incarnations: Mapping[str, str]) -> dict[str, list[Event]]:
        """Events of the given pods, each of the given uid (``{pod: uid}``)."""
        self.poll()
        return {pod: list(self._events.get((pod, uid), [])) for pod, uid in incarnations.items()}

    def tail(self, pod: str, uid: str, n: int = 15) -> list[str]:
        return self._texts.get((pod, uid), [])[-n:]

    def lines(self, pod: str, uid: str) -> list[str]:
        """Every line of the incarnation's container log read so far."""
        self.poll()
        return list(self._texts.get((pod, uid), []))


class ClusterJob:
    """One job of the benchmark: apply, follow, scale, kill a pod, delete."""

    def __init__(self, cluster: Cluster, namespace: str, job: BenchJob, watch: PodWatch) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.job = job
        self.watch = watch
        self.logs = LogTail(cluster.layout.pods, namespace, job.name)

    @property
    def name(self) -> str:
        return self.job.name

    def apply(self) -> None:
        self.job.ckpt_dir.mkdir(parents=True, exist_ok=True)
        apply(self.cluster, self.ns, self.job.manifest())

    def scale(self, replicas: int) -> None:
        self.cluster.kubectl("scale", f"ej/{self.name}", "-n", self.ns, f"--replicas={replicas}")

    def pods(self, *, spares: bool = False) -> dict[str, str]:
        """``{pod: uid}`` of the job's live member pods (Pending or Running, not deleting);
        with ``spares``, of its live warm spares instead."""
        return {
            name: st.uid
            for name, st in self.watch.pods(f"{self.name}-worker-").items()
            if not st.deleting and st.phase in ("Pending", "Running") and st.standby == spares
        }

    def running_since(self, pod: str, uid: str) -> float | None:
        return self.watch.running_since(pod, uid)

    def events(self, pods: Mapping[str, str] | None = None) -> dict[str, list[Event]]:
        return self.logs.events(self.pods() if pods is None else pods)

    def delete(self, timeout: float = 90.0) -> bool:
        """Delete the job (training is not awaited) and wait until its pods are gone."""
        self.cluster.kubectl(
            "delete", "ej", self.name, "-n", self.ns, "--wait=false", "--ignore-not-found"
        )

        def gone() -> bool:
            return not self.watch.pods(f"{self.name}-")

        return bool(poll_until(gone, timeout, 1.0))

    def phase(self) -> str:
        with contextlib.suppress(RuntimeError):
            status = self.cluster.get_json("ej", self.name, "-n", self.ns).get("status") or {}
            return str(status.get("phase", ""))
        return ""
