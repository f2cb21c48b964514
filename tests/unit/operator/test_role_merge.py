"""How the roles of a multi-role job add up to the job (planning.rules.roles): tables."""

from __future__ import annotations

import datetime as dt

import pytest

from torchflex_operator.model.status import Condition, ConditionStatus
from torchflex_operator.model.vocabulary import ConditionType, Phase, Reason
from torchflex_operator.planning.rules.roles import (
    RoleOutcome,
    Said,
    below_min_since,
    job_condition,
    job_phase,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(seconds=30)


def out(
    name: str, phase: Phase | None = None, since: dt.datetime | None = None, *conds: Condition
) -> RoleOutcome:
    return RoleOutcome(name, phase, since, conds)


def cond(status: bool, reason: Reason, message: str) -> Condition:
    value = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    return Condition(ConditionType.TRAINING.value, value, reason.value, message, T0)


R, P, S = Phase.RUNNING, Phase.PENDING, Phase.RESTARTING


@pytest.mark.parametrize(
    ("phases", "want"),
    [
        ((R, R), R),
        ((R, P), P),
        ((P, R), P),
        ((R, S), S),
        ((P, S), S),
        ((None, R), R),
        ((None, None), None),
    ],
)
def test_the_job_phase_is_its_worst_role(
    phases: tuple[Phase | None, ...], want: Phase | None
) -> None:
    assert job_phase([out(f"r{i}", p) for i, p in enumerate(phases)]) == want


@pytest.mark.parametrize(
    ("times", "want"),
    [((None, None), None), ((T1, None), T1), ((T1, T0), T0), ((None, T0), T0)],
)
def test_below_minimum_since_the_earliest_role(
    times: tuple[dt.datetime | None, ...], want: dt.datetime | None
) -> None:
    assert below_min_since([out(f"r{i}", R, t) for i, t in enumerate(times)]) == want


TRAINS = cond(True, Reason.WORKERS_TRAINING, "world 2")
WAITS = cond(False, Reason.RENDEZVOUSING, "forming")


@pytest.mark.parametrize(
    ("conds", "want"),
    [
        (
            (TRAINS, TRAINS),
            Said(True, Reason.WORKERS_TRAINING, "role a: world 2; role b: world 2"),
        ),
        ((TRAINS, WAITS), Said(False, Reason.RENDEZVOUSING, "role b: forming")),
        ((WAITS, WAITS), Said(False, Reason.RENDEZVOUSING, "role a: forming")),
        ((None, TRAINS), Said(True, Reason.WORKERS_TRAINING, "role b: world 2")),
        ((None, None), None),
        # A reason this operator does not know (an older one's status) is left out.
        (
            (TRAINS, Condition(ConditionType.TRAINING.value, ConditionStatus.FALSE, "Old")),
            Said(True, Reason.WORKERS_TRAINING, "role a: world 2"),
        ),
    ],
)
def test_a_condition_is_true_for_the_job_only_when_true_for_every_role(
    conds: tuple[Condition | None, ...], want: Said | None
) -> None:
    outcomes = [
        out(name, R, None, *(() if c is None else (c,)))
        for name, c in zip("ab", conds, strict=True)
    ]
    assert job_condition(ConditionType.TRAINING, outcomes) == want
