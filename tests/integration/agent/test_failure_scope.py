"""Failure scope Job (``--job-scoped-roles``) with real agents on one c10d store.

An Independent job of two roles: ``trainer`` (2:2) and ``ps`` (1:1), every worker
``fail_once_role.py`` (no torch). The ps worker exits 1 once, a few seconds in: its
agent counts the failure and re-forms the ps role. With ``--job-scoped-roles ps``
the trainers' agents see the ps round end for a failure and re-form their own
role too (``round 0 over: RoleFailed``), restarting their workers without counting
a failure of theirs; without it (failure scope Role, the default) the trainers
never leave their first round. Both sides in one module, so the test bites.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.localproc import LineLog
from tests.integration.agent.tfagent_helpers import PYTHON, Job

SCRIPT = str(Path(__file__).with_name("fail_once_role.py"))
SIZES = "trainer=2:2,ps=1:1"

pytestmark = pytest.mark.timeout(300)


def start(job: Job, role: str, marker: Path, scoped: bool) -> LineLog:
    extra = ["--prewarm", "off", "--role", role, "--role-sizes", SIZES]
    if scoped:
        extra += ["--job-scoped-roles", "ps"]
    script = [PYTHON, SCRIPT, "--fail-role", "ps", "--marker", str(marker),
              "--seconds", "25"]  # fmt: skip
    return job.start_agent(script, "2:2" if role == "trainer" else "1:1", extra)


def run(tmp: Path, scoped: bool) -> tuple[LineLog, list[LineLog]]:
    """The ps agent and the trainer agents, once the trainers ended (exit 0)."""
    job = Job(tmp)
    with job:
        job.start_store()
        marker = tmp / "ps-failed"
        ps = start(job, "ps", marker, scoped)
        trainers = [start(job, "trainer", marker, scoped) for _ in range(2)]
        ps.wait_for(lambda s: "failing once" in s, 120)
        # The ps re-formed (its round 1) and runs its worker again.
        ps.wait_for(lambda s: "round 1: node rank" in s, 60)
        codes = [t.proc.wait(120) for t in trainers]
        assert codes == [0, 0], [t.text()[-3000:] for t in trainers]
    return ps, trainers


def test_a_job_scoped_role_s_failure_re_forms_the_other_roles(tmp_path: Path) -> None:
    ps, trainers = run(tmp_path, scoped=True)
    for log in trainers:
        text = log.text()
        assert "round 0 over: RoleFailed" in text, text[-3000:]
        assert "role ps (failureScope Job) ended its round 0: WorkerFailed" in text
        # The workers started again, in the trainers' round 1, and finished there.
        starts = log.matching(r"start role=trainer ")
        assert len(starts) == 2, text[-3000:]
        assert log.matching(r"round 1: node rank \d of 2"), text[-3000:]
    # The failure was the ps role's: counted there, not by the trainers.
    assert ps.matching(r"worker failure judged count")
    for log in trainers:
        assert not log.matching(r"worker failure judged"), log.text()[-3000:]


def test_without_the_scope_the_other_roles_train_on(tmp_path: Path) -> None:
    _, trainers = run(tmp_path, scoped=False)
    for log in trainers:
        text = log.text()
        assert "RoleFailed" not in text and "round 0 over" not in text, text[-3000:]
        assert len(log.matching(r"start role=trainer ")) == 1, text[-3000:]
