"""A forked worker never runs a process group's destructor (issue 26), for real.

torch's gloo teardown hang sits in ``~ProcessGroupGloo`` (it joins the backend's
threads, GIL held). The fork server's bootstrap keeps every group a worker
creates referenced until ``os._exit``, so that destructor never runs in a
worker; a worker spawned without the fork server (``--prewarm off``) frees it
as plain Python does, which shows the check can tell the two apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agent.tfagent_helpers import EXAMPLE, PYTHON, Job

SCRIPT = str(Path(__file__).with_name("group_lifetime.py"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("prewarm", "said"), [("auto", "group kept until exit"), ("off", "group freed")]
)
def test_forked_worker_keeps_its_process_group_until_exit(
    tmp_path: Path, prewarm: str, said: str
) -> None:
    with Job(tmp_path) as job:
        job.start_store()
        agent = job.start_agent([PYTHON, SCRIPT], "1", ["--prewarm", prewarm])
        assert agent.proc.wait(90) == 0, agent.text()
        assert said in agent.text(), agent.text()


@pytest.mark.timeout(180)
def test_the_example_ends_on_every_rank_with_its_groups_kept(tmp_path: Path) -> None:
    """The real example to its last step: every agent exits 0, no hang report."""
    with Job(tmp_path) as job:
        job.start_store()
        args = [PYTHON, EXAMPLE, "--steps", "15", "--step-time", "0.05",
                "--ckpt-dir", str(job.ckpt), "--ckpt-every", "5"]  # fmt: skip
        for _ in range(2):
            job.start_agent(args, "2:2")
        codes = [a.proc.wait(150) for a in job.agents]
        assert codes == [0, 0], [a.text() for a in job.agents]
        assert all(job.termination_report(i).hang is None for i in range(2))
        assert job.ckpt_meta().step == 15
