"""The process kubelet's loop: watch pods, run the ones bound to our nodes.

Where it sits: ``python -m e2e.kubelet`` builds a :class:`Kubelet` and calls
:meth:`Kubelet.run`. Watches (``fetch``) feed one event queue; a single
thread owns all pod runtimes (``runtime.PodRuntime``), so there is no
locking around them. Node registration and
heartbeats (Lease + Ready condition) run in their own thread, as do the
volume provisioner (``provisioner``) and each node's log endpoint for
``kubectl logs`` (``logserver``, which reads runtimes by snapshot only).

The API server may go away at any moment (restarts, outages): every call
from the loop is bounded by a request timeout, a status that could not be
reported is sent again every ``STATUS_RETRY_S`` until it lands, and pods
keep running meanwhile; only an outage longer than ``API_DOWN_EXIT_S``
stops the kubelet (and its pods). Each pod's sandbox and container PIDs are
recorded in ``<pod dir>/runtime.json`` (``records``) for the fault helpers.
A pod that ran under a previous kubelet process (restart) is handled like a
real kubelet after a node reboot: its containers are gone
(``ContainerStatusUnknown``, exit 137) and restart per ``restartPolicy``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client

from e2e.cluster import network
from e2e.cluster.layout import GATEWAY_IP, PROCESS_NODE_IP_PREFIX, PROCESS_NODE_LABEL
from e2e.kubelet import fetch, logserver, podspec, provisioner, runtime, sandbox, status, volumes
from e2e.kubelet.nodes import NodeHeartbeat, Placement
from e2e.kubelet.runtime import PodRuntime

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
API_DOWN_EXIT_S = 120.0
# One API request from the loop never blocks it longer than this.
REQUEST_TIMEOUT_S = 5.0
STATUS_RETRY_S = 1.0
CREATE_RETRY_S = 1.0
# What a call raises when the API server cannot be reached at all (refused,
# reset, timed out: urllib3's MaxRetryError and friends), as opposed to an
# answer (ApiException): retried, never fatal.
API_UNREACHABLE: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError,)
LOST_REASON = "ContainerStatusUnknown"
LOST_MESSAGE = "The container could not be located when the kubelet restarted"


class Kubelet:
    def __init__(
        self,
        api: client.ApiClient,
        nodes: list[str],
        state_dir: Path,
        api_port: int,
        placement: Placement | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.fetch = fetch.ApiFetcher(self.core)
        self.placement = placement or Placement()
        first = self.placement.first_host
        self.nodes = {n: f"{PROCESS_NODE_IP_PREFIX}.{i + first}" for i, n in enumerate(nodes)}
        self.state_dir = state_dir
        self.api_port = api_port
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.runtimes: dict[str, PodRuntime] = {}
        self.used_ips: set[int] = set()
        self.stop = threading.Event()
        self.dns_dirty = False
        self.last_api_ok = time.monotonic()
        self.image_bin = state_dir / "image-bin"

    def _api_answered(self) -> None:
        self.last_api_ok = time.monotonic()

    # --- kubectl logs ----------------------------------------------------
    def _log_of(self, ns: str, pod: str, container: str) -> tuple[Path, bool] | None:
        """Called from the log server's threads: reads a snapshot only."""
        runtimes = list(self.runtimes.values())
        return runtime.log_of(runtimes, self.state_dir / "pods", ns, pod, container)

    # --- main loop -------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        heartbeat = NodeHeartbeat(
            self.api,
            self.nodes,
            self.stop,
            PROCESS_NODE_LABEL,
            extra_labels=self.placement.labels,
            provider_id=self.placement.provider_id,
        )
        heartbeat.register()
        threading.Thread(target=heartbeat.loop, daemon=True).start()
        info = json.loads((self.state_dir / "cluster.json").read_text())
        runtime.link_image_tools(Path(info["bin_dir"]), self.image_bin)
        volumes_provisioner = provisioner.Provisioner(
            self.api, self.state_dir / "volumes", self.stop
        )
        volumes_provisioner.register()
        threading.Thread(target=volumes_provisioner.loop, daemon=True).start()
        logserver.serve(self.nodes, self.state_dir / "pki", self._log_of, self.stop)
        for kind, lister in (
            ("pod", self.core.list_pod_for_all_namespaces),
            ("svc", self.core.list_service_for_all_namespaces),
        ):
            threading.Thread(
                target=fetch.list_and_watch,
                args=(kind, lister, self.events, self.stop, self._api_answered),
                daemon=True,
            ).start()
        try:
            while not self.stop.is_set():
                with contextlib.suppress(queue.Empty):
                    self._handle(*self.events.get(timeout=0.2))
                    while not self.events.empty():
                        self._handle(*self.events.get_nowait())
                self._tick()
                if time.monotonic() - self.last_api_ok > API_DOWN_EXIT_S:
                    break
        finally:
            self._shutdown()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "pod-list":
            seen = {p["metadata"]["uid"]: p for p in payload}
            gone = set(self.pods) - set(seen)
            self.pods = seen
            # Pods that already have an address first, so that after a
            # restart each gets its own back before new pods take the lowest.
            ordered = sorted(seen, key=lambda uid: not seen[uid].get("status", {}).get("podIP"))
            for uid in list(gone) + ordered:
                self._sync(uid)
            self.dns_dirty = True
        elif kind == "pod":
            ev_type, obj = payload
            uid = obj["metadata"]["uid"]
            if ev_type == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = obj
            self._sync(uid)
            self.dns_dirty = True
        elif kind == "svc-list":
            self.services = {
                f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in payload
            }
            self.dns_dirty = True
        elif kind == "svc":
            ev_type, obj = payload
            key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            if ev_type == "DELETED":
                self.services.pop(key, None)
            else:
                self.services[key] = obj
            self.dns_dirty = True
        elif kind == "exit":
            uid, name, gen, code = payload
            rt = self.runtimes.get(uid)
            if rt is not None and rt.generation.get(name) == gen:
                self._container_exited(rt, name, code)

    def _tick(self) -> None:
        now = time.monotonic()
        for rt in list(self.runtimes.values()):
            if rt.kill_at is not None and now >= rt.kill_at:
                for proc in rt.procs.values():
                    runtime.kill_group(proc)
                rt.kill_at = None
            for name, at in list(rt.restart_at.items()):
                if now >= at and not rt.terminating:
                    del rt.restart_at[name]
                    self._start_container(rt, self.pods.get(rt.uid), name)
            if rt.status_retry_at is not None and now >= rt.status_retry_at:
                self._patch_status(rt)
        if self.dns_dirty:
            self.dns_dirty = False
            self._write_hosts()

    # --- pod lifecycle ---------------------------------------------------
    def _sync(self, uid: str) -> None:
        pod = self.pods.get(uid)
        rt = self.runtimes.get(uid)
        if pod is None:
            if rt is not None:
                # Force-deleted: the object is gone, stop everything now. Let
                # the processes die before the netns goes, so their peers get
                # the FIN/RST a real kubelet's container kill would send
                # (deleting the veth first leaves peers on half-open sockets).
                for proc in rt.procs.values():
                    runtime.kill_group(proc)
                for proc in rt.procs.values():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=2)
                self._teardown(rt)
                del self.runtimes[uid]
            return
        node = pod.get("spec", {}).get("nodeName")
        if node not in self.nodes:
            return
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            self._terminate(pod, rt)
            return
        if rt is None and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._create(pod, node)
        elif rt is not None and not rt.torn_down:
            # A running pod's update: its downward API files follow its metadata.
            volumes.refresh(pod, rt.pod_dir)

    def _create(self, pod: dict[str, Any], node: str) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        containers = pod["spec"].get("containers", [])
        lost = status.lost_containers(pod, LOST_REASON, LOST_MESSAGE)
        if lost and pod["spec"].get("restartPolicy", "Always") == "Never":
            self._report_lost(pod, lost)
            return
        # A pod that ran before keeps its address (the API refuses a second
        # one); a new pod takes the lowest free one.
        index = network.pod_ip_index(pod.get("status", {}).get("podIP") or "")
        if index is None or index in self.used_ips:
            first = self.placement.first_pod_ip
            index = next(i for i in range(first, 65000) if i not in self.used_ips)
        self.used_ips.add(index)
        rt = PodRuntime(
            uid=uid,
            ns=meta.get("namespace", "default"),
            name=meta["name"],
            node=node,
            host_ip=self.nodes[node],
            ip_index=index,
            netns=network.netns_name(uid),
            pod_dir=self.state_dir / "pods" / f"{meta.get('namespace')}_{meta['name']}_{uid}",
            start_time=status.now_rfc3339(),
            records={
                c["name"]: status.ContainerRecord(c["name"], c.get("image", "")) for c in containers
            },
        )
        for name, rec in lost.items():
            # Restarted below with the next restart count, the lost one as
            # its last state (what a kubelet does after a node reboot).
            rt.records[name] = rec
        self.runtimes[uid] = rt
        rt.pod_dir.mkdir(parents=True, exist_ok=True)
        runtime.kill_leftovers(rt.pod_dir)
        network.create_pod_netns(uid, rt.ip)
        try:
            network.announce(rt.netns, rt.ip)
        except network.NetworkError as exc:
            # Peers fall back to ARP timeouts; the pod itself is fine.
            print(f"[process-kubelet] {exc}", flush=True)
        runtime.write_record(rt)
        self._write_hosts()
        for c in containers:
            self._start_container(rt, pod, c["name"])

    def _report_lost(self, pod: dict[str, Any], lost: dict[str, status.ContainerRecord]) -> None:
        """A restartPolicy Never pod whose containers died with a previous
        kubelet: reported Failed, never started again."""
        meta = pod["metadata"]
        pod_dir = self.state_dir / "pods" / f"{meta.get('namespace')}_{meta['name']}_{meta['uid']}"
        runtime.kill_leftovers(pod_dir)
        network.delete_pod_netns(meta["uid"])
        old = pod.get("status", {})
        doc = status.pod_status(
            list(lost.values()),
            "Never",
            host_ip=self.nodes[pod["spec"]["nodeName"]],
            pod_ip=old.get("podIP"),
            start_time=old.get("startTime") or status.now_rfc3339(),
            previous_conditions={c["type"]: c for c in old.get("conditions", [])},
        )
        with contextlib.suppress(client.ApiException, *API_UNREACHABLE):
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": doc}, _request_timeout=REQUEST_TIMEOUT_S
            )

    def _start_container(self, rt: PodRuntime, pod: dict[str, Any] | None, name: str) -> None:
        if pod is None:
            return
        container = next(c for c in pod["spec"]["containers"] if c["name"] == name)
        rec = rt.records[name]
        try:
            env = podspec.container_env(
                pod,
                container,
                node=rt.node,
                host_ip=rt.host_ip,
                pod_ip=rt.ip,
                api_host=GATEWAY_IP,
                api_port=self.api_port,
                config_maps=fetch.EnvLookup(self.fetch.config_map, rt.ns),
                secrets=fetch.EnvLookup(self.fetch.secret, rt.ns),
            )
            if env["PATH"] == podspec.BASE_PATH:
                env["PATH"] = f"{podspec.BASE_PATH}:{self.image_bin}"
            argv = podspec.container_argv(container, env)
            mounts = volumes.prepare(pod, container, rt.pod_dir, self.fetch)
        except API_UNREACHABLE as exc:
            # Config maps, secrets or the token could not be fetched now:
            # try again shortly, as a kubelet does.
            print(f"[process-kubelet] {rt.ns}/{rt.name} {name}: {exc!r}; retrying", flush=True)
            rt.restart_at[name] = time.monotonic() + CREATE_RETRY_S
            return
        except (podspec.UnsupportedSpecError, client.ApiException) as exc:
            rec.waiting_reason = "CreateContainerConfigError"
            rec.waiting_message = str(exc)[:500]
            rec.exit_code, rec.message = 128, str(exc)[:500]
            rec.started_at = rec.finished_at = status.now_rfc3339()
            self._patch_status(rt)
            return
        term_log = rt.pod_dir / f"{name}.termination-log"
        term_log.write_text("")
        hosts = rt.pod_dir / "hosts"
        resolv = rt.pod_dir / "resolv.conf"
        mounts = [
            podspec.Mount(hosts, "/etc/hosts"),
            podspec.Mount(resolv, "/etc/resolv.conf"),
            podspec.Mount(rt.pod_dir / "nsswitch.conf", "/etc/nsswitch.conf"),
            podspec.Mount(
                term_log, container.get("terminationMessagePath", sandbox.TERMINATION_LOG)
            ),
            *mounts,
        ]
        proc = sandbox.start(
            netns=rt.netns,
            hostname=podspec.pod_hostname(pod),
            argv=argv,
            env=env,
            workdir=podspec.working_dir(container),
            mounts=mounts,
            log_path=rt.pod_dir / f"{name}.log",
            root=rt.pod_dir / f"{name}.fs",
        )
        gen = rt.generation.get(name, 0) + 1
        rt.generation[name] = gen
        rt.procs[name] = proc
        if rec.exit_code is not None:
            rec.last_terminated = rec.terminated_state()
            rec.restart_count += 1
        rec.exit_code = rec.signal = rec.reason = None
        rec.message = ""
        rec.finished_at = None
        rec.started_at = status.now_rfc3339()
        threading.Thread(target=self._wait, args=(rt.uid, name, gen, proc), daemon=True).start()
        runtime.write_record(rt)
        self._patch_status(rt)

    def _wait(self, uid: str, name: str, gen: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self.events.put(("exit", (uid, name, gen, code)))

    def _container_exited(self, rt: PodRuntime, name: str, code: int) -> None:
        rec = rt.records[name]
        rt.procs.pop(name, None)
        if code < 0:
            rec.signal, rec.exit_code = -code, 128 - code
        else:
            rec.exit_code = code
        rec.finished_at = status.now_rfc3339()
        term_log = rt.pod_dir / f"{name}.termination-log"
        if term_log.exists():
            rec.message = term_log.read_text(errors="replace")[:4096]
        pod = self.pods.get(rt.uid)
        policy = (pod or {}).get("spec", {}).get("restartPolicy", "Always")
        restart = not rt.terminating and (
            policy == "Always" or (policy == "OnFailure" and code != 0)
        )
        if restart:
            delay = RESTART_BACKOFF_S[min(rec.restart_count, len(RESTART_BACKOFF_S) - 1)]
            rt.restart_at[name] = time.monotonic() + delay
        if not rt.torn_down:
            runtime.write_record(rt)
        self._patch_status(rt)
        if not rt.procs and not rt.restart_at:
            # As a PID namespace would: nothing of the pod outlives its containers, and
            # their last sockets close (peers see FIN/RST) before its network goes.
            runtime.drain_netns(rt.netns)
            self._teardown(rt)
            if rt.terminating:
                self._finalize_delete(rt)

    def _terminate(self, pod: dict[str, Any], rt: PodRuntime | None) -> None:
        if rt is None:
            self._finalize_delete_obj(pod)
            return
        if rt.terminating:
            return
        rt.terminating = True
        rt.restart_at.clear()
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        if not rt.procs:
            self._teardown(rt)
            self._finalize_delete(rt)
            return
        for proc in rt.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        rt.kill_at = time.monotonic() + float(grace)

    def _finalize_delete(self, rt: PodRuntime) -> None:
        self.runtimes.pop(rt.uid, None)
        pod = self.pods.get(rt.uid)
        if pod is not None:
            self._finalize_delete_obj(pod)

    def _finalize_delete_obj(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        # Unreachable API: the pod object stays; the next list after the
        # outage shows it terminating again and this runs again.
        with contextlib.suppress(client.ApiException, *API_UNREACHABLE):
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
                ),
                _request_timeout=REQUEST_TIMEOUT_S,
            )

    def _teardown(self, rt: PodRuntime) -> None:
        if rt.torn_down:
            return
        rt.torn_down = True
        network.delete_pod_netns(rt.uid)
        self.used_ips.discard(rt.ip_index)
        self.dns_dirty = True

    def _patch_status(self, rt: PodRuntime) -> None:
        """Report the runtime's current state; if the API server cannot be
        reached, keep the pods running and send it again from ``_tick``
        (always the state of that moment, so a late patch is never stale)."""
        rt.status_retry_at = None
        pod = self.pods.get(rt.uid)
        if pod is None:
            return
        previous = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
        doc = status.pod_status(
            list(rt.records.values()),
            pod["spec"].get("restartPolicy", "Always"),
            host_ip=rt.host_ip,
            pod_ip=rt.ip,
            start_time=rt.start_time,
            previous_conditions=previous,
        )
        try:
            self.core.patch_namespaced_pod_status(
                rt.name, rt.ns, {"status": doc}, _request_timeout=REQUEST_TIMEOUT_S
            )
        except API_UNREACHABLE:
            rt.status_retry_at = time.monotonic() + STATUS_RETRY_S
        except client.ApiException as exc:
            # An answer (the pod is gone, a conflict): the watch brings the
            # truth and the next change patches again.
            body = str(exc.body)[:300]
            print(f"[process-kubelet] status of {rt.ns}/{rt.name}: {exc.status} {body}", flush=True)
        else:
            self.last_api_ok = time.monotonic()

    # --- names -----------------------------------------------------------
    def _write_hosts(self) -> None:
        pods = list(self.pods.values())
        services = [s for s in self.services.values() if s.get("spec", {}).get("selector")]
        for rt in self.runtimes.values():
            pod = self.pods.get(rt.uid)
            if pod is None or rt.torn_down:
                continue
            runtime.write_name_files(rt, pod, pods, services)

    def _shutdown(self) -> None:
        for rt in self.runtimes.values():
            for proc in rt.procs.values():
                runtime.kill_group(proc)
            network.delete_pod_netns(rt.uid)
