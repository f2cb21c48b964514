"""The calls of the optional scheduling APIs: PodGroups, PodDisruptionBudgets, Kueue.

Where it sits: in the ``kube`` package (the only place that talks to the Kubernetes
API), between ``transport.KubeBase`` and ``calls.Kube``. Each resource here is one a
cluster may not serve (the Workload API's PodGroups, Kueue's Workloads) or one the
operator keeps in step with the spec (the PodDisruptionBudget): created, or patched
where ``render.podgroup``, ``render.pdb`` or ``render.workload`` says the live object differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchflex_operator.kube.transport import MERGE_PATCH, TIMEOUT_S, KubeBase, as_refusal
from torchflex_operator.model.errors import ApiAbsentError, ConflictError, PermanentError
from torchflex_operator.render import pdb, podgroup, workload


class SchedulingCalls(KubeBase):
    # -- the job's PodGroup (gang scheduling; an optional API) -----------------------

    async def pod_groups_served(self) -> bool:
        """Whether the API serves ``scheduling.k8s.io/v1beta1`` PodGroups (discovery,
        which RBAC grants every authenticated client: no rule in the chart)."""
        try:
            resources: Any = await self._call(
                "get apiresources scheduling.k8s.io/v1beta1",
                lambda: self.scheduling.get_api_resources(_request_timeout=TIMEOUT_S),
            )
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                return False
            raise
        return any(r.name == "podgroups" for r in resources.resources or ())

    async def apply_pod_group(self, manifest: Mapping[str, Any]) -> None:
        """Create the PodGroup, or bring an existing one's gang ``minCount`` to the
        manifest's (the one field of it that may change). ``ApiAbsentError`` when the
        API answers 404: the group version is not served (or the namespace is gone)."""
        await self._create_or_patch(
            "podgroup",
            manifest,
            create=lambda ns, body: self.scheduling.create_namespaced_pod_group(
                ns, body, _request_timeout=TIMEOUT_S
            ),
            read=lambda name, ns: self.scheduling.read_namespaced_pod_group(
                name, ns, _request_timeout=TIMEOUT_S
            ),
            patch=lambda name, ns, patch: self.scheduling.patch_namespaced_pod_group(
                name, ns, patch, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT_S
            ),
            diff=podgroup.min_count_patch,
        )

    # -- the job's PodDisruptionBudget (``render.pdb``) ----------------------------------

    async def apply_disruption_budget(self, manifest: Mapping[str, Any]) -> None:
        """Create the budget, or bring an existing one's owned fields to the manifest's."""
        await self._create_or_patch(
            "poddisruptionbudget",
            manifest,
            create=lambda ns, body: self.policy.create_namespaced_pod_disruption_budget(
                ns, body, _request_timeout=TIMEOUT_S
            ),
            read=lambda name, ns: self.policy.read_namespaced_pod_disruption_budget(
                name, ns, _request_timeout=TIMEOUT_S
            ),
            patch=lambda name, ns, patch: self.policy.patch_namespaced_pod_disruption_budget(
                name, ns, patch, _content_type=MERGE_PATCH, _request_timeout=TIMEOUT_S
            ),
            diff=pdb.spec_patch,
        )

    async def delete_disruption_budget(self, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the budget if the job (``owner_uid``) owns it, with its UID as a
        precondition; False when it was not there, or is not the job's."""
        current = await self._get_or_none(
            f"get poddisruptionbudget {namespace}/{name}",
            lambda: self.policy.read_namespaced_pod_disruption_budget(
                name, namespace, _request_timeout=TIMEOUT_S
            ),
            convert=self._dict,
        )
        if current is None or not pdb.owned(current, owner_uid):
            return False
        uid = current["metadata"]["uid"]
        return await self._ignore(
            (404, 409),
            f"delete poddisruptionbudget {namespace}/{name}",
            lambda: self.policy.delete_namespaced_pod_disruption_budget(
                name,
                namespace,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _request_timeout=TIMEOUT_S,
            ),
        )

    # -- a queued job's Kueue Workload (an optional API) --------------------------------

    async def get_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Workload, or None when it does not exist (or Kueue is not installed)."""
        return await self._get_or_none(
            f"get workload {namespace}/{name}",
            lambda: self.kueue.get_namespaced_custom_object(
                workload.GROUP, workload.VERSION, namespace, workload.PLURAL, name,
                _request_timeout=TIMEOUT_S,
            ),
        )  # fmt: skip

    async def workload_priority(self, name: str) -> int | None:
        """A WorkloadPriorityClass's value; None when there is no such class."""
        obj = await self._get_or_none(
            f"get workloadpriorityclass {name}",
            lambda: self.kueue.get_cluster_custom_object(
                workload.GROUP, workload.VERSION, workload.PRIORITY_CLASSES, name,
                _request_timeout=TIMEOUT_S,
            ),
        )  # fmt: skip
        value = None if obj is None else obj.get("value")
        return value if isinstance(value, int) else None

    async def create_workload(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create the Workload; None when one of that name exists already (409)."""
        ns = manifest["metadata"]["namespace"]
        body: Any = dict(manifest)
        try:
            obj: Any = await self._call(
                f"create workload {ns}/{manifest['metadata']['name']}",
                lambda: self.kueue.create_namespaced_custom_object(
                    workload.GROUP, workload.VERSION, ns, workload.PLURAL, body,
                    _request_timeout=TIMEOUT_S,
                ),
            )  # fmt: skip
        except ConflictError:
            return None
        except PermanentError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ApiAbsentError(str(exc)) from exc.__cause__
            raise as_refusal(exc) from exc.__cause__
        return dict(obj)

    async def delete_workload(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the Workload with this UID (a precondition: one created anew under
        the same name meanwhile stays); False when it was not there (404) or is
        another one (409)."""
        body: Any = {"preconditions": {"uid": uid}} if uid else {}
        return await self._ignore(
            (404, 409),
            f"delete workload {namespace}/{name}",
            lambda: self.kueue.delete_namespaced_custom_object(
                workload.GROUP, workload.VERSION, namespace, workload.PLURAL, name,
                body=body, _request_timeout=TIMEOUT_S,
            ),
        )  # fmt: skip

    async def patch_workload_status(
        self, namespace: str, name: str, resource_version: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the Workload's status, guarded by ``resource_version`` (409: re-read)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(patch)}
        obj: Any = await self._call(
            f"patch workload {namespace}/{name} status",
            lambda: self.kueue.patch_namespaced_custom_object_status(
                workload.GROUP, workload.VERSION, namespace, workload.PLURAL, name, body,
                _request_timeout=TIMEOUT_S,
            ),
        )  # fmt: skip
        return dict(obj)
