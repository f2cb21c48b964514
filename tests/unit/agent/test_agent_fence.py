"""Fencing: lease arithmetic, the worker's verdict, checkpoint ordering, lost lists."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from torchflex_agent import fence
from torchflex_agent.checkpoint import Checkpointer, CheckpointMeta, may_replace
from torchflex_agent.fence import Lease, LeaseState, Verdict, judge, lease_duration, reform_grace
from torchflex_agent.rendezvous.logic import (
    NodeDescriptor,
    RendezvousSettings,
    decode_lost,
    encode_lost,
)
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.stores.kvstore import MemoryStore
from torchflex_contract import env as tfenv


@pytest.mark.parametrize(
    ("interval", "timeout", "lease"),
    [(0.2, 1.5, 1.1), (0.1, 1.0, 0.75), (1.0, 10.0, 7.5), (0.2, 0.5, 0.25), (0.01, 0.05, 0.03)],
)
def test_lease_runs_out_before_peers_verdict(interval: float, timeout: float, lease: float) -> None:
    got = lease_duration(interval, timeout)
    assert got == pytest.approx(lease)
    # Self-fence strictly before the peers' verdict, with a margin of at least
    # one heartbeat interval, and long enough to survive a late renewal.
    assert got < timeout
    assert got >= timeout / 2


@pytest.mark.parametrize(
    ("state", "my_round", "now", "verdict"),
    [
        (LeaseState(3, "a", 100), 3, 99, Verdict.CURRENT),
        (LeaseState(3, "a", 100), 3, 100, Verdict.EXPIRED),
        (LeaseState(3, "a", 100), 2, 50, Verdict.OTHER_ROUND),
        (LeaseState(3, "a", 0), 3, 1, Verdict.REVOKED),
        (None, 3, 1, Verdict.UNREADABLE),
    ],
)
def test_judge(state: LeaseState | None, my_round: int, now: int, verdict: Verdict) -> None:
    assert judge(state, my_round, now) is verdict
    assert verdict.may_write is (verdict is Verdict.CURRENT)


def test_lease_state_round_trip() -> None:
    for state in (LeaseState(0, "", 5), LeaseState(12, "ab12", 10**18)):
        assert LeaseState.decode(state.encode()) == state
    with pytest.raises(ValueError, match="malformed"):
        LeaseState.decode("1 2")


def test_lease_file_grant_renew_revoke(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", 1.0)
    env = lease.worker_env(4)
    assert fence.check(env).verdict is Verdict.UNREADABLE  # no file yet
    now = time.monotonic()
    lease.grant(4, "inc", now)
    checked = fence.check(env)
    assert (checked.verdict, checked.round, checked.incarnation) == (Verdict.CURRENT, 4, "inc")
    assert not lease.expired(now + 0.9)
    assert lease.expired(now + 1.0)
    lease.renew(now + 5.0)
    assert not lease.expired(now + 5.9)
    lease.renew(now - 10.0)  # a late renewal never shortens it
    assert not lease.expired(now + 5.9)
    assert fence.check(lease.worker_env(3)).verdict is Verdict.OTHER_ROUND
    lease.revoke()
    lease.renew(now + 100.0)  # revoked stays revoked
    assert lease.expired(now)
    assert fence.check(env).verdict is Verdict.REVOKED
    lease.grant(5, "inc", now - 2.0)  # a lease granted in the past has run out
    assert fence.check(lease.worker_env(5)).verdict is Verdict.EXPIRED


def test_no_fence_configured_allows_writes() -> None:
    assert fence.check({}).verdict is Verdict.UNFENCED
    assert fence.check({}).verdict.may_write
    bad = {tfenv.FENCE_FILE: "/nonexistent/lease", tfenv.ROUND: "x"}
    assert fence.check(bad).verdict is Verdict.UNREADABLE


@pytest.mark.parametrize(
    ("store_lost", "silent", "grace"), [(False, False, 3.0), (True, False, 1.0), (False, True, 0.0)]
)
def test_reform_grace(store_lost: bool, silent: bool, grace: float) -> None:
    assert reform_grace(3.0, 1.0, store_lost=store_lost, silent=silent) == grace


M = CheckpointMeta


@pytest.mark.parametrize(
    ("current", "new", "ok"),
    [
        (None, M(1, 0, "a"), True),
        (M(640, 5, "a"), M(101, 4, "a"), False),  # the bug of issue 11: old round, lower step
        (M(100, 5, "a"), M(105, 4, "a"), False),  # an older round never wins, even ahead
        (M(105, 4, "a"), M(101, 5, "a"), False),  # never a lower step, whoever writes
        (M(105, 4, "a"), M(105, 5, "a"), True),  # the newer round at the same step
        (M(50, 5, "a"), M(49, 5, "a"), False),  # same round: the step decides
        (M(50, 5, "a"), M(50, 5, "a"), True),  # equal: a final save may repeat a periodic one
        (M(50, 9, "old"), M(51, 0, "new"), True),  # new store, rounds restart: steps decide
        (M(50, 9, "old"), M(49, 0, "new"), False),
        (M(50), M(49), False),  # without torchflex: steps only
        (M(50), M(50), True),
    ],
)
def test_may_replace(current: CheckpointMeta | None, new: CheckpointMeta, ok: bool) -> None:
    assert may_replace(current, new) is ok


def _json_save(obj: Any, path: Path) -> None:
    path.write_text(json.dumps(obj))


def _json_load(path: Path) -> Any:
    return json.loads(path.read_text())


def test_checkpointer_orders_and_fences(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    lease = Lease(tmp_path / "lease", 10.0)
    lease.grant(2, "inc", time.monotonic())
    env = lease.worker_env(2)
    ckpt = Checkpointer(ckpt_dir, _json_save, _json_load, env)
    assert ckpt.load() is None
    assert ckpt.save(10, {"w": 1})
    assert ckpt.load() == {"w": 1, "step": 10}
    assert ckpt.current_meta() == M(10, 2, "inc")
    assert not ckpt.save(9, {"w": 0})  # behind the one on disk
    assert ckpt.load() == {"w": 1, "step": 10}
    old_round = Checkpointer(ckpt_dir, _json_save, _json_load, lease.worker_env(1))
    assert not old_round.save(20, {"w": 2})  # a worker of another round is fenced
    lease.revoke()
    assert not ckpt.save(30, {"w": 3})  # declared lost / fenced by its agent
    assert ckpt.load() == {"w": 1, "step": 10}
    assert sorted(p.name for p in ckpt_dir.iterdir()) == [".lock", "latest.pt", "latest.pt.meta"]
    lease.grant(3, "inc", time.monotonic())
    newer = Checkpointer(ckpt_dir, _json_save, _json_load, lease.worker_env(3))
    assert not newer.save(5, {"w": 4})  # a newer round, but behind the step on disk
    assert newer.save(11, {"w": 5})
    assert newer.current_meta() == M(11, 3, "inc")
    lease.grant(2, "inc", time.monotonic())  # a member of round 2 that is current again
    assert not ckpt.save(12, {"w": 6})  # never over a newer round, even ahead


def test_checkpointer_reads_a_checkpoint_without_metadata(tmp_path: Path) -> None:
    (tmp_path / "latest.pt").write_text(json.dumps({"step": 40}))
    ckpt = Checkpointer(tmp_path, _json_save, _json_load, {})
    assert ckpt.current_meta() == M(40)
    assert not ckpt.save(39, {})
    assert ckpt.save(41, {})


def test_lost_list_records_each_rank_once() -> None:
    node = NodeDescriptor("n", "127.0.0.1", 1, 1)
    rdzv = Rendezvous(MemoryStore(), "job", node, RendezvousSettings(1, 3, 0.1, 5))
    assert rdzv.lost(3) == ()
    rdzv.record_lost(3, 1, "silent")
    rdzv.record_lost(3, 1, "exited")
    rdzv.record_lost(3, 2, "exited")
    assert rdzv.lost(3) == ((1, "silent"), (2, "exited"))
    assert decode_lost(encode_lost(((0, "x"),))) == ((0, "x"),)
    assert decode_lost(b"not json") == ()
    assert decode_lost(b'[{"rank": "a"}, 5, {"rank": 4}]') == ((4, ""),)
