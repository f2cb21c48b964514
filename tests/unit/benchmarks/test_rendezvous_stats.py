"""The rendezvous benchmark's pure parts: hosting split, the latency of one trial, its notes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from benchmarks._rdzv_roles import load_line, paired, ratio
from benchmarks._rdzv_stats import (
    MemberResult,
    TrialOutcome,
    evaluate,
    evaluate_roles,
    role_key_id,
    role_of,
    split_members,
)
from benchmarks.report import load_note


@pytest.mark.parametrize(
    ("n", "procs", "want"),
    [
        (2, 8, [1, 1]),
        (8, 8, [1] * 8),
        (10, 4, [3, 3, 2, 2]),
        (128, 8, [16] * 8),
        (1, 1, [1]),
    ],
)
def test_split_members_is_balanced_and_complete(n: int, procs: int, want: list[int]) -> None:
    assert split_members(n, procs) == want
    assert sum(split_members(n, procs)) == n


def test_split_members_rejects_empty() -> None:
    with pytest.raises(ValueError):
        split_members(0, 4)
    with pytest.raises(ValueError):
        split_members(4, 0)


def _m(start: float, done: float, rank: int | None, world: int | None = 3) -> MemberResult:
    return MemberResult(start, done, rank, world)


def test_latency_runs_from_the_last_join_to_the_last_rank() -> None:
    members = [_m(10.0, 10.5, 0), _m(10.2, 10.4, 1), _m(10.1, 10.9, 2)]
    out = evaluate(3, members)
    assert out.problem is None
    assert out.latency == pytest.approx(10.9 - 10.2)
    assert out.join_spread == pytest.approx(0.2)


def test_a_failed_member_voids_the_trial() -> None:
    members = [_m(1, 2, 0), MemberResult(1, 3, None, None, "RendezvousTimeoutError()"), _m(1, 2, 1)]
    out = evaluate(3, members)
    assert out.latency is None
    assert out.problem is not None and "RendezvousTimeoutError" in out.problem


@pytest.mark.parametrize(
    ("members", "fragment"),
    [
        ([_m(1, 2, 0), _m(1, 2, 1)], "2 of 3"),
        ([_m(1, 2, 0), _m(1, 2, 0), _m(1, 2, 2)], "permutation"),
        ([_m(1, 2, 0), _m(1, 2, 1), _m(1, 2, 2, world=2)], "world size"),
        ([], "no member"),
    ],
)
def test_an_inconsistent_group_is_not_timed(members: list[MemberResult], fragment: str) -> None:
    out = evaluate(3, members)
    assert out.latency is None
    assert out.problem is not None and fragment in out.problem


def test_member_result_round_trips_through_json() -> None:
    m = MemberResult(1.5, 2.5, 3, 4, None)
    assert MemberResult.from_json(m.to_json()) == m
    failed = MemberResult(1.0, 1.0, None, None, "boom")
    assert MemberResult.from_json(failed.to_json()) == failed


def test_the_large_n_section_says_the_deadline_and_the_stores_cpu() -> None:
    from benchmarks import rendezvous

    results = {("torchflex-c10d", 1024): [TrialOutcome(1024, 5.5, 0.1, None)]}
    text = rendezvous.body(
        results, (64, 1024), 1, 8, "not run.", store_cpu={1024: [0.4, 0.5]}, resolver="R."
    )
    assert f"{rendezvous.LARGE_N_OP_TIMEOUT_S:g} s" in text
    assert "N = 1024: 0.45 s (0.40-0.50, n=2)" in text
    assert "| 1024 | 5500 ms" in text
    # Up to TORCH_MAX_N nothing changes: the agent's own deadline, no note.
    assert "per-call deadline" not in rendezvous.body({}, (64,), 1, 8, "not run.")


def test_the_loopback_resolver_wraps_a_command_only_where_it_can(tmp_path: Path) -> None:
    from benchmarks import rendezvous

    cmd = ["torchflex-agent", "store"]
    wrapped = rendezvous.loopback_resolver(cmd, tmp_path)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        assert wrapped == cmd
    else:
        assert wrapped[-2:] == cmd and "--mount" in wrapped
        assert "nameserver 127.0.0.1" in (tmp_path / "resolv.conf").read_text()


def _r(start: float, done: float, rank: int, role: int) -> MemberResult:
    return MemberResult(start, done, rank, 2, role=role)


def test_roles_each_form_their_own_group_and_time_over_all() -> None:
    members = [_r(1.0, 1.5, 0, 0), _r(1.1, 1.4, 0, 1), _r(1.2, 1.3, 1, 0), _r(1.0, 1.9, 1, 1)]
    out = evaluate_roles(4, 2, members)
    assert out.problem is None
    assert out.latency == pytest.approx(1.9 - 1.2)
    assert [role_of(i, 2) for i in range(4)] == [0, 1, 0, 1]
    assert role_key_id("job", 1, 2) == "job.role1" and role_key_id("job", 0, 1) == "job"


def test_a_role_that_did_not_form_its_group_voids_the_trial() -> None:
    members = [_r(1.0, 1.5, 0, 0), _r(1.1, 1.4, 0, 1), _r(1.2, 1.3, 0, 0), _r(1.0, 1.9, 1, 1)]
    out = evaluate_roles(4, 2, members)
    assert out.latency is None and out.problem is not None and out.problem.startswith("role 0")
    assert MemberResult.from_json(members[1].to_json()) == members[1]


def test_the_paired_ratio_compares_trials_run_back_to_back() -> None:
    def t(latency: float | None) -> TrialOutcome:
        return TrialOutcome(64, latency, 0.0, None if latency else "failed")

    # Load drifts 10x over the run: the medians' ratio says 0.55, the pairs say 1.0.
    one = [t(0.1), t(1.0), t(1.0)]
    split = [t(0.1), t(1.0), t(None)]
    assert paired(one, split) == pytest.approx(1.0)
    assert ratio(one, split) == pytest.approx(0.55 / 1.0)
    assert paired([t(None)], [t(0.1)]) is None


@pytest.mark.parametrize(
    ("before", "says"),
    [
        (0.0, "The machine was otherwise idle when the run started."),
        (0.5 * (os.cpu_count() or 1) + 0.1, "Other work shared the machine"),
    ],
)
def test_the_load_line_says_shared_only_when_the_machine_was_busy_before(
    before: float, says: str
) -> None:
    # The run's own agents push the load after it up: only the load before decides.
    other = "Other work shared" if "idle" in says else "otherwise idle"
    # load_line: the roles section; load_note: every other section (rendezvous, state
    # commit, autoscaler).
    for line in (load_line((before, 1.0, 1.0), (40.0, 20.0, 10.0)), load_note(before, 40.0)):
        assert says in line
        assert other not in line
