"""The e2e progress parser and the training invariants it checks (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.trainlog import Line, LogFollower, parse_text, pod_of, progress_violations, round_spans

AGENT_ROUND = (
    "[torchflex-agent] 2026-11-23 10:00:00,000 INFO round {r}: node rank 0 of {w}, "
    "world size {w}, master 10.213.0.5:29500 (rendezvous took 3.1 ms, restarts 0)"
)


def step(seen: float, rnd: int, n: int, world: int, rank: int) -> Line:
    return Line(seen, "p", "step", rnd, n, world, rank)


def ckpt(seen: float, rnd: int, n: int) -> Line:
    return Line(seen, "p", "checkpoint", rnd, n)


def test_parse_text_tags_worker_lines_with_the_agent_round() -> None:
    text = "\n".join(
        [
            "[rank 1] resumed from step=20",
            AGENT_ROUND.format(r=4, w=2),
            "[rank 1] step=21 loss=0.5000 world=2 rank=1 sps=9.9",
            "[rank 1] checkpoint step=30",
            "unrelated noise",
            AGENT_ROUND.format(r=5, w=3),
            "[rank 2] step=31 loss=nan world=3 rank=2 sps=9.0",
        ]
    )
    lines = parse_text(text, "job-worker-1")
    kinds = [(ln.kind, ln.round) for ln in lines]
    assert kinds == [
        ("resumed", -1),
        ("round", 4),
        ("step", 4),
        ("checkpoint", 4),
        ("round", 5),
        ("step", 5),
    ]
    assert (lines[2].step, lines[2].world, lines[2].rank, lines[2].loss) == (21, 2, 1, 0.5)
    assert lines[3].step == 30
    assert lines[-1].loss != lines[-1].loss  # nan parsed, not dropped


def test_pod_name_from_the_kubelet_log_path() -> None:
    path = Path("/x/pods/t-1234_job-worker-0_0b9f-uid/trainer.log")
    assert pod_of(path) == "job-worker-0"
    # A real kubelet's layout (CRI): one directory per container, one file per restart.
    assert pod_of(Path("/x/pod_logs/t-1_job-worker-0_0b9f-uid/trainer/0.log")) == "job-worker-0"


def test_round_spans_group_steps_by_round() -> None:
    spans = round_spans([step(1, 0, 1, 2, 0), step(2, 0, 2, 2, 1), step(5, 1, 3, 3, 2)])
    assert [(s.round, s.first_step, s.last_step, sorted(s.ranks)) for s in spans] == [
        (0, 1, 2, [0, 1]),
        (1, 3, 3, [2]),
    ]


@pytest.mark.parametrize(
    ("lines", "expect"),
    [
        pytest.param(
            [
                step(1, 0, 1, 2, 0),
                step(1, 0, 1, 2, 1),
                ckpt(1.1, 0, 1),
                step(3, 1, 2, 3, 0),
                step(3, 1, 2, 3, 1),
                step(3, 1, 2, 3, 2),
            ],
            [],
            id="clean-regrow",
        ),
        pytest.param(
            [step(1, 0, 1, 2, 0), step(1, 0, 1, 3, 1)],
            ["round 0 trained with world sizes [2, 3]"],
            id="two-worlds-in-one-round",
        ),
        pytest.param(
            [step(1, 0, 1, 3, 0), step(1, 0, 1, 3, 1)],
            ["round 0: ranks [0, 1] for world size 3"],
            id="missing-rank",
        ),
        pytest.param(
            [step(1, 0, 1, 1, 0), step(5, 0, 9, 1, 0), step(2, 1, 1, 1, 0)],
            ["round 1 trained (from 2.0) while round 0 still did (until 5.0)"],
            id="overlapping-groups",
        ),
        pytest.param(
            [step(1, 0, 10, 1, 0), ckpt(1.2, 0, 10), step(3, 1, 6, 1, 0)],
            ["round 1 restarted at step 5, behind checkpoint step 10"],
            id="resumed-behind-checkpoint",
        ),
    ],
)
def test_progress_violations(lines: list[Line], expect: list[str]) -> None:
    assert progress_violations(lines) == expect


def test_follower_reads_growing_logs_and_partial_lines(tmp_path: Path) -> None:
    pod_dir = tmp_path / "ns1_job-worker-0_uid"
    pod_dir.mkdir()
    (tmp_path / "ns2_other-worker-0_uid").mkdir()
    (tmp_path / "ns2_other-worker-0_uid" / "trainer.log").write_text(
        "[rank 0] step=1 loss=1.0 world=1 rank=0 sps=1\n"
    )
    log = pod_dir / "trainer.log"
    log.write_text(AGENT_ROUND.format(r=0, w=1) + "\n[rank 0] step=1 loss=1.0 wor")
    follower = LogFollower(tmp_path, "ns1")
    follower.poll()
    assert [ln.kind for ln in follower.lines()] == ["round"]
    with log.open("a") as fh:
        fh.write("ld=1 rank=0 sps=1\n")
    follower.poll()
    steps = follower.lines("step")
    assert [(s.pod, s.round, s.step) for s in steps] == [("job-worker-0", 0, 1)]
    assert follower.last_step() == 1


def test_follower_skips_pod_dirs_of_an_earlier_run(tmp_path: Path) -> None:
    """A real kubelet removes a deleted pod's log directory only at its next
    garbage collection: the demo run right after another must not read it."""
    old = tmp_path / "ns1_job-worker-0_old-uid"
    old.mkdir()
    (old / "trainer.log").write_text("[rank 0] step=300 loss=1.0 world=3 rank=0 sps=1\n")
    with LogFollower(tmp_path, "ns1", poll_s=3600, skip_existing=True) as follower:
        new = tmp_path / "ns1_job-worker-0_new-uid"
        new.mkdir()
        (new / "trainer.log").write_text("[rank 0] step=1 loss=1.0 world=3 rank=0 sps=1\n")
        follower.poll()
        assert follower.last_step() == 1  # not 300: the old pod's log is not read
