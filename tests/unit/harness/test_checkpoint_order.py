"""The e2e rule "no checkpoint ever goes backwards", on recorded sequences."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.trainlog import (
    CheckpointWatcher,
    Landed,
    Line,
    checkpoint_line_regressions,
    checkpoint_regressions,
    parse_line,
)


def _landed(*steps: tuple[float, int, int]) -> list[Landed]:
    return [Landed(seen, step, rnd, "inc") for seen, step, rnd in steps]


def test_steps_that_only_grow_or_repeat_are_sound() -> None:
    assert checkpoint_regressions(_landed((1, 10, 0), (2, 20, 0), (3, 20, 1), (4, 30, 1))) == []
    assert checkpoint_regressions([]) == []


def test_an_old_member_writing_over_the_live_group_is_reported_once_per_write() -> None:
    # step 101 from round 0 lands over round 2's step 640 (issue 11, item 2).
    got = checkpoint_regressions(_landed((1, 630, 2), (2, 640, 2), (3, 101, 0), (4, 650, 2)))
    assert got == ["checkpoint went back from step 640 (round 2) to step 101 (round 0) at 3.0"]


def test_order_is_by_when_it_was_seen_not_by_list_order() -> None:
    assert checkpoint_regressions(_landed((2, 20, 0), (1, 10, 0))) == []


def _ckpt(seen: float, step: int, pod: str = "w-0") -> Line:
    return Line(seen, pod, "checkpoint", 0, step)


def test_log_lines_behind_an_earlier_save_are_reported_within_slack_they_are_not() -> None:
    lines = [_ckpt(1.0, 100), _ckpt(5.0, 110), _ckpt(9.0, 101, "w-1")]
    assert checkpoint_line_regressions(lines) == [
        "w-1 logged checkpoint step=101 after step=110 had been saved"
    ]
    # Seen in the same poll: no order between them can be claimed.
    assert checkpoint_line_regressions([_ckpt(1.0, 110), _ckpt(1.2, 100)]) == []


def test_watcher_records_each_new_metadata_file(tmp_path: Path) -> None:
    meta = tmp_path / CheckpointWatcher.META
    watcher = CheckpointWatcher(tmp_path)
    watcher.poll()  # nothing there yet
    for step in (10, 20, 5):
        tmp = tmp_path / "m.tmp"
        tmp.write_text(json.dumps({"step": step, "round": 0, "incarnation": "a"}))
        tmp.replace(meta)
        watcher.poll()
        watcher.poll()  # unchanged: not recorded twice
    assert [x.step for x in watcher.landed()] == [10, 20, 5]
    assert len(watcher.regressions()) == 1


def test_a_refused_save_is_not_a_checkpoint_line() -> None:
    refused = "[rank 0] checkpoint step=101 refused: fenced (lease expired)"
    assert parse_line(refused, "w-0", 0, 0.0) is None
    saved = parse_line("[rank 0] checkpoint step=101", "w-0", 0, 0.0)
    assert saved is not None and saved.step == 101
