"""Pure parts of the cluster-level recovery benchmark: log events, group times, the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from benchmarks._cluster_job import bench_job
from benchmarks._cluster_logs import (
    STANDBY_WAITING,
    Resumed,
    agent_stamp,
    all_at_world,
    current_rank,
    first_new_group_step,
    group_formed_at,
    join_phases,
    parse_events,
    speedup,
    training_at,
)
from benchmarks._cluster_report import Trial, markdown, summary
from benchmarks._proc_logs import StepLine


def _step(n: int, world: int, rank: int, t: float) -> str:
    return f"[rank {rank}] step={n} loss=0.5 world={world} rank={rank} sps=10.0 t={t:.3f}"


# A survivor: trains at 3, the peer dies at t=100, its old worker finishes one
# more step just after, then a new worker resumes and trains at 2.
SURVIVOR = [
    "[torchflex-agent] round 1: node rank 0 of 3, world size 3",
    "[rank 0] resumed from step=10",
    _step(11, 3, 0, 98.0),
    _step(12, 3, 0, 99.9),
    _step(13, 3, 0, 100.05),
    "[torchflex-agent] round 2: node rank 0 of 2, world size 2",
    "[rank 0] resumed from step=10",
    _step(11, 2, 0, 101.5),
    _step(12, 2, 0, 101.6),
]


def test_parse_events_keeps_order_and_kinds() -> None:
    events = parse_events(SURVIVOR)
    assert events[0] == Resumed(10)
    assert events[1] == StepLine(11, 3, 0, 98.0)
    assert [type(e).__name__ for e in events] == [
        "Resumed", "StepLine", "StepLine", "StepLine", "Resumed", "StepLine", "StepLine",
    ]  # fmt: skip
    # torchrun's unprefixed worker lines parse the same way.
    assert parse_events(["step=5 loss=1 world=2 rank=1 sps=9.9 t=5.5"]) == [StepLine(5, 2, 1, 5.5)]


def test_first_new_group_step_skips_the_old_workers_late_step() -> None:
    events = parse_events(SURVIVOR)
    first = first_new_group_step(events, after=100.0)
    assert first == StepLine(11, 2, 0, 101.5)
    assert first_new_group_step(events, after=100.0, world=3) is None
    # Nothing restarted after the event: no new group yet.
    assert first_new_group_step(events[:4], after=100.0) is None


def test_first_new_group_step_of_a_replacement_pod_and_a_second_reform() -> None:
    replacement = parse_events(["resumed from step=10", _step(11, 3, 2, 103.0)])
    assert first_new_group_step(replacement, after=100.0) == StepLine(11, 3, 2, 103.0)
    # A survivor that re-formed at 2 first, then at 3 with the replacement.
    twice = [*SURVIVOR, "[rank 0] resumed from step=12", _step(13, 3, 0, 103.1)]
    assert first_new_group_step(parse_events(twice), 100.0, world=3) == StepLine(13, 3, 0, 103.1)


def test_group_formed_at_is_the_last_survivor_and_none_until_all() -> None:
    other = parse_events(["resumed from step=10", _step(11, 2, 1, 101.9)])
    pods = {"a": parse_events(SURVIVOR), "b": other}
    assert group_formed_at(pods, 100.0) == 101.9
    assert group_formed_at({"a": parse_events(SURVIVOR), "b": []}, 100.0) is None
    assert group_formed_at({}, 100.0) is None


def test_join_and_warm_up_helpers() -> None:
    a = parse_events([_step(5, 2, 0, 10.0), _step(6, 3, 0, 12.0), _step(7, 3, 0, 12.1)])
    b = parse_events([_step(5, 2, 1, 10.0), _step(6, 3, 1, 12.2)])
    c = parse_events(["resumed from step=5", _step(6, 3, 2, 12.4)])
    assert all_at_world({"a": a, "b": b, "c": c}, 11.0, 3) == 12.4
    assert all_at_world({"a": a, "b": b, "c": []}, 11.0, 3) is None
    assert training_at({"a": a}, 3, 11.0, 2)
    assert not training_at({"a": a, "b": b}, 3, 11.0, 2)
    assert not training_at({}, 3, 0.0, 1)
    assert current_rank(b, 3) == 1
    assert current_rank(c, 2) is None


def _agent_line(t: float, text: str) -> str:
    """An agent log line stamped ``t`` (whole ms), as ``logging``'s asctime writes it."""
    ms = round(t * 1000)
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms // 1000))
    return f"[torchflex-agent] {clock},{ms % 1000:03d} INFO {text}"


def test_agent_stamp_reads_the_log_time_to_the_millisecond() -> None:
    t = 1_790_000_000.25
    assert agent_stamp(_agent_line(t, "joining the rendezvous (round >= 2)")) == t
    assert agent_stamp("[rank 0] resumed from step=5") is None
    assert agent_stamp(_step(5, 3, 0, t)) is None


def test_join_phases_from_the_watch_and_the_new_pods_agent() -> None:
    t0 = 1_790_000_000.0
    lines = [
        _agent_line(t0 - 5.0, "joining the rendezvous (round >= 0)"),  # an earlier run's
        _agent_line(t0 + 1.8, "worker fork server ready (preloaded in 1.55s)"),
        _agent_line(t0 + 1.801, "joining the rendezvous (round >= 0)"),
        _agent_line(
            t0 + 2.0,
            "round 3: node rank 2 of 3, world size 3, master 10.0.0.2:4 "
            "(rendezvous took 199.0 ms, restarts 0)",
        ),
        "[rank 2] resumed from step=35",
        _agent_line(t0 + 2.03, "round 3: started workers (1 forked warm), pids [42]"),
    ]
    marks = {"created": t0 + 0.06, "bound": t0 + 0.07, "running": None}
    got = join_phases(marks, lines, t0)
    assert {k: v if v is None else round(v, 6) for k, v in got.items()} == {
        "promoted": None,
        "created": 0.06,
        "bound": 0.07,
        "running": None,
        "zygote_spawned": 0.25,
        "zygote_ready": 1.8,
        "joining": 1.801,
        "round_formed": 2.0,
        "workers_started": 2.03,
    }
    none = join_phases({}, ["plain output"], t0)
    assert set(none.values()) == {None}


def test_join_phases_of_a_promoted_warm_spare() -> None:
    t0 = 1_790_000_000.0
    lines = [
        _agent_line(t0 - 20.0, "worker fork server ready (preloaded in 1.55s)"),
        _agent_line(t0 - 19.9, "standby: warm spare, waiting for promotion (/etc/x)"),
        _agent_line(t0 + 0.3, "promoted after 20.2 s in standby: joining"),
        _agent_line(t0 + 0.301, "joining the rendezvous (round >= 0)"),
        _agent_line(t0 + 0.5, "round 3: node rank 2 of 3, world size 3 (rendezvous took 199.0 ms)"),
    ]
    got = join_phases({}, lines, t0)
    assert {k: v for k, v in got.items() if v is not None} == pytest.approx(
        {"promoted": 0.3, "joining": 0.301, "round_formed": 0.5}
    )
    assert got["zygote_ready"] is None, "imports done before the request are not a phase"
    assert any(STANDBY_WAITING.search(line) for line in lines)


def test_speedup() -> None:
    assert speedup(10.0, 2.0) == 5.0
    assert speedup(None, 2.0) is None
    assert speedup(10.0, None) is None
    assert speedup(10.0, 0.0) is None


def test_summary_and_markdown_report_timeouts_as_such() -> None:
    trials = [
        Trial("torchflex", recovery_s=1.0, reformed_world=2, regrow_s=3.0, join_s=2.0,
              join_from_running_s=1.5, new_pod_running_s=0.5),
        Trial("torchflex", recovery_s=3.0, reformed_world=3, regrow_s=3.0, join_s=2.4,
              join_from_running_s=1.9, new_pod_running_s=0.5),
        Trial("torchflex-spare", recovery_s=1.0, reformed_world=2, regrow_s=3.0, join_s=0.5),
        Trial("torchrun-tuned", recovery_s=8.0, reformed_world=3, fresh_job=True,
              problems=["join: no step at world size 3 on all 3 pods within 60 s"]),
        Trial("torchrun-default",
              problems=["recovery: timed out (no re-formed group within 120 s)"]),
    ]  # fmt: skip
    result = summary(trials)
    json.dumps(result)  # one JSON object, serialisable
    assert result["torchflex_s"] == 2.0
    assert result["torchflex_join_s"] == 2.2
    assert result["torchrun_tuned_s"] == 8.0
    assert result["torchrun_default_s"] is None
    assert result["speedup_vs_tuned"] == 4.0
    assert result["speedup_vs_default"] is None
    assert result["join_speedup_vs_tuned"] is None
    assert len(result["torchflex_runs"]) == 2
    assert result["torchflex_spare_join_s"] == 0.5
    assert result["spare_join_speedup"] == 4.4
    text = markdown(trials, result, "sigkill")
    assert "| torchflex | 2.00 s (1.00-3.00, n=2) | 2, 3 |" in text
    assert "n/a; 1 of 1 not reached" in text
    assert "torchrun-default: recovery: timed out" in text
    assert "1 run(s) killed on a fresh" in text
    assert "4.0x vs tuned" in text
    spare_row = (
        "| torchflex-spare | 1.00 s (1.00-1.00, n=1) | 2 | 3.00 s (3.00-3.00, n=1) | "
        "0.50 s (0.50-0.50, n=1) | n/a (no new pod) |"
    )
    assert spare_row in text
    assert "a warm spare joins 4.4x faster" in text


def test_bench_job_commands() -> None:
    tuned = bench_job("torchrun-tuned", "j", Path("/tmp/ck"), replicas=2)
    cmd = tuned.command()
    assert cmd[0] == "torchrun"
    conf = [a for a in cmd if a.startswith("--rdzv-conf=")]
    assert conf and "keep_alive_interval=1" in conf[0]
    assert cmd.index(conf[0]) < cmd.index("--max-restarts=100") < cmd.index("--steps")
    env = dict(tuned.extra_env)
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["TRAIN_PRINT_TIME"] == "1"
    default = bench_job("torchrun-default", "j", Path("/tmp/ck"), replicas=2).command()
    assert not [a for a in default if a.startswith("--rdzv-conf")]
    ours = bench_job("torchflex", "j", Path("/tmp/ck"), replicas=3)
    assert ours.command()[0] == "python"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in dict(ours.extra_env)
    spec = ours.manifest()["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], spec["replicas"]) == (2, 3, 3)
    assert "warmSpares" not in spec
    spare = bench_job("torchflex-spare", "j", Path("/tmp/ck"), replicas=2).manifest()["spec"]
    assert spare["warmSpares"] == 1
