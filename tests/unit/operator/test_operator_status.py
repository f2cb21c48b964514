"""``JobStatus``: parse from the API's dict, write back the same dict; tolerant of the rest."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pathlib
from typing import Any

import pytest
import yaml

from tests.unit.operator.factories import NOW
from torchflex_operator.model.status import (
    Condition,
    ConditionStatus,
    JobStatus,
    LastFailure,
    LostVerdict,
    PendingEvent,
    Record,
    SilentMember,
    TrainingProgress,
    WorkerException,
    merge_patch,
    wire_keys,
)
from torchflex_operator.model.vocabulary import EventType, Phase

REPO = pathlib.Path(__file__).resolve().parents[3]

# Written by the planner before JobStatus existed (dict in, dict out), verbatim:
# a failed worker being replaced while the job is below minReplicas.
PREVIOUS_VERSION: dict[str, Any] = {
    "phase": "Restarting",
    "startTime": "2025-01-01T11:59:50Z",
    "desiredReplicas": 4,
    "conditions": [
        {
            "type": "MinAvailable",
            "status": "False",
            "reason": "BelowMinReplicas",
            "message": "1 of minimum 2 workers running",
            "lastTransitionTime": "2025-01-01T12:00:00Z",
        },
        {
            "type": "AtDesiredSize",
            "status": "False",
            "reason": "BackingOff",
            "message": "1 of 4 desired workers running; replacements wait until "
            "2025-01-01T12:00:01Z",
            "lastTransitionTime": "2025-01-01T12:00:00Z",
        },
    ],
    "replacements": 1,
    "failures": 1,
    "lastFailure": {
        "pod": "demo-worker-1",
        "reason": "UserError",
        "exitCode": 1,
        "counted": True,
        "message": "boom",
        "time": "2025-01-01T12:00:00Z",
    },
    "accountedPods": ["uid-1"],
    "replacementStreak": 1,
    "lastReplacementTime": "2025-01-01T12:00:00Z",
    "backoffUntil": "2025-01-01T12:00:01Z",
    "belowMinSince": "2025-01-01T12:00:00Z",
    "replicas": 1,
    "readyReplicas": 1,
    "updatedReplicas": 1,
    "selector": "torchflex.io/job-name=demo,torchflex.io/role=worker",
    "observedGeneration": 1,
    "restarts": 0,
    "worldSize": 0,
    "rendezvousRound": -1,
    "pendingEvents": [
        {"id": 1, "type": "Warning", "reason": "PodFailed", "message": "pod demo-worker-1 ended"},
        {"id": 2, "type": "Normal", "reason": "BackingOff", "message": "replacing in 1s"},
    ],
    "eventSeq": 2,
    # Keys the previous planner wrote in other passes (completing, fencing, store).
    "rendezvousHost": "demo-store",
    "completionTime": "2025-01-01T12:05:00Z",
    "completingSince": "2025-01-01T12:04:00Z",
    "storeUnreachableSince": "2025-01-01T12:01:00Z",
    "lostVerdicts": [{"pod": "demo-worker-2", "round": 3, "since": "2025-01-01T12:02:00Z"}],
    "silentMembers": [{"pod": "demo-worker-3", "since": "2025-01-01T12:04:30Z"}],
}


def at(seconds: float) -> dt.datetime:
    return NOW + dt.timedelta(seconds=seconds)


def test_a_status_the_previous_version_wrote_reads_typed_and_writes_back_unchanged() -> None:
    status = JobStatus.parse(PREVIOUS_VERSION)
    assert status.phase is Phase.RESTARTING
    assert status.backoff_until == at(1)
    assert status.start_time == at(-10)
    assert status.accounted_pods == ("uid-1",)
    assert status.conditions is not None
    assert status.conditions[0] == Condition(
        "MinAvailable", ConditionStatus.FALSE, "BelowMinReplicas",
        "1 of minimum 2 workers running", NOW,
    )  # fmt: skip
    assert status.last_failure == LastFailure("demo-worker-1", "UserError", 1, True, "boom", NOW)
    assert status.lost_verdicts == (LostVerdict("demo-worker-2", 3, at(120)),)
    assert status.silent_members == (SilentMember("demo-worker-3", at(270)),)
    assert status.pending_events is not None
    assert status.pending_events[0] == PendingEvent(
        1, EventType.WARNING, "PodFailed", "pod demo-worker-1 ended"
    )
    assert status.to_manifest() == PREVIOUS_VERSION
    assert status.to_patch(PREVIOUS_VERSION) == {}
    assert JobStatus.parse(status.to_manifest()) == status


@pytest.mark.parametrize(
    ("raw", "typed", "written"),
    [
        pytest.param({}, JobStatus(), {}, id="empty"),
        pytest.param(
            {"phase": "Running", "replicas": 2},
            JobStatus(phase=Phase.RUNNING, replicas=2),
            {"phase": "Running", "replicas": 2},
            id="missing-keys-stay-missing",
        ),
        pytest.param(
            {"conditions": [], "accountedPods": [], "lostVerdicts": []},
            JobStatus(conditions=(), accounted_pods=(), lost_verdicts=()),
            {"conditions": [], "accountedPods": [], "lostVerdicts": []},
            id="empty-lists-stay-written",
        ),
        pytest.param(
            {"backoffUntil": "soon", "startTime": 5, "belowMinSince": ""},
            JobStatus(),
            {},
            id="bad-timestamps-read-as-missing",
        ),
        pytest.param(
            {"completionTime": "2025-01-01T12:00:00+00:00", "startTime": "2025-01-01T12:00:00"},
            JobStatus(completion_time=NOW, start_time=NOW),
            {"completionTime": "2025-01-01T12:00:00Z", "startTime": "2025-01-01T12:00:00Z"},
            id="other-rfc3339-forms-written-in-the-api-form",
        ),
        pytest.param(
            {"phase": "Exploded", "failures": "3", "replicas": True, "selector": 7},
            JobStatus(),
            {},
            id="wrong-shapes-read-as-missing",
        ),
        pytest.param(
            {"conditions": {"type": "MinAvailable"}, "lastFailure": "boom"},
            JobStatus(),
            {},
            id="wrong-containers-read-as-missing",
        ),
        pytest.param(
            {
                "conditions": [
                    {"type": "Training", "status": "Unknown"},
                    {"type": "MinAvailable"},
                    "junk",
                ],
            },
            JobStatus(conditions=(Condition("Training", ConditionStatus.UNKNOWN),)),
            {
                "conditions": [
                    {"type": "Training", "status": "Unknown", "reason": "", "message": ""}
                ]
            },
            id="unknown-condition-type-kept-entry-without-status-dropped",
        ),
        pytest.param(
            {
                "lostVerdicts": [
                    {"pod": "a", "round": 1, "since": "2025-01-01T12:00:00Z"},
                    {"pod": "b", "round": 2, "since": "never"},
                    {"pod": "c", "since": "2025-01-01T12:00:00Z"},
                ],
                "silentMembers": [None, {"pod": "d", "since": "2025-01-01T12:00:00Z"}],
                "accountedPods": ["u1", 2, "u3"],
            },
            JobStatus(
                lost_verdicts=(LostVerdict("a", 1, NOW),),
                silent_members=(SilentMember("d", NOW),),
                accounted_pods=("u1", "u3"),
            ),
            {
                "lostVerdicts": [{"pod": "a", "round": 1, "since": "2025-01-01T12:00:00Z"}],
                "silentMembers": [{"pod": "d", "since": "2025-01-01T12:00:00Z"}],
                "accountedPods": ["u1", "u3"],
            },
            id="bad-list-entries-dropped",
        ),
        pytest.param(
            {"lastFailure": {"pod": "p", "reason": "MemberLost", "exitCode": None}},
            JobStatus(last_failure=LastFailure("p", "MemberLost")),
            {
                "lastFailure": {
                    "pod": "p",
                    "reason": "MemberLost",
                    "exitCode": None,
                    "counted": False,
                    "message": "",
                }
            },
            id="exit-code-null-is-written-as-null",
        ),
        pytest.param(
            {"pendingEvents": [{"id": 4, "type": "Normal", "reason": "CleanedUp", "message": "m"}]},
            JobStatus(pending_events=(PendingEvent(4, EventType.NORMAL, "CleanedUp", "m"),)),
            {"pendingEvents": [{"id": 4, "type": "Normal", "reason": "CleanedUp", "message": "m"}]},
            id="event-reason-of-another-version-still-posted",
        ),
    ],
)
def test_parse_and_write(raw: dict[str, Any], typed: JobStatus, written: dict[str, Any]) -> None:
    assert JobStatus.parse(raw) == typed
    assert typed.to_manifest() == written
    assert JobStatus.parse(written) == typed


@dataclasses.dataclass(frozen=True)
class _Sample(Record):
    """A record with the scalar codecs ``JobStatus`` does not use yet."""

    rate: float | None = None
    ok: bool | None = None


@pytest.mark.parametrize(
    ("raw", "typed"),
    [
        ({"rate": 2, "ok": True}, _Sample(2.0, True)),
        ({"rate": 0.5, "ok": False}, _Sample(0.5, False)),
        ({"rate": True, "ok": 1}, _Sample()),  # JSON true is no number, 1 no boolean
        ({"rate": "2"}, _Sample()),
    ],
)
def test_scalar_codecs(raw: dict[str, Any], typed: _Sample) -> None:
    assert _Sample.parse(raw) == typed
    assert _Sample.parse(typed.to_manifest()) == typed


def test_a_record_missing_a_required_field_is_refused() -> None:
    assert SilentMember.parse({"pod": "p", "since": "2025-01-01T12:00:00Z"}) == SilentMember(
        "p", NOW
    )
    with pytest.raises(ValueError, match="not a SilentMember"):
        SilentMember.parse({"pod": "p", "since": "never"})


def test_a_field_without_a_codec_fails_loudly() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd(Record):
        when: dt.date | None = None

    with pytest.raises(TypeError, match=r"Odd\.when: no status codec"):
        wire_keys(Odd)


def test_enum_values_are_written_as_plain_strings() -> None:
    manifest = JobStatus(phase=Phase.FAILED).to_manifest()
    assert type(manifest["phase"]) is str


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"replicas": 3, "phase": "Running"}, JobStatus(replicas=3, phase=Phase.RUNNING), {}),
        ({"replicas": 2}, JobStatus(replicas=3), {"replicas": 3}),
        (
            {"replicas": 3, "belowMinSince": "2025-01-01T12:00:00Z"},
            JobStatus(replicas=3),
            {"belowMinSince": None},
        ),
        ({}, JobStatus(backoff_until=NOW), {"backoffUntil": "2025-01-01T12:00:00Z"}),
    ],
)
def test_to_patch(old: dict[str, Any], new: JobStatus, patch: dict[str, Any]) -> None:
    assert new.to_patch(old) == patch == merge_patch(old, new.to_manifest())


def _crd_status() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "elasticjob.yaml").read_text())
    version = crd["spec"]["versions"][0]
    status: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return status


def test_every_status_field_is_declared_in_the_crd_and_nothing_else() -> None:
    """The API server prunes undeclared status keys: a field added on one side only is lost."""
    props = _crd_status()["properties"]
    assert set(wire_keys(JobStatus)) == set(props)
    records = {
        "conditions": Condition,
        "lastFailure": LastFailure,
        "lostVerdicts": LostVerdict,
        "silentMembers": SilentMember,
        "pendingEvents": PendingEvent,
        "progress": TrainingProgress,
    }
    for key, record in records.items():
        schema = props[key].get("items", props[key])
        assert set(wire_keys(record)) == set(schema["properties"]), key
    cause = props["lastFailure"]["properties"]["rootCause"]
    assert set(wire_keys(WorkerException)) == set(cause["properties"])
