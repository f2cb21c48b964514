"""Progress: the worker's rate-limited file, the agent's reading, the checkpoint's report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchflex_agent.checkpoint import Checkpointer
from torchflex_agent.progress import (
    Reporter,
    parse_progress,
    read_progress,
    reporter_for,
    steps_per_second,
)
from torchflex_contract import env as tfenv
from torchflex_contract.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_steps_are_written_at_a_bounded_rate(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    clock = Clock()
    reporter = Reporter(path, 4, min_interval=1.0, clock=clock, wall=lambda: 1.7e9)
    reporter.step(1)
    assert read_progress(path) == Progress(step=1, updated=1.7e9, round=4)
    for step in range(2, 20):  # 18 steps within 0.9 s: no write
        clock.now += 0.05
        reporter.step(step)
    assert json.loads(path.read_text())["step"] == 1
    clock.now = 102.0
    reporter.step(41)  # 40 steps in 2 s since the first write
    progress = read_progress(path)
    assert progress is not None
    assert (progress.step, progress.steps_per_second) == (41, 20.0)
    clock.now += 0.1
    reporter.step(43)
    reporter.flush()  # at exit: what the limit held back
    assert json.loads(path.read_text())["step"] == 43


def test_checkpoints_write_at_once_and_count_as_steps(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    clock = Clock()
    reporter = Reporter(path, clock=clock)
    reporter.step(10)
    clock.now += 0.1
    reporter.checkpoint(10)
    progress = read_progress(path)
    assert progress is not None and (progress.step, progress.checkpoint_step) == (10, 10)
    clock.now += 0.1
    reporter.checkpoint(20)  # a checkpoint-only script still shows its step
    progress = read_progress(path)
    assert progress is not None and (progress.step, progress.checkpoint_step) == (20, 20)


def test_a_step_going_back_resets_the_rate(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    clock = Clock()
    reporter = Reporter(path, clock=clock)
    reporter.step(100)
    clock.now += 2
    reporter.step(5)  # reloaded an older checkpoint
    progress = read_progress(path)
    assert progress is not None and (progress.step, progress.steps_per_second) == (5, 0.0)


@pytest.mark.parametrize(
    ("samples", "rate"),
    [([], 0.0), ([(1.0, 5)], 0.0), ([(1.0, 5), (3.0, 9)], 2.0), ([(1.0, 9), (3.0, 5)], 0.0)],
)
def test_steps_per_second(samples: list[tuple[float, int]], rate: float) -> None:
    assert steps_per_second(samples) == rate


@pytest.mark.parametrize(
    "text", ["", "nope", "[]", '{"step": "x"}', '{"samples": [[1]]}', '{"updated": "NaN"}']
)
def test_malformed_progress_is_none(text: str) -> None:
    assert parse_progress(text) is None


def test_only_local_rank_0_under_an_agent_reports(tmp_path: Path) -> None:
    file = str(tmp_path / "p.json")
    assert reporter_for({}) is None  # plain python / torchrun: a no-op
    assert reporter_for({tfenv.PROGRESS_FILE: file, "LOCAL_RANK": "1"}) is None
    reporter = reporter_for({tfenv.PROGRESS_FILE: file, "LOCAL_RANK": "0", tfenv.ROUND: "2"})
    assert reporter is not None
    reporter.step(7)
    assert read_progress(Path(file)) == Progress(
        step=7, updated=json.loads(Path(file).read_text())["updated"], round=2
    )


def test_a_checkpoint_save_reports_its_step(tmp_path: Path) -> None:
    """The zero-effort default: a script using the helper shows its last checkpoint."""
    saved: dict[str, Any] = {}

    def save(obj: Any, path: Path) -> None:
        saved.update(obj)
        path.write_bytes(b"x")

    environ = {tfenv.PROGRESS_FILE: str(tmp_path / "p.json"), "LOCAL_RANK": "0"}
    ckpt = Checkpointer(tmp_path / "ckpt", save_fn=save, environ=environ)
    assert read_progress(tmp_path / "p.json") is None
    assert ckpt.save(50, {"model": 1})
    progress = read_progress(tmp_path / "p.json")
    assert progress is not None and (progress.step, progress.checkpoint_step) == (50, 50)
    assert saved["step"] == 50
