"""The ``torchflex`` TorchX scheduler: submit, describe, list, log and cancel ElasticJobs.

Where it sits: the I/O half of ``torchflex_torchx`` (``translate`` is the pure
half), loaded by TorchX through the ``torchx.schedulers`` entry point
(``create_scheduler``). It speaks to the API server with the official
Kubernetes client, configured from ``KUBECONFIG`` (or ``~/.kube/config``), else
in-cluster. An app id is ``<namespace>:<name>``. ``cancel`` suspends the job
(the operator deletes its pods) and marks it cancelled, so ``torchx status``
still answers ``CANCELLED`` afterwards; ``torchx delete`` removes it.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from torchx import specs
from torchx.schedulers.api import (
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
    split_lines,
)

from torchflex_contract import labels
from torchflex_torchx import translate

BACKEND: Final = "torchflex"
_NOT_FOUND: Final = 404
_ALPHABET: Final = string.ascii_lowercase + string.digits


def _api_client() -> k8s.ApiClient:
    try:
        return cast(k8s.ApiClient, k8s_config.new_client_from_config())
    except k8s_config.ConfigException:
        k8s_config.load_incluster_config()
        return k8s.ApiClient()


def _options(cfg: Mapping[str, Any]) -> translate.Options:
    return translate.Options(
        namespace=str(cfg.get("namespace") or "default"),
        service_account=cfg.get("service_account") or None,
        node_selector=translate.parse_node_selector(cfg.get("node_selector")),
        working_dir=cfg.get("working_dir") or None,
    )


class TorchflexScheduler(Scheduler):  # type: ignore[misc]  # torchx ships no type hints
    """ElasticJobs on the API server the kubeconfig names."""

    def __init__(self, session_name: str, api: k8s.ApiClient | None = None) -> None:
        super().__init__(BACKEND, session_name)
        self._api: k8s.ApiClient | None = api

    def _client(self) -> k8s.ApiClient:
        # Built on first use: `torchx runopts` and dry runs need no cluster.
        if self._api is None:
            self._api = _api_client()
        return self._api

    def _objects(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self._client())

    def _core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self._client())

    # -- submit ---------------------------------------------------------------
    def _run_opts(self) -> specs.runopts:
        opts = specs.runopts()
        opts.add("namespace", type_=str, default="default", help="namespace of the ElasticJob")
        opts.add("service_account", type_=str, default=None, help="the pods' service account")
        opts.add(
            "node_selector",
            type_=str,
            default=None,
            help="the pods' nodeSelector as key=value[,key=value]",
        )
        opts.add("working_dir", type_=str, default=None, help="the trainer's working directory")
        return opts

    def _submit_dryrun(
        self, app: specs.AppDef, cfg: Mapping[str, Any]
    ) -> specs.AppDryRunInfo[dict[str, Any]]:
        suffix = "".join(secrets.choice(_ALPHABET) for _ in range(6))
        name = translate.job_name(app.name, suffix)
        job = translate.elastic_job(app, name, _options(cfg))
        return specs.AppDryRunInfo(job, repr)

    def schedule(self, dryrun_info: specs.AppDryRunInfo[dict[str, Any]]) -> str:
        job: dict[str, Any] = dryrun_info.request
        namespace = job["metadata"]["namespace"]
        self._objects().create_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, labels.PLURAL, job
        )
        return translate.app_id(namespace, job["metadata"]["name"])

    # -- read -------------------------------------------------------------------
    def _job(self, app_id: str) -> dict[str, Any] | None:
        namespace, name = translate.parse_app_id(app_id)
        try:
            job = self._objects().get_namespaced_custom_object(
                labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise
        return cast(dict[str, Any], job)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        job = self._job(app_id)
        if job is None:
            return None
        namespace, name = translate.parse_app_id(app_id)
        role_name = job["metadata"].get("annotations", {}).get(translate.ROLE_ANNOTATION)
        role_name = role_name or labels.WORKER_ROLE
        selector = (
            f"{labels.Label.JOB_NAME}={name},{labels.Label.ROLE}={labels.PodKind.WORKER.value}"
        )
        pods = self._core().list_namespaced_pod(namespace, label_selector=selector).items
        replicas = [
            specs.ReplicaStatus(
                id=int((pod.metadata.labels or {}).get(labels.Label.REPLICA_INDEX, -1)),
                state=translate.pod_state(pod.status.phase if pod.status else None),
                role=role_name,
                hostname=pod.metadata.name or "",
            )
            for pod in pods
            if pod.metadata is not None
        ]
        spec = job.get("spec") or {}
        status = job.get("status") or {}
        role = specs.Role(
            name=role_name,
            image="",
            min_replicas=spec.get("minReplicas"),
            num_replicas=int(spec.get("maxReplicas", 0)),
        )
        return DescribeAppResponse(
            app_id=app_id,
            state=translate.app_state(job),
            num_restarts=int(status.get("restarts", 0) or 0),
            msg=translate.status_message(job),
            roles=[role],
            roles_statuses=[specs.RoleStatus(role_name, sorted(replicas, key=lambda r: r.id))],
        )

    def list(self, cfg: Mapping[str, Any] | None = None) -> list[ListAppResponse]:
        namespace = _options(cfg or {}).namespace
        jobs = self._objects().list_namespaced_custom_object(
            labels.GROUP,
            labels.VERSION,
            namespace,
            labels.PLURAL,
            label_selector=translate.APP_NAME_LABEL,
        )
        items = cast(dict[str, Any], jobs).get("items", [])
        return [
            ListAppResponse(
                app_id=translate.app_id(namespace, job["metadata"]["name"]),
                state=translate.app_state(job),
                name=job["metadata"]["name"],
            )
            for job in items
        ]

    def log_iter(  # noqa: PLR0917  # TorchX's signature, positional as its callers pass it
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """The trainer container's log of worker ``k`` (stdout and stderr together)."""
        if streams not in (None, Stream.COMBINED):
            raise ValueError(f"streams: {streams} is not supported (Kubernetes merges them)")
        namespace, name = translate.parse_app_id(app_id)
        kwargs: dict[str, Any] = {"container": labels.TRAINER_CONTAINER}
        if since is not None:
            age = (datetime.now(UTC) - since.astimezone(UTC)).total_seconds()
            kwargs["since_seconds"] = max(1, int(age))
        pod = labels.worker_pod_name(name, k)
        lines: Iterable[str]
        if should_tail:
            lines = self._follow(pod, namespace, kwargs)
        else:
            text = self._core().read_namespaced_pod_log(pod, namespace, **kwargs)
            lines = split_lines(str(text))
        return filter_regex(regex, lines) if regex else lines

    def _follow(self, pod: str, namespace: str, kwargs: dict[str, Any]) -> Iterator[str]:
        stream = k8s_watch.Watch().stream(
            self._core().read_namespaced_pod_log, name=pod, namespace=namespace, **kwargs
        )
        for line in stream:
            yield f"{line}\n"

    # -- cancel -----------------------------------------------------------------
    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = translate.parse_app_id(app_id)
        patch = {
            "metadata": {"annotations": {translate.CANCELLED_ANNOTATION: "true"}},
            "spec": {"suspend": True},
        }
        self._objects().patch_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name, patch
        )

    def _delete_existing(self, app_id: str) -> None:
        namespace, name = translate.parse_app_id(app_id)
        self._objects().delete_namespaced_custom_object(
            labels.GROUP, labels.VERSION, namespace, labels.PLURAL, name
        )


def create_scheduler(
    session_name: str, client: k8s.ApiClient | None = None, **kwargs: object
) -> TorchflexScheduler:
    """The ``torchx.schedulers`` entry point."""
    return TorchflexScheduler(session_name, client)
