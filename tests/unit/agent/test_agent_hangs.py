"""The agent's hang pieces that need no process: stack classification, the wire form,
and the names the stdlib-only fork server repeats (issue 26)."""

from __future__ import annotations

import signal

import pytest

from torchflex_agent.workers import hangs, zygote
from torchflex_contract import env as tfenv
from torchflex_contract.progress import (
    MAX_HANG_STACK,
    MAX_TERMINATION_MESSAGE,
    AgentReport,
    AgentState,
    HangKind,
    HangReport,
    termination_text,
)

# What faulthandler writes for a worker stuck in destroy_process_group / the bootstrap.
IN_DESTROY = """Thread 0x00007f (most recent call first):
  File "/torch/distributed/distributed_c10d.py", line 2407 in destroy_process_group
  File "train.py", line 150 in main
"""
IN_FINISH = """Current thread 0x00007f (most recent call first):
  File "<string>", line 231 in _finish
  File "<string>", line 300 in _become_worker
"""
IN_SCRIPT = """Current thread 0x00007f (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "train.py", line 40 in save_final_model
"""
NATIVE_DTOR = """Thread 12 (idle): "MainThread"
    c10d::ProcessGroupGloo::~ProcessGroupGloo (libtorch_cpu.so)
"""


@pytest.mark.parametrize(
    ("stack", "teardown"),
    [(IN_DESTROY, True), (IN_FINISH, True), (NATIVE_DTOR, True), (IN_SCRIPT, False), ("", False)],
)
def test_in_teardown(stack: str, teardown: bool) -> None:
    assert hangs.in_teardown(stack) is teardown


def test_fork_server_repeats_the_contract_names() -> None:
    assert zygote.FINISHED_FILE_ENV == tfenv.FINISHED_FILE
    assert zygote.STACK_FILE_ENV == tfenv.STACK_FILE
    assert zygote.PULSE_FILE_ENV == tfenv.PULSE_FILE
    assert zygote.STACK_SIGNAL == hangs.STACK_SIGNAL
    assert zygote.KEPT_GROUPS_ATTR == tfenv.KEPT_GROUPS_ATTR
    assert hangs.STACK_SIGNAL == signal.SIGRTMIN + tfenv.STACK_SIGNAL_OFFSET


def test_hang_report_round_trips_and_bounds_the_stack() -> None:
    hang = HangReport(HangKind.TEARDOWN, 3, 31.5, 7, "x" * 10_000 + "innermost")
    report = AgentReport(AgentState.SUCCEEDED, round=7, hang=hang)
    parsed = AgentReport.from_json(report.to_json())
    assert parsed.hang is not None
    assert parsed.hang.kind is HangKind.TEARDOWN and parsed.hang.rank == 3
    assert len(parsed.hang.stack) == MAX_HANG_STACK and parsed.hang.stack.endswith("innermost")


def test_termination_message_gives_up_the_stack_first_keeping_its_innermost_part() -> None:
    hang = HangReport(HangKind.COMPLETION, 1, 300.0, 2, "outer\n" * 200 + "innermost")
    report = AgentReport(AgentState.FAILED, round=2, message="m" * 1500, hang=hang)
    text = termination_text(report, limit=2000)
    assert len(text) <= 2000
    parsed = AgentReport.from_json(text)
    assert parsed.hang is not None and parsed.hang.stack.endswith("innermost")
    assert parsed.message == "m" * 1500  # the message kept whole: the stack gave way
    assert len(termination_text(report)) <= MAX_TERMINATION_MESSAGE


def test_summary_names_rank_and_time() -> None:
    assert HangReport(HangKind.TEARDOWN, 2, 30.4).summary() == (
        "rank 2 hung in teardown after its script returned; ended after 30 s"
    )
    assert (
        "still running after the job completed" in HangReport(HangKind.COMPLETION, 0, 1).summary()
    )
