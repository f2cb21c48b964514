"""Multi-role jobs (spec.roles, issue 29): the spec model, what single-role jobs keep, how
the operator plans each role and merges them, and its refusal to run a queued one yet."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.operator.factories import (
    NOW,
    decided,
    job_obj,
    observed,
    parsed,
    role,
    roles_job,
    roles_obj,
    worker,
)
from torchflex_contract.progress import AgentReport, AgentState, Progress
from torchflex_contract.roles import Coupling
from torchflex_operator.model.errors import InvalidSpecError
from torchflex_operator.model.kueue import WorkloadView
from torchflex_operator.model.observed import Observed, PodView
from torchflex_operator.model.roles import FailureScope
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec
from torchflex_operator.model.status import JobStatus
from torchflex_operator.model.vocabulary import (
    ConditionType,
    EventReason,
    GangScheduling,
    Phase,
    Reason,
)
from torchflex_operator.planning import plan
from torchflex_operator.planning.rules.defaulting import replicas_patch
from torchflex_operator.render import builders, pdb, podgroup
from torchflex_operator.render import workload as queueing
from torchflex_operator.runtime.agent_status import poll_targets

REPO = Path(__file__).resolve().parents[3]
GANG = dataclasses.replace(Settings(), gang_scheduling=GangScheduling.ENABLED)

# Computed by the operator of main before spec.roles existed (commit eb76eff): the
# worker pod's name, its spec hash, a digest of the whole pod manifest, and one of its
# budget, PodGroup and Services. A single-role job must keep every one of them, or an
# operator upgrade would roll (or rename) every running job's pods.
GOLDEN = {
    "elasticjob-c10d.yaml": (
        "mnist-c10d-worker-1",
        "31dc706af2dda7ef",
        "d5e21129eee71fcb",
        "d812a9e5b47c5286",
    ),
    "elasticjob-etcd.yaml": (
        "mnist-etcd-worker-1",
        "e7535737be50c1ce",
        "27ff11c3910cf268",
        "959eedc64052d8a8",
    ),
    "factory": ("demo-worker-1", "8f372d23060cab40", "ee1dbb406c31b5f8", "dd54156403cb5a7c"),
    "factory-rich": (
        "demo-worker-1",
        "08ad7e34f8d2ce6f",
        "0f5563755b79199f",
        "f2d7127db2ab0f9b",
    ),
}


def single_role_jobs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj.get("kind") == "ElasticJob":
                obj["metadata"]["uid"] = "0123456789abcdef"
                yield path.name, obj
    yield "factory", job_obj()
    yield (
        "factory-rich",
        job_obj(
            replicas=3,
            warmSpares=1,
            hangTimeoutSeconds=60,
            nodeCheck={"enabled": True},
            nprocPerNode=2,
            rendezvous={"backend": "etcd", "endpoint": "e:2379", "tlsSecretName": "tls"},
        ),
    )


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def test_single_role_jobs_keep_pod_names_spec_hash_and_every_manifest() -> None:
    seen = {}
    for label, obj in single_role_jobs():
        job = JobSpec.parse(obj)
        assert not job.multi_role and job.role_views() == (job,)
        pod = builders.worker_pod(job, 1, GANG)
        others = [pdb.pod_disruption_budget(job), podgroup.pod_group(job), builders.services(job)]
        seen[label] = (
            pod["metadata"]["name"],
            builders.template_hash(job),
            digest(pod),
            digest(others),
        )
    assert seen == GOLDEN


def test_a_two_role_job_parses_into_roles_and_role_views() -> None:
    job = roles_job(coupling="Joint", scaleRole="reader", replicas=3)
    assert job.multi_role and job.coupling is Coupling.JOINT
    assert [r.name for r in job.roles] == ["trainer", "reader"]
    assert [r.failure_scope for r in job.roles] == [FailureScope.ROLE, FailureScope.ROLE]
    trainer, reader = job.role_views()
    assert (trainer.role, trainer.min_replicas, trainer.max_replicas) == ("trainer", 2, 2)
    assert (reader.role, reader.min_replicas, reader.max_replicas) == ("reader", 1, 4)
    assert (trainer.nproc_per_node, reader.nproc_per_node) == ("auto", "2")
    # spec.replicas drives the scale role only; the other role runs at its maximum.
    assert (trainer.desired, reader.desired, job.desired) == (2, 3, 5)
    assert reader.template["spec"]["containers"][0]["command"] == ["python", "read.py"]
    # The whole job: the roles' ranges summed, the first role's template (store placement).
    assert (job.min_replicas, job.max_replicas) == (3, 6)
    assert job.template == trainer.template
    assert (job.scale_role_name, job.completion_role_name) == ("reader", "trainer")


@pytest.mark.parametrize(
    ("spec", "replicas", "want"),
    [
        ({}, None, (2, 4)),  # absent everything: every role at its maximum
        ({}, 2, (2, 4)),  # no scaleRole: spec.replicas drives the first role (fixed, 2:2)
        ({"scaleRole": "reader"}, 1, (2, 1)),
        ({"scaleRole": "reader"}, None, (2, 3)),  # the role's own replicas
        ({"scaleRole": "reader"}, 4, (2, 4)),  # spec.replicas wins over it
    ],
)
def test_desired_per_role(
    spec: dict[str, Any], replicas: int | None, want: tuple[int, int]
) -> None:
    roles = (role("trainer", 2, 2), role("reader", 1, 4, replicas=3 if spec else None))
    if replicas is not None:
        spec = {**spec, "replicas": replicas}
    job = roles_job(*roles, **spec)
    assert tuple(v.desired for v in job.role_views()) == want
    assert (job.scale_role_name, job.completion_role_name)[1] == "trainer"


def plus(obj: dict[str, Any], **spec: Any) -> dict[str, Any]:
    obj["spec"].update(spec)
    return obj


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (plus(roles_obj(), minReplicas=1), "spec.roles is mutually exclusive"),
        (plus(roles_obj(), template={"spec": {}}), "spec.roles is mutually exclusive"),
        (roles_obj(role("trainer", 1, 1), role("trainer", 1, 2)), "appears twice"),
        (roles_obj(role("store", 1, 1)), "is reserved"),
        (roles_obj(role("worker", 1, 1)), "is reserved"),
        (roles_obj(role("Trainer", 1, 1)), "must be a DNS label"),
        (roles_obj(role("a" * 21, 1, 1)), "at most 20 characters"),
        (roles_obj(role("trainer", 3, 2)), "spec.roles[0]: need 1 <= minReplicas"),
        (roles_obj(role("trainer", 1, 2, replicas=5)), "spec.roles[0].replicas"),
        (roles_obj(scaleRole="ps"), "spec.scaleRole 'ps' names no role"),
        (roles_obj(completionRole="ps"), "spec.completionRole 'ps' names no role"),
        (
            roles_obj(coupling="Joint", completionRole="trainer"),
            "spec.completionRole is not read with coupling Joint",
        ),
        (roles_obj(warmSpares=1), "spec.warmSpares is not read with spec.roles"),
        (roles_obj(role("trainer", 1, 1, failureScope="Node")), "invalid ElasticJob spec"),
        (roles_obj(coupling="Loose"), "invalid ElasticJob spec"),
        (job_obj(coupling="Joint"), "need spec.roles"),
        (job_obj(scaleRole="trainer"), "need spec.roles"),
        ({"metadata": {"name": "demo"}, "spec": {"roles": []}}, "at least one role"),
    ],
)
def test_the_operator_refuses_what_the_schema_should_have(
    obj: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidSpecError) as raised:
        JobSpec.parse(obj)
    assert fragment in str(raised.value)


def queued(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team"}
    return obj


def test_under_a_kueue_queue_at_most_one_role_is_elastic() -> None:
    # CEL on a custom resource reads no labels: the operator refuses this one.
    two_elastic = queued(roles_obj(role("trainer", 1, 2), role("reader", 1, 4)))
    with pytest.raises(InvalidSpecError) as raised:
        JobSpec.parse(two_elastic)
    message = str(raised.value)
    assert "spec.roles" in message and "Kueue" in message and "trainer, reader" in message
    assert JobSpec.parse(queued(roles_obj())).queue_name == "team"  # one elastic role
    assert JobSpec.parse(roles_obj(role("trainer", 1, 2), role("reader", 1, 4))).multi_role


def role_pod(view: JobSpec, index: int, phase: str = "Running", **kw: Any) -> PodView:
    """Role pod ``index`` of ``view`` (a role view) as the watch shows it."""
    pod = PodView.from_pod(builders.worker_pod(view, index, GANG) | {"status": {"phase": phase}})
    return dataclasses.replace(pod, ready=phase == "Running", node_name="node-a", **kw)


def test_a_multi_role_job_creates_every_role_pod_and_one_store() -> None:
    job = roles_job()  # trainer 2:2, reader 1:4 (desired 4)
    result = plan(job, parsed({}), observed(services=frozenset()), NOW)
    names = sorted(m["metadata"]["name"] for m in result.create_pods)
    readers = [f"demo-reader-{i}" for i in range(4)]
    assert names == sorted(["demo-trainer-0", "demo-trainer-1", *readers])
    # The store (observed here), its Service and the NetworkPolicy: the job's, once.
    services = [m["metadata"]["name"] for m in result.create_services]
    assert len(services) == len(set(services)) and services
    assert len(result.create_network_policies) == 1
    without_store = plan(job, parsed({}), Observed(pods=()), NOW)
    stores = [m for m in without_store.create_pods if m["metadata"]["name"] == "demo-store"]
    assert len(stores) == 1
    assert [e.reason for e in without_store.events].count(EventReason.STORE_CREATED) == 1


def admitted_workload(job: JobSpec, **counts: int) -> WorkloadView:
    """``job``'s Workload as Kueue left it: admitted, with ``counts`` per pod set."""
    obj = queueing.workload(job, None)
    obj["status"] = {
        "conditions": [
            {"type": t, "status": "True", "reason": "R", "message": "",
             "lastTransitionTime": "2025-01-01T11:00:00Z"}
            for t in ("QuotaReserved", "Admitted")
        ],
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": n, "count": c} for n, c in counts.items()],
        },
    }  # fmt: skip
    return WorkloadView.parse(obj)


def test_a_queued_multi_role_job_asks_kueue_for_one_pod_set_per_role() -> None:
    job = JobSpec.parse(queued(roles_obj(role("trainer", 2, 2), role("reader", 1, 4))))
    sets = queueing.workload(job, None)["spec"]["podSets"]
    # The one elastic role has a minCount (partial admission); a fixed role has none.
    assert [(s["name"], s["count"], s.get("minCount")) for s in sets] == [
        ("trainer", 2, None),
        ("reader", 4, 1),
    ]
    trainer, reader = job.role_views()
    assert [s["template"] for s in sets] == [trainer.template, reader.template]
    assert not queueing.stale(job, admitted_workload(job, trainer=2, reader=3))
    wider = JobSpec.parse(queued(roles_obj(role("trainer", 2, 2), role("reader", 1, 5))))
    assert queueing.stale(wider, admitted_workload(job, trainer=2, reader=3))
    gate = queueing.gate(wider, admitted_workload(job, trainer=2, reader=3))
    assert gate is not None and gate.holds
    assert "asked for trainer 2, reader 1-4 pods and the job now runs trainer 2, reader 1-5" in (
        gate.message
    )


@pytest.mark.parametrize(
    ("counts", "want"),
    [
        ({"trainer": 2, "reader": 3}, (5, (("trainer", 2), ("reader", 3)))),
        ({"trainer": 2}, (6, (("trainer", 2), ("reader", 4)))),  # no count: admitted whole
        ({"trainer": 2, "reader": 5}, "Kueue admitted 5 pods of role reader, outside 1-4"),
        ({"trainer": 1, "reader": 3}, "Kueue admitted 1 pods of role trainer, outside 2-2"),
    ],
)
def test_kueue_admits_each_role_its_own_count(
    counts: dict[str, int], want: tuple[int, tuple[tuple[str, int], ...]] | str
) -> None:
    job = JobSpec.parse(queued(roles_obj(role("trainer", 2, 2), role("reader", 1, 4))))
    gate = queueing.gate(job, admitted_workload(job, **counts))
    assert gate is not None
    if isinstance(want, str):
        assert gate.holds and gate.message == want
    else:
        assert not gate.holds and (gate.count, gate.role_counts) == want


def test_a_partially_admitted_multi_role_job_runs_each_role_at_its_admitted_count() -> None:
    job = JobSpec.parse(queued(roles_obj(role("trainer", 2, 2), role("reader", 1, 4))))
    gate = queueing.gate(job, admitted_workload(job, trainer=2, reader=3))
    assert gate is not None
    result = plan(job, parsed({"phase": "Suspended"}), observed(queue=gate), NOW)
    names = sorted(m["metadata"]["name"] for m in result.create_pods)
    assert [n for n in names if n != "demo-store"] == [
        "demo-reader-0", "demo-reader-1", "demo-reader-2", "demo-trainer-0", "demo-trainer-1",
    ]  # fmt: skip
    status = decided(result)
    assert status.desired_replicas == 5 and status.phase is Phase.PENDING
    assert [(r.name, r.desired) for r in status.roles or ()] == [("trainer", 2), ("reader", 3)]
    (message,) = [e.message for e in result.events if e.reason == EventReason.ADMITTED]
    assert message.endswith("at 5 worker(s) (trainer 2, reader 3)")
    # An admission never raises a desired count: the scale role at spec.replicas 2.
    scaled = dataclasses.replace(job, scale_role="reader", replicas=2)
    assert [v.desired for v in scaled.admitted(5, dict(gate.role_counts)).role_views()] == [2, 2]


def test_a_multi_role_job_runs_when_every_role_runs() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=1))
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(reader, 0, "Pending")]
    status = decided(plan(job, parsed({}), observed(*pods), NOW))
    assert status.phase is Phase.PENDING  # the reader is below its minimum
    avail = next(c for c in status.conditions or () if c.is_type(ConditionType.MIN_AVAILABLE))
    assert avail.status == "False" and avail.message.startswith("role reader: ")
    pods[2] = role_pod(reader, 0)
    status = decided(plan(job, status, observed(*pods), NOW))
    assert status.phase is Phase.RUNNING
    avail = next(c for c in status.conditions or () if c.is_type(ConditionType.MIN_AVAILABLE))
    assert avail.status == "True" and "role trainer: " in avail.message
    assert "role reader: " in avail.message


def done(pod: PodView, code: int = 0) -> PodView:
    return dataclasses.replace(
        pod, phase="Succeeded" if code == 0 else "Failed", ready=False, exit_code=code
    )


def test_the_completion_role_completes_the_job_and_stops_the_other_roles() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=1))
    trainer, reader = job.role_views()
    pods = [done(role_pod(trainer, 0)), done(role_pod(trainer, 1)), role_pod(reader, 0)]
    result = plan(job, parsed({"phase": "Running"}), observed(*pods), NOW)
    assert decided(result).phase is Phase.SUCCEEDED
    assert not result.create_pods
    assert "demo-reader-0" in {d.name for d in result.delete_pods}


def test_a_role_that_is_not_the_completion_role_finishing_does_not_end_the_job() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=1))
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), done(role_pod(reader, 0))]
    result = plan(job, parsed({"phase": "Running"}), observed(*pods), NOW)
    status = decided(result)
    assert status.phase is not None and not status.phase.finished
    assert not any(m["metadata"]["name"].startswith("demo-reader") for m in result.create_pods)


@pytest.mark.parametrize(
    ("spec", "roles", "want"),
    [
        ({}, (), 2),  # the first role (trainer 2:2)
        ({"scaleRole": "reader"}, (), 4),
        (
            {"scaleRole": "reader"},
            (role("trainer", 2, 2), role("reader", 1, 4, replicas=3)),
            3,
        ),
    ],
)
def test_spec_replicas_is_written_for_the_scale_role(
    spec: dict[str, Any], roles: tuple[dict[str, Any], ...], want: int
) -> None:
    patch = replicas_patch(roles_obj(*roles, **spec))
    assert patch is not None and patch["spec"] == {"replicas": want}


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_each_role_gets_its_pods_labels_env_and_template() -> None:
    job = roles_job(coupling="Joint")
    trainer, reader = (
        builders.worker_pod(view, i, GANG) for view, i in zip(job.role_views(), (1, 3), strict=True)
    )
    assert (trainer["metadata"]["name"], reader["metadata"]["name"]) == (
        "demo-trainer-1",
        "demo-reader-3",
    )
    for pod, name in ((trainer, "trainer"), (reader, "reader")):
        assert pod["metadata"]["labels"]["torchflex.io/role"] == "worker"
        assert pod["metadata"]["labels"]["torchflex.io/training-role"] == name
        assert pod["spec"]["hostname"] == pod["metadata"]["name"]
        assert pod["spec"]["subdomain"] == "demo-workers"  # one headless Service for all
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"demo-{name}"}
    t, r = env_of(trainer), env_of(reader)
    assert (t["TORCHFLEX_ROLE"], r["TORCHFLEX_ROLE"]) == ("trainer", "reader")
    assert t["TORCHFLEX_COUPLING"] == r["TORCHFLEX_COUPLING"] == "Joint"
    assert t["TORCHFLEX_ROLE_SIZES"] == r["TORCHFLEX_ROLE_SIZES"] == "trainer=2:2,reader=1:4"
    assert (t["TORCHFLEX_NNODES"], r["TORCHFLEX_NNODES"]) == ("2:2", "1:4")
    assert (t["TORCHFLEX_NPROC_PER_NODE"], r["TORCHFLEX_NPROC_PER_NODE"]) == ("auto", "2")
    assert t["TORCHFLEX_RDZV_ID"] == r["TORCHFLEX_RDZV_ID"] == job.rdzv_id
    assert t["TORCHFLEX_REPLICA_INDEX"] == "1"
    assert reader["spec"]["containers"][0]["command"][-2:] == ["python", "read.py"]
    # A single-role job's pods carry none of the role variables or the label.
    single = builders.worker_pod(JobSpec.parse(job_obj()), 0, GANG)
    assert not {"TORCHFLEX_ROLE", "TORCHFLEX_COUPLING", "TORCHFLEX_ROLE_SIZES"} & set(
        env_of(single)
    )
    assert "torchflex.io/training-role" not in single["metadata"]["labels"]


def test_a_multi_role_job_is_built_role_by_role_only() -> None:
    job = roles_job()
    with pytest.raises(ValueError, match="role_view"):
        builders.worker_pod(job, 0, GANG)
    with pytest.raises(ValueError, match="role_view"):
        builders.worker_pod(job.role_view("trainer"), 0, GANG, role="reader")


def hashes(obj: dict[str, Any]) -> dict[str, str]:
    return {v.role: builders.template_hash(v) for v in JobSpec.parse(obj).role_views()}


def test_the_spec_hash_is_per_role() -> None:
    base = hashes(roles_obj())
    assert base["trainer"] != base["reader"]
    # The reader's template rolls readers only; spec.replicas rolls nothing.
    edited = roles_obj(role("trainer", 2, 2), role("reader", 1, 4, "read2.py", nprocPerNode=2))
    changed = hashes(edited)
    assert changed["trainer"] == base["trainer"] and changed["reader"] != base["reader"]
    assert hashes(roles_obj(replicas=2)) == base
    reader_scaled = roles_obj(
        role("trainer", 2, 2), role("reader", 1, 4, "read.py", replicas=2, nprocPerNode=2)
    )
    assert hashes(reader_scaled) == base
    # A range or the coupling is in every role's env: every role rolls.
    wider = roles_obj(role("trainer", 2, 2), role("reader", 1, 5, "read.py", nprocPerNode=2))
    for changed in (hashes(wider), hashes(roles_obj(coupling="Joint"))):
        assert changed["trainer"] != base["trainer"] and changed["reader"] != base["reader"]
    # The pod carries the hash of its role.
    view = JobSpec.parse(roles_obj()).role_view("reader")
    pod = builders.worker_pod(view, 0, GANG)
    assert pod["metadata"]["annotations"]["torchflex.io/spec-hash"] == base["reader"]


def test_each_role_has_its_budget_and_gang() -> None:
    trainer, reader = roles_job().role_views()
    for view, name, minimum in ((trainer, "demo-trainer", 2), (reader, "demo-reader", 1)):
        budget = pdb.pod_disruption_budget(view)
        assert budget["metadata"]["name"] == pdb.budget_name(view) == name
        assert budget["spec"]["minAvailable"] == minimum
        assert budget["spec"]["selector"]["matchLabels"] == {
            "torchflex.io/job-name": "demo",
            "torchflex.io/role": "worker",
            "torchflex.io/training-role": view.role,
        }
        group = podgroup.pod_group(view)
        assert group["metadata"]["name"] == podgroup.pod_group_name(view) == name
        assert podgroup.min_count(group) == minimum
        assert group["metadata"]["labels"]["torchflex.io/training-role"] == view.role


def test_a_role_pod_is_observed_in_its_group() -> None:
    job = roles_job()
    pods = [
        PodView.from_pod(builders.worker_pod(view, 0, GANG) | {"status": {}})
        for view in job.role_views()
    ]
    assert [p.group for p in pods] == ["trainer", "reader"]
    groups = Observed(pods=tuple(pods)).groups()
    assert {k: [p.name for p in v] for k, v in groups.items()} == {
        "trainer": ["demo-trainer-0"],
        "reader": ["demo-reader-0"],
    }
    single = PodView.from_pod(builders.worker_pod(JobSpec.parse(job_obj()), 0, GANG))
    assert single.group == "worker" and single.training_role is None


def test_status_roles_say_each_role_and_the_selector_names_the_scale_role() -> None:
    job = roles_job(scaleRole="reader", replicas=3)
    trainer, reader = job.role_views()
    pods = [
        PodView.from_pod(builders.worker_pod(view, i, GANG) | {"status": {"phase": "Running"}})
        for view, i in ((trainer, 0), (trainer, 1), (reader, 0))
    ]
    pods = [dataclasses.replace(p, ready=p.name != "demo-trainer-1") for p in pods]
    reports = {"demo-reader-0": AgentReport(AgentState.RUNNING, round=4, world_size=2)}
    result = plan(job, parsed({}), observed(*pods, reports=reports), NOW)
    status = decided(result).to_manifest()
    assert status["roles"] == [
        {"name": "trainer", "desired": 2, "replicas": 2, "ready": 1, "worldSize": 0, "round": -1},
        {"name": "reader", "desired": 3, "replicas": 1, "ready": 1, "worldSize": 2, "round": 4},
    ]
    assert status["roleSummary"] == "trainer 1/2 reader 1/3"
    selector = (
        "torchflex.io/job-name=demo,torchflex.io/role=worker,torchflex.io/training-role=reader"
    )
    assert status["selector"] == selector
    # A job of one group writes neither.
    single = decided(plan(JobSpec.parse(job_obj()), parsed({}), observed(), NOW)).to_manifest()
    assert "roles" not in single and "roleSummary" not in single


def test_a_steady_multi_role_job_changes_nothing_on_the_next_pass() -> None:
    # Each role is planned from the status the role before left: nothing may flip
    # between them from one pass to the next (no events, no status write).
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=2))
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(reader, 0), role_pod(reader, 1)]
    first = decided(plan(job, parsed({}), observed(*pods), NOW))
    status = JobStatus.parse(first.to_manifest())
    again = plan(job, status, observed(*pods), NOW)
    assert not again.events and not again.create_pods and not again.delete_pods
    assert decided(again) == status
    assert status.desired_replicas == 4 and status.phase is Phase.RUNNING


def test_scaling_the_scale_role_touches_that_role_only() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=2), scaleRole="reader")
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(reader, 0), role_pod(reader, 1)]
    status = decided(plan(job, parsed({}), observed(*pods), NOW))
    bigger = dataclasses.replace(job, replicas=3)
    result = plan(bigger, status, observed(*pods), NOW)
    assert [m["metadata"]["name"] for m in result.create_pods] == ["demo-reader-2"]
    assert [e.message for e in result.events if e.reason == EventReason.SCALED_UP] == [
        "desired replicas 2 -> 3"
    ]
    smaller = dataclasses.replace(job, replicas=1)
    assert [d.name for d in plan(smaller, status, observed(*pods), NOW).delete_pods] == [
        "demo-reader-1"
    ]


def test_the_job_s_round_world_and_progress_are_the_completion_role_s() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=1))
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(reader, 0)]
    reports = {
        "demo-trainer-0": AgentReport(
            AgentState.RUNNING, round=1, world_size=2, holds_rank0=True, progress=Progress(step=5)
        ),
        "demo-trainer-1": AgentReport(AgentState.RUNNING, round=1, world_size=2),
        "demo-reader-0": AgentReport(
            AgentState.RUNNING, round=7, world_size=1, holds_rank0=True, progress=Progress(step=90)
        ),
    }
    status = decided(plan(job, parsed({}), observed(*pods, reports=reports), NOW))
    assert (status.rendezvous_round, status.world_size) == (1, 2)
    assert status.progress is not None and status.progress.step == 5
    assert status.rank0_pod == "demo-trainer-0"
    # Every role's pods are of their role's current spec.
    assert status.updated_replicas == 3
    assert [(r.name, r.round, r.world_size) for r in status.roles or ()] == [
        ("trainer", 1, 2),
        ("reader", 7, 1),
    ]


def test_the_poller_asks_the_first_pods_of_each_role() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3))
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, i) for i in range(2)] + [role_pod(reader, i) for i in range(3)]
    names = [p.name for p in poll_targets(pods, 2)]
    assert names == ["demo-reader-0", "demo-reader-1", "demo-trainer-0", "demo-trainer-1"]
    single = [worker(i) for i in range(3)]  # one group: the first per_job, as ever
    assert [p.name for p in poll_targets(single, 2)] == ["demo-worker-0", "demo-worker-1"]


def test_any_role_failing_fails_the_job_and_stops_every_role() -> None:
    job = roles_job(role("trainer", 2, 2), role("reader", 1, 3, replicas=1), backoffLimit=0)
    trainer, reader = job.role_views()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), done(role_pod(reader, 0), 1)]
    result = plan(job, parsed({"phase": "Running"}), observed(*pods), NOW)
    status = decided(result)
    assert status.phase is Phase.FAILED
    assert status.last_failure is not None and status.last_failure.pod == "demo-reader-0"
    assert not result.create_pods
    assert {"demo-trainer-0", "demo-trainer-1"} <= {d.name for d in result.delete_pods}


# -- Joint coupling: one rendezvous group across the roles --------------------------


def joint_report(round_: int, node_rank: int, *, nodes: int = 3, **kw: Any) -> AgentReport:
    """An agent's report of joint round ``round_`` (``nodes`` agents of every role)."""
    return AgentReport(
        AgentState.RUNNING, round=round_, world_size=nodes, node_rank=node_rank, nodes=nodes, **kw
    )


def joint_job() -> tuple[JobSpec, JobSpec, JobSpec]:
    """trainer 2:2 and ps 1:1, Joint: three agents in one round."""
    job = roles_job(role("trainer", 2, 2), role("ps", 1, 1), coupling="Joint")
    trainer, ps = job.role_views()
    return job, trainer, ps


def test_a_joint_multi_role_job_is_run_with_every_role_pod() -> None:
    job, _, _ = joint_job()
    result = plan(job, parsed({}), Observed(pods=()), NOW)
    names = sorted(m["metadata"]["name"] for m in result.create_pods)
    assert names == ["demo-ps-0", "demo-store", "demo-trainer-0", "demo-trainer-1"]


def test_a_joint_round_completes_only_when_every_role_s_members_exited_0() -> None:
    # The trainers (node ranks 0, 1) finish first; the ps (node rank 2) of the same joint
    # round still runs: the job is completing, waiting for the ps, whichever role's pass
    # judges it. An Independent job's completion role would have succeeded here.
    job, trainer, ps = joint_job()
    pods = [done(role_pod(trainer, 0)), done(role_pod(trainer, 1)), role_pod(ps, 0)]
    reports = {
        "demo-trainer-0": joint_report(3, 0),
        "demo-trainer-1": joint_report(3, 1),
        "demo-ps-0": joint_report(3, 2),
    }
    result = plan(job, parsed({"phase": "Running"}), observed(*pods, reports=reports), NOW)
    status = decided(result)
    assert status.phase is not None and not status.phase.finished
    assert status.completing_since == NOW.replace(microsecond=0)
    assert [e.reason for e in result.events].count(EventReason.COMPLETING) == 1
    message = next(e.message for e in result.events if e.reason == EventReason.COMPLETING)
    assert "2 of 3 member(s) of rendezvous round 3 exited 0" in message
    assert "node rank(s) 2" in message and "demo-ps-0" in message
    assert not result.create_pods and "demo-ps-0" not in {d.name for d in result.delete_pods}
    size = next(c for c in status.conditions or () if c.is_type(ConditionType.AT_DESIRED_SIZE))
    assert (size.status, size.reason) == ("False", Reason.COMPLETING)
    # The ps exits 0 too: every member of the joint round did, so the job succeeded.
    pods[2] = done(pods[2])
    final = decided(plan(job, status, observed(*pods, reports=reports), NOW))
    assert final.phase is Phase.SUCCEEDED
    succeeded = next(c for c in final.conditions or () if c.is_type(ConditionType.SUCCEEDED))
    assert succeeded.message == "all 3 member(s) of rendezvous round 3 exited 0"


def test_a_joint_round_member_of_another_role_failing_fails_the_completing_job() -> None:
    job, trainer, ps = joint_job()
    pods = [done(role_pod(trainer, 0)), done(role_pod(trainer, 1)), done(role_pod(ps, 0), 1)]
    reports = {
        "demo-trainer-0": joint_report(3, 0),
        "demo-trainer-1": joint_report(3, 1),
    }
    status = decided(plan(job, parsed({"phase": "Running"}), observed(*pods, reports=reports), NOW))
    assert status.phase is Phase.FAILED
    failed = next(c for c in status.conditions or () if c.is_type(ConditionType.FAILED))
    assert "node rank(s) 2 ended without exiting 0" in failed.message


def test_a_joint_job_s_round_world_progress_and_rank0_come_from_every_role() -> None:
    job, trainer, ps = joint_job()
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(ps, 0)]
    reports = {
        # The ps was first at the rendezvous: it holds node rank 0 and global rank 0.
        "demo-ps-0": joint_report(2, 0, holds_rank0=True),
        "demo-trainer-0": joint_report(2, 1, progress=Progress(step=12)),
        "demo-trainer-1": joint_report(2, 2, progress=Progress(step=11)),
    }
    status = decided(plan(job, parsed({}), observed(*pods, reports=reports), NOW))
    assert (status.rendezvous_round, status.world_size) == (2, 3)
    assert status.rank0_pod == "demo-ps-0"
    assert status.progress is not None and status.progress.step == 12
    training = next(c for c in status.conditions or () if c.is_type(ConditionType.TRAINING))
    assert training.status == "True" and "world size 3" in training.message
    # One of the joint round's agents re-forms: every role's Training says so.
    reports["demo-ps-0"] = dataclasses.replace(reports["demo-ps-0"], state=AgentState.RENDEZVOUS)
    again = decided(plan(job, status, observed(*pods, reports=reports), NOW))
    training = next(c for c in again.conditions or () if c.is_type(ConditionType.TRAINING))
    assert training.status == "False" and training.reason == Reason.RENDEZVOUSING


def test_job_scoped_roles_reach_every_role_s_agents_and_roll_the_pods() -> None:
    scoped = roles_job(role("trainer", 2, 2), role("ps", 1, 1, failureScope="Job"))
    plain = roles_job(role("trainer", 2, 2), role("ps", 1, 1))
    joint = roles_job(role("trainer", 2, 2), role("ps", 1, 1, failureScope="Job"), coupling="Joint")
    var = "TORCHFLEX_JOB_SCOPED_ROLES"

    def envs(job: JobSpec) -> list[str | None]:
        return [env_of(builders.worker_pod(v, 0, GANG)).get(var) for v in job.role_views()]

    # Every role's agents watch the Job-scoped roles (a ps agent watches none but its own).
    assert envs(scoped) == ["ps", "ps"]
    # Role scope everywhere, or Joint (one group: any failure re-forms all): no variable,
    # so the pods of jobs from before keep their spec hash.
    assert envs(plain) == [None, None] and envs(joint) == [None, None]
    assert builders.template_hash(scoped.role_views()[0]) != builders.template_hash(
        plain.role_views()[0]
    )


def test_a_role_keeps_its_own_warm_spares_and_scaling_it_promotes_one() -> None:
    job = roles_job(
        role("trainer", 2, 2), role("reader", 1, 4, replicas=2, warmSpares=1), scaleRole="reader"
    )
    trainer, reader = job.role_views()
    assert (trainer.warm_spares, reader.warm_spares) == (0, 1) and job.keeps_spares
    pods = [role_pod(trainer, 0), role_pod(trainer, 1), role_pod(reader, 0), role_pod(reader, 1)]
    result = plan(job, parsed({"phase": "Running"}), observed(*pods), NOW)
    # The reader role's spare sits at its next index, annotated standby; no trainer spare.
    (made,) = [m for m in result.create_pods if m["metadata"]["name"] != "demo-store"]
    assert made["metadata"]["name"] == "demo-reader-2"
    assert made["metadata"]["annotations"]["torchflex.io/standby"] == "true"
    status = decided(result)
    spare = role_pod(reader, 2, standby=True)
    again = decided(plan(job, status, observed(*pods, spare), NOW))
    assert again.warm_spares == 1 and again.replicas == 4  # a spare is never a replica
    # kubectl scale (the scale role: reader) to 3 promotes the spare, and a new spare
    # is made at the index after it.
    grown = plan(dataclasses.replace(job, replicas=3), again, observed(*pods, spare), NOW)
    assert [p.name for p in grown.promote_pods] == ["demo-reader-2"]
    assert EventReason.SPARE_PROMOTED in [e.reason for e in grown.events]


@pytest.mark.parametrize(
    ("spares", "fragment"),
    [(4, "spec.roles[1].warmSpares must be within [0, maxReplicas - minReplicas]"),
     (-1, "spec.roles[1].warmSpares must be within")],
)  # fmt: skip
def test_a_role_s_warm_spares_fit_its_room_to_grow(spares: int, fragment: str) -> None:
    with pytest.raises(InvalidSpecError) as raised:
        JobSpec.parse(roles_obj(role("trainer", 2, 2), role("reader", 1, 4, warmSpares=spares)))
    assert fragment in str(raised.value)
