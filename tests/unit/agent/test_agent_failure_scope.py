"""Failure scope Job (``loop.logic.scope``): which of another role's ended rounds
re-form this role, and the ``--job-scoped-roles`` flag."""

from __future__ import annotations

import pytest

from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic.config import parse_job_scoped_roles
from torchflex_agent.loop.logic.scope import Ended, ScopeWatch, first_sight, judge, to_read
from torchflex_agent.rendezvous.logic import StaleMark
from torchflex_contract.progress import RestartReason
from torchflex_contract.roles import Coupling, RoleSize, parse_role_sizes

R = RestartReason


def mark(reason: RestartReason, detail: str = "") -> StaleMark:
    return StaleMark(reason, "node-x", detail)


Case = tuple[
    ScopeWatch,
    tuple[int, bool, bool],
    dict[int, StaleMark | None],
    list[int],
    ScopeWatch,
    Ended | None,
]
"""The watch, a look (round, formed, stale), the marks read, then what is wanted: the
rounds to read, the watch after and the round that ended for a failure."""


@pytest.mark.parametrize(
    "case",
    [
        # Steady: nothing read, nothing ended.
        (ScopeWatch(3, False), (3, True, False), {}, [], ScopeWatch(3, False), None),
        # The round ended for a worker failure: ended, once.
        (
            ScopeWatch(3, False),
            (3, True, True),
            {3: mark(R.WORKER_FAILED, "exit 1")},
            [3],
            ScopeWatch(3, True),
            Ended(3, "WorkerFailed", "exit 1"),
        ),
        (ScopeWatch(3, True), (3, True, True), {}, [], ScopeWatch(3, True), None),
        # Growth is not a failure, before or after the newer round forms.
        (
            ScopeWatch(3, False),
            (3, True, True),
            {3: mark(R.MEMBER_JOINED)},
            [3],
            ScopeWatch(3, True),
            None,
        ),
        (ScopeWatch(3, True), (4, True, False), {}, [], ScopeWatch(4, False), None),
        # A newer round formed between two looks: the one last seen is judged.
        (
            ScopeWatch(3, False),
            (5, True, False),
            {3: mark(R.MEMBER_LOST)},
            [3],
            ScopeWatch(5, False),
            Ended(3, "MemberLost", ""),
        ),
        (
            ScopeWatch(3, False),
            (5, True, False),
            {3: None},
            [3],
            ScopeWatch(5, False),
            Ended(3, "gone", "a newer round formed without a stale mark"),
        ),
        # Ended but its mark not read yet: not judged, looked at again.
        (ScopeWatch(3, False), (3, True, True), {3: None}, [3], ScopeWatch(3, False), None),
        # Growth then a hang in the newer round, both between two looks.
        (
            ScopeWatch(3, False),
            (4, True, True),
            {3: mark(R.MEMBER_JOINED), 4: mark(R.HANG, "no progress")},
            [3, 4],
            ScopeWatch(4, True),
            Ended(4, "Hang", "no progress"),
        ),
        # Preemption (a member left) and a lost store count: the role is not whole.
        (
            ScopeWatch(0, False),
            (0, True, True),
            {0: mark(R.MEMBER_LEFT)},
            [0],
            ScopeWatch(0, True),
            Ended(0, "MemberLeft", ""),
        ),
        # No round formed yet: nothing to judge.
        (ScopeWatch(-1, True), (-1, False, False), {}, [], ScopeWatch(-1, True), None),
        (ScopeWatch(-1, True), (0, True, False), {}, [], ScopeWatch(0, False), None),
    ],
)
def test_which_ended_rounds_of_a_job_scoped_role_re_form_this_role(case: Case) -> None:
    watch, (round_no, formed, stale), marks, reads, after, ended = case
    assert to_read(watch, round_no, formed, stale) == reads
    assert judge(watch, round_no, formed, stale, marks) == (after, ended)


@pytest.mark.parametrize(
    ("look", "want"),
    [
        ((-1, False, False), ScopeWatch(-1, True)),
        ((3, True, False), ScopeWatch(3, False)),
        ((3, True, True), ScopeWatch(3, True)),  # ended before we looked: history
    ],
)
def test_a_role_first_seen_is_judged_from_then_on(
    look: tuple[int, bool, bool], want: ScopeWatch
) -> None:
    assert first_sight(*look) == want


def test_an_end_names_the_role_the_round_and_why() -> None:
    text = Ended(7, "WorkerFailed", "worker 0 exit 1").describe("ps")
    assert text == "role ps (failureScope Job) ended its round 7: WorkerFailed: worker 0 exit 1"


SIZES = parse_role_sizes("trainer=2:2,ps=1:1")


@pytest.mark.parametrize(
    ("text", "coupling", "want"),
    [
        ("", Coupling.INDEPENDENT, ()),
        ("ps", Coupling.INDEPENDENT, ("ps",)),
        (" ps , trainer,ps", Coupling.INDEPENDENT, ("ps", "trainer")),
        ("", Coupling.JOINT, ()),
    ],
)
def test_job_scoped_roles_parse(text: str, coupling: Coupling, want: tuple[str, ...]) -> None:
    assert parse_job_scoped_roles(text, coupling, SIZES) == want


@pytest.mark.parametrize(
    ("text", "coupling", "sizes", "fragment"),
    [
        ("reader", Coupling.INDEPENDENT, SIZES, "reader not among the roles of --role-sizes"),
        ("ps", Coupling.INDEPENDENT, (), "(none given)"),
        ("ps", Coupling.JOINT, SIZES, "not read with --coupling Joint"),
    ],
)
def test_job_scoped_roles_refused(
    text: str, coupling: Coupling, sizes: tuple[RoleSize, ...], fragment: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_job_scoped_roles(text, coupling, sizes)
    assert fragment in str(raised.value) and "--job-scoped-roles" in str(raised.value)
