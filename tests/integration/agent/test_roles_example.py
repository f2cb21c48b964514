"""The multi-role examples (``examples/roles/``) run by real agents on one c10d store.

``train_with_readers.py``, Independent: two trainer agents (2:2) train from two
reader agents (1:2), one worker each, all on 127.0.0.1. Mid-training one reader
agent is SIGKILLed and a replacement reader agent started: the readers re-form
(twice: without the lost one, then with the new one) while the trainers run
on in their first round, each rank's steps 1..N exactly once, from the same
process; the replacement serves batches, and both trainer agents end 0 with
the final checkpoint at step N.

``ps_rpc.py``, Joint: one ``ps`` agent and two ``trainer`` agents run the RFC's
parameter-server example over ``torch.distributed.rpc`` to the end: every agent
exits 0, each trainer ran every step once with the same averaged loss, and the
server applied every push; then again with one trainer agent SIGKILLed and
replaced mid-run: every role re-forms (Joint, and RPC's world is static) and
the job still ends with every agent exiting 0; and with the server's own
checkpoint, the ps agent SIGKILLed and replaced: every role re-forms, the new
server resumes from its checkpoint and the trainers go on from the step after it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from e2e.localproc import LineLog
from e2e.polling import poll_until
from tests.integration.agent.tfagent_helpers import PYTHON, REPO, Job

READERS_EXAMPLE = str(REPO / "examples" / "roles" / "train_with_readers.py")
PS_EXAMPLE = str(REPO / "examples" / "roles" / "ps_rpc.py")
SIZES = "trainer=2:2,reader=1:2"
STEPS = 400
KILL_AT = 30


def start(job: Job, role: str) -> LineLog:
    """One agent of ``role`` running the example, one worker. Readers get a 5 s last
    call: both first readers form one round, and a lone survivor is not kept waiting."""
    script = [PYTHON, READERS_EXAMPLE, "--steps", str(STEPS), "--step-time", "0.1",
              "--ckpt-dir", str(job.ckpt), "--patience", "120"]  # fmt: skip
    extra = ["--prewarm", "off", "--role", role, "--role-sizes", SIZES,
             "--rdzv-join-timeout", "180"]  # fmt: skip
    if role == "reader":
        extra += ["--rdzv-last-call", "5"]
    return job.start_agent(script, "2:2" if role == "trainer" else "1:2", extra)


def steps(log: LineLog) -> dict[int, list[int]]:
    """Each trainer rank's step numbers, in the order printed."""
    out: dict[int, list[int]] = {}
    for _, m in log.matching(r"^\[rank (\d+)\] step=(\d+) "):
        out.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return out


def served_after(log: LineLog, at: float) -> int:
    return len([t for t, _ in log.matching(r"served step=\d+ to rank=\d+") if t >= at])


@pytest.mark.timeout(600)
def test_trainers_keep_their_steps_while_a_reader_is_killed_and_replaced(tmp_path: Path) -> None:
    with Job(tmp_path) as job:
        job.start_store()
        trainers = [start(job, "trainer") for _ in range(2)]
        readers = [start(job, "reader") for _ in range(2)]
        for log in trainers:
            log.wait_for(lambda s: f"step={KILL_AT} " in s, 300)
        assert all(served_after(r, 0.0) > 0 for r in readers)  # round-robin over both

        # One reader's agent (and so its worker) dies; a new reader agent comes.
        readers[0].proc.send_signal(signal.SIGKILL)
        readers[0].proc.wait(10)
        killed_at = time.monotonic()
        replacement = start(job, "reader")
        assert poll_until(lambda: served_after(replacement, killed_at) > 0, 180, 0.2), (
            "the replacement reader never served:\n" + replacement.text()[-3000:]
        )
        assert served_after(readers[1], killed_at) > 0

        codes = [log.proc.wait(400) for log in trainers]
        assert codes == [0, 0], [log.text()[-3000:] for log in trainers]
        for log in trainers:
            # One start per rank: no restart, no resume; every step exactly once.
            starts = [m.group(0) for _, m in log.matching(r"trainer start .*")]
            assert len(starts) == 1 and "step=0 round=0 restarts=0" in starts[0], starts
            assert list(steps(log).values()) == [list(range(1, STEPS + 1))]
        assert job.ckpt_meta().step == STEPS
        # The survivor re-formed (its worker restarted) at least once, serving again.
        assert len(readers[1].matching(r"reader serving on port")) >= 2
        assert replacement.proc.poll() is None and readers[1].proc.poll() is None


PS_SIZES = "trainer=2:2,ps=1:1"
PS_STEPS = 20


def need_rpc() -> None:
    from torch.distributed import rpc

    if not rpc.is_available():
        pytest.skip("torch.distributed.rpc.is_available() is False in this torch build")


def start_ps_role(job: Job, role: str, steps: int, *script: str) -> LineLog:
    extra = ["--prewarm", "off", "--role", role, "--role-sizes", PS_SIZES,
             "--coupling", "Joint", "--rdzv-join-timeout", "180"]  # fmt: skip
    nodes = "1:1" if role == "ps" else "2:2"
    return job.start_agent([PYTHON, PS_EXAMPLE, "--steps", str(steps), *script], nodes, extra)


# TensorPipe (RPC's transport) on loopback only, like everything here.
RPC_ENV = {"TP_SOCKET_IFNAME": "lo"}


@pytest.mark.timeout(420)
def test_ps_rpc_example_runs_to_the_end_with_joint_coupling(tmp_path: Path) -> None:
    need_rpc()
    with Job(tmp_path, agent_env=RPC_ENV) as job:
        job.start_store()
        logs: dict[str, LineLog] = {}
        for role in ("ps", "trainer", "trainer"):
            logs[f"{role}{len(logs)}"] = start_ps_role(job, role, PS_STEPS)
        codes = {name: log.proc.wait(300) for name, log in logs.items()}
        assert set(codes.values()) == {0}, {n: log.text()[-3000:] for n, log in logs.items()}
        avg: dict[int, list[str]] = {}
        for name in ("trainer1", "trainer2"):
            got = logs[name].matching(r"^\[rank (\d+)\] step=(\d+) .* world=3 .*avg_loss=(\S+)")
            (rank,) = {int(m.group(1)) for _, m in got}
            assert [int(m.group(2)) for _, m in got] == list(range(1, PS_STEPS + 1))
            avg[rank] = [m.group(3) for _, m in got]
        assert avg[0] == avg[1]  # averaged over role_group("trainer")
        assert logs["ps0"].matching(rf"ps applied {2 * PS_STEPS} updates")


@pytest.mark.timeout(600)
def test_ps_rpc_example_ends_after_a_trainer_is_killed_and_replaced(tmp_path: Path) -> None:
    """Joint: a trainer agent's SIGKILL re-forms every role (RPC's world is static);
    with a replacement trainer the job runs to the end, every agent exiting 0."""
    need_rpc()
    steps = 60
    with Job(tmp_path, agent_env=RPC_ENV) as job:
        job.start_store()
        ps, kept, killed = (start_ps_role(job, r, steps) for r in ("ps", "trainer", "trainer"))
        killed.wait_for(lambda s: "step=5 " in s, 300)
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
        new = start_ps_role(job, "trainer", steps)
        codes = [log.proc.wait(400) for log in (ps, kept, new)]
        assert codes == [0, 0, 0], [log.text()[-3000:] for log in (ps, kept, new)]
        for log in (ps, kept, new):  # one new round for every role
            assert log.matching(r"round [1-9]\d*: node rank"), log.text()[-3000:]
        assert ps.matching(rf"ps applied {2 * steps} updates")
        last = [m.group(0) for _, m in kept.matching(rf"step={steps} ")]
        assert len(last) == 1


@pytest.mark.timeout(600)
def test_ps_rpc_example_resumes_from_the_server_s_checkpoint_after_the_ps_is_killed(
    tmp_path: Path,
) -> None:
    """Joint: the parameter server's agent SIGKILLed after a checkpoint; a new ps agent
    joins, every role re-forms, the server loads its checkpoint and the trainers go on
    from the step after it, so the job ends with every push applied exactly once
    across the resume (the count is in the checkpoint)."""
    need_rpc()
    steps, every = 60, 5
    ckpt = ["--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", str(every),
            "--step-time", "0.1"]  # fmt: skip
    with Job(tmp_path, agent_env=RPC_ENV) as job:
        job.start_store()
        ps, *trainers = (start_ps_role(job, r, steps, *ckpt) for r in ("ps", "trainer", "trainer"))
        ps.wait_for(lambda s: "checkpoint step=10" in s, 300)
        ps.proc.send_signal(signal.SIGKILL)
        ps.proc.wait(10)
        saved = max(int(m.group(1)) for _, m in ps.matching(r"checkpoint step=(\d+)"))
        new = start_ps_role(job, "ps", steps, *ckpt)
        codes = [log.proc.wait(400) for log in (new, *trainers)]
        assert codes == [0, 0, 0], [log.text()[-3000:] for log in (new, *trainers)]
        (resumed,) = [int(m.group(1)) for _, m in new.matching(r"resumed from step=(\d+)")]
        # The checkpoint it loaded is the last one saved, or one saved after it
        # (between the last line read and the kill).
        assert resumed >= saved and resumed % every == 0, (resumed, saved)
        for log in trainers:
            got = [
                (t, int(m.group(1)))
                for t, m in log.matching(r"^\[rank \d+\] step=(\d+) .* world=3 ")
            ]
            restart = max(t for t, _ in log.matching(r"round [1-9]\d*: node rank"))
            after = [s for t, s in got if t >= restart]
            assert after == list(range(resumed + 1, steps + 1)), after[:5]
        assert new.matching(rf"ps applied {2 * steps} updates"), new.text()[-3000:]
