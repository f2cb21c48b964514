"""``spec.sharedMemory``: the worker pod's memory-backed ``/dev/shm`` (issue 16).

A container runtime gives a container 64 MiB of ``/dev/shm``; DataLoader
workers passing batches through it die with a bus error. The operator mounts
an emptyDir with ``medium: Memory`` there, sized from the field; the real
node proves the mount in a container (``tests/realnode/test_elasticjob.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.operator.factories import job, job_obj
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec, SharedMemory
from torchflex_operator.render import builders


def _shm(pod: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the pod that back the trainer's /dev/shm."""
    (trainer,) = pod["spec"]["containers"]
    mounts = [m for m in trainer.get("volumeMounts") or [] if m["mountPath"] == builders.SHM_PATH]
    names = {m["name"] for m in mounts}
    return [v for v in pod["spec"].get("volumes") or [] if v["name"] in names], mounts


def test_by_default_the_trainer_gets_a_memory_backed_dev_shm_of_1gi() -> None:
    assert job().shared_memory == SharedMemory(enabled=True, size_limit="1Gi")
    volumes, mounts = _shm(builders.worker_pod(job(), 0, Settings()))
    assert [v["emptyDir"] for v in volumes] == [{"medium": "Memory", "sizeLimit": "1Gi"}]
    assert [m.get("readOnly", False) for m in mounts] == [False]


@pytest.mark.parametrize(("given", "limit"), [("8Gi", "8Gi"), (536870912, "536870912")])
def test_the_size_limit_comes_from_the_field(given: object, limit: str) -> None:
    pod = builders.worker_pod(job(sharedMemory={"sizeLimit": given}), 1, Settings())
    volumes, _ = _shm(pod)
    assert [v["emptyDir"] for v in volumes] == [{"medium": "Memory", "sizeLimit": limit}]


def test_disabled_mounts_nothing() -> None:
    pod = builders.worker_pod(job(sharedMemory={"enabled": False}), 0, Settings())
    assert _shm(pod) == ([], [])
    assert not pod["spec"].get("volumes")


def test_a_template_that_mounts_its_own_dev_shm_keeps_it() -> None:
    obj = job_obj()
    pod_spec = obj["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "mine", "emptyDir": {"medium": "Memory"}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": "/dev/shm/"}]
    volumes, mounts = _shm(builders.worker_pod(JobSpec.parse(obj), 0, Settings()))
    assert [v["name"] for v in volumes] == [] and [m["name"] for m in mounts] == []
    pod = builders.worker_pod(JobSpec.parse(obj), 0, Settings())
    assert pod["spec"]["volumes"] == [{"name": "mine", "emptyDir": {"medium": "Memory"}}]


def test_user_volumes_stay_and_ours_is_added_beside_them() -> None:
    obj = job_obj()
    pod_spec = obj["spec"]["template"]["spec"]
    pod_spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod = builders.worker_pod(JobSpec.parse(obj), 0, Settings())
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "torchflex-shm"]
    (trainer,) = pod["spec"]["containers"]
    assert [m["mountPath"] for m in trainer["volumeMounts"]] == ["/data", "/dev/shm"]
    # The job's template is not changed by building a pod from it.
    assert obj["spec"]["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]


def test_the_default_leaves_the_spec_hash_as_it_was_and_a_change_rolls() -> None:
    """Pods made before the field existed are not rolled by an operator upgrade."""
    bare = builders.template_hash(job())
    assert builders.template_hash(job(sharedMemory={})) == bare
    assert builders.template_hash(job(sharedMemory={"enabled": True, "sizeLimit": "1Gi"})) == bare
    assert builders.template_hash(job(sharedMemory={"sizeLimit": "2Gi"})) != bare
    assert builders.template_hash(job(sharedMemory={"enabled": False})) != bare
