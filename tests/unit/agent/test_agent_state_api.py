"""The state API's pure decisions and its copy files (issue 18, part 2).

Which copy a re-formed group resumes from (``state_logic.choose_source``:
the fenced key, stale members' copies never used), when a copy may be
replaced, the header codec; the copy folder's fenced writes with a real lease
file (``state_shm.CopyStore``) and the agent's folder sweep; and one
``TrainState`` commit/restore round trip in a single process (real torch, no
process group). The multi-process behaviour (SIGKILL, freeze, broadcast) is
``tests/integration/agent/test_state_api.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchflex_agent.fence import Lease
from torchflex_agent.memstate.logic.copies import (
    CopyMeta,
    choose_source,
    keep_in_place,
    may_write,
    unblock_kept,
    usable_incarnation,
)
from torchflex_agent.memstate.shm import (
    CopyStore,
    create_dir,
    hand_round,
    in_place_pids,
    mark_kept,
    sweep_dead,
)
from torchflex_agent.rendezvous.logic import NodeDescriptor, RendezvousResult
from torchflex_agent.workers.group import LaunchContext, worker_env
from torchflex_contract import env as tfenv
from torchflex_contract.progress import RestartReason


def c(round_no: int, step: int, inc: str = "A") -> CopyMeta:
    return CopyMeta(inc, round_no, step)


@pytest.mark.parametrize(
    ("copies", "current", "rank", "broadcast"),
    [
        # Everyone holds the same key: each loads its own, nothing is sent.
        ([c(3, 40), c(3, 40), c(3, 40)], "A", 0, False),
        # A survivor one step ahead (its peer died before committing): the newest step wins.
        ([c(3, 40), c(3, 41)], "A", 1, True),
        # A replacement holds nothing: broadcast from the first holder.
        ([None, c(3, 40), c(3, 40)], "A", 1, True),
        # A member lost in round 3 and back holds a higher step than it should never
        # reach; the group that replaced it trained in round 4: round first, never its copy.
        ([c(3, 45), c(4, 41), c(4, 41)], "A", 1, True),
        # Rounds compare only within an incarnation: the current one's copies win.
        ([c(9, 90, "OLD"), c(2, 30, "A")], "A", 1, True),
        # The store restarted (new incarnation, nobody wrote since): the only old numbering.
        ([c(7, 70, "OLD"), c(7, 70, "OLD")], "NEW", 0, False),
    ],
)
def test_choose_source(
    copies: list[CopyMeta | None], current: str, rank: int, broadcast: bool
) -> None:
    got = choose_source(copies, current)
    assert got is not None
    assert (got.rank, got.broadcast) == (rank, broadcast)
    assert got.meta == copies[rank]
    assert rank in got.holders(copies)


@pytest.mark.parametrize(
    "copies",
    [
        [],
        [None, None],
        # Two old numberings that cannot be ordered against each other: use neither.
        [c(5, 50, "X"), c(6, 60, "Y")],
    ],
)
def test_no_usable_copy(copies: list[CopyMeta | None]) -> None:
    assert choose_source(copies, "NEW") is None


def test_usable_incarnation() -> None:
    assert usable_incarnation([c(1, 1, "A"), c(1, 1, "B")], "B") == "B"
    assert usable_incarnation([c(1, 1, "A"), None], "B") == "A"
    assert usable_incarnation([None], "B") is None


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        (None, c(0, 1), True),
        (c(2, 10), c(2, 11), True),
        (c(2, 10), c(2, 10), True),
        (c(2, 10), c(2, 9), False),  # never back within a round
        (c(3, 5), c(2, 50), False),  # never an older round, even at a higher step
        (c(2, 50), c(3, 5), True),
        (c(9, 90, "OLD"), c(0, 1, "NEW"), True),  # a new store numbering
    ],
)
def test_may_write(current: CopyMeta | None, new: CopyMeta, allowed: bool) -> None:
    assert may_write(current, new) is allowed


def test_header_round_trip_and_garbage() -> None:
    meta = CopyMeta("inc", 4, 17, rank=2, world=3)
    assert CopyMeta.from_header(meta.header()) == meta
    for bad in (b"", b"{}\n", b"\xff\xfe\n", b'{"magic": "torchflex-state-v1"}\n', b"[1]\n"):
        with pytest.raises(ValueError, match="state copy header"):
            CopyMeta.from_header(bad)


def _env(folder: Path, lease: Path, round_no: int, local_rank: int = 0) -> dict[str, str]:
    return {
        tfenv.STATE_DIR: str(folder),
        tfenv.FENCE_FILE: str(lease),
        tfenv.ROUND: str(round_no),
        "LOCAL_RANK": str(local_rank),
    }


def test_copy_writes_are_fenced_and_only_move_forward(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(3, "inc", time.monotonic())
    store = CopyStore(_env(tmp_path, lease.path, 3))
    assert store.write(CopyMeta("inc", 3, 10), b"ten") is None
    assert store.read() == (CopyMeta("inc", 3, 10), b"ten")
    refused = store.write(CopyMeta("inc", 3, 9), b"nine")
    assert refused is not None and "newer" in refused
    # The agent revokes the lease (declared lost, fenced): nothing more lands.
    lease.revoke()
    refused = store.write(CopyMeta("inc", 3, 11), b"eleven")
    assert refused == "fenced (revoked)"
    # The agent moved on to round 4: a round-3 worker is out of date.
    lease.grant(4, "inc", time.monotonic())
    assert store.write(CopyMeta("inc", 3, 11), b"eleven") == "fenced (other-round)"
    assert store.read() == (CopyMeta("inc", 3, 10), b"ten")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy-0", "lease"]  # no temp left


def test_copies_are_per_local_rank_and_absent_without_the_agent(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(0, "inc", time.monotonic())
    one = CopyStore(_env(tmp_path, lease.path, 0, local_rank=1))
    assert one.write(CopyMeta("inc", 0, 1), b"x") is None
    assert CopyStore(_env(tmp_path, lease.path, 0, local_rank=0)).read_meta() is None
    bare = CopyStore({})
    assert not bare.enabled and bare.read() is None
    assert bare.write(CopyMeta("", -1, 1), b"x") is not None


LOST, JOINED = RestartReason.MEMBER_LOST, RestartReason.MEMBER_JOINED
LEFT = RestartReason.MEMBER_LEFT


@pytest.mark.parametrize(
    ("reason", "silent", "running", "declared", "keep"),
    [
        (LOST, False, True, [11, 12], True),  # a peer's process is gone: its sockets closed
        (JOINED, False, True, [11, 12], True),
        (LEFT, False, True, [11, 12], True),
        (LOST, True, True, [11, 12], False),  # frozen peer: survivors may be stuck with it
        (RestartReason.WORKER_FAILED, False, True, [11, 12], False),
        (RestartReason.STORE_LOST, False, True, [11, 12], False),
        (LOST, False, False, [11, 12], False),  # one of ours exited: restart them
        (LOST, False, True, [11, None], False),  # a script that did not opt in
        (LOST, False, True, [11, 99], False),  # declared by an earlier worker of that rank
    ],
)
def test_keep_in_place(
    reason: RestartReason, silent: bool, running: bool, declared: list[int | None], keep: bool
) -> None:
    assert keep_in_place(reason, silent, running, declared, [11, 12]) is keep


@pytest.mark.parametrize(
    ("reason", "silent", "running", "declared", "keep"),
    [
        (LOST, True, True, [11, 12], True),  # frozen peer: each worker shuts its links down
        (LOST, False, True, [11, 12], True),
        (JOINED, False, True, [11, 12], True),
        (RestartReason.WORKER_FAILED, False, True, [11, 12], False),
        (RestartReason.STORE_LOST, True, True, [11, 12], False),
        (LOST, True, False, [11, 12], False),
        (LOST, True, True, [11, None], False),
    ],
)
def test_keep_in_place_when_the_workers_can_be_unblocked(
    reason: RestartReason, silent: bool, running: bool, declared: list[int | None], keep: bool
) -> None:
    got = keep_in_place(reason, silent, running, declared, [11, 12], unblockable=True)
    assert got is keep


@pytest.mark.parametrize(
    ("reason", "unblock"),
    [(LOST, True), (JOINED, False), (LEFT, False), (RestartReason.WORKER_FAILED, False)],
)
def test_kept_workers_are_unblocked_after_a_loss_only(reason: RestartReason, unblock: bool) -> None:
    # A join or a leave leaves a whole group: its ranks leave together at a step's end.
    assert unblock_kept(reason) is unblock


def test_the_in_place_handshake_files(tmp_path: Path) -> None:
    env = {tfenv.STATE_DIR: str(tmp_path), tfenv.ROUND: "4", "LOCAL_RANK": "1"}
    worker = CopyStore(env)
    assert in_place_pids(tmp_path, 2) == [None, None]
    worker.declare_in_place()
    assert in_place_pids(tmp_path, 2) == [None, os.getpid()]
    assert not worker.kept_past(4) and worker.next_round(4) is None
    mark_kept(tmp_path, 1, 4)  # the agent, the moment it decides
    assert worker.kept_past(4) and not worker.kept_past(5)
    hand_round(tmp_path, 1, 5, {"RANK": "0", tfenv.ROUND: "5"})  # once the round closed
    assert worker.next_round(4) == (5, {"RANK": "0", tfenv.ROUND: "5"})
    assert worker.next_round(5) is None  # nothing newer than the round it joined


def test_workers_are_told_the_agents_folder_only_when_it_has_one(tmp_path: Path) -> None:
    result = RendezvousResult(round=2, node_rank=0, nodes=(NodeDescriptor("n0", "h", 1, 1),))
    ctx = LaunchContext("job", 0, 3, 1, tmp_path / "errors", state_dir=tmp_path / "shm")
    assert worker_env({}, result, ctx, 0)[tfenv.STATE_DIR] == str(tmp_path / "shm")
    bare = LaunchContext("job", 0, 3, 1, tmp_path / "errors")
    assert tfenv.STATE_DIR not in worker_env({}, result, bare, 0)


def test_sweep_removes_only_dead_agents_folders(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = tmp_path / f"torchflex-state-{int(dead.stdout)}-abc"
    live = tmp_path / f"torchflex-state-{os.getpid()}-def"
    other = tmp_path / "something-else"
    for d in (gone, live, other):
        d.mkdir()
    assert sweep_dead(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])
    mine = create_dir(tmp_path)
    assert mine.name.startswith(f"torchflex-state-{os.getpid()}-") and mine.is_dir()


def test_train_state_round_trip_in_one_process(tmp_path: Path) -> None:
    import torch  # only here: the rest of this module is torch-free

    from torchflex_agent.state import TrainState

    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(1, "inc", time.monotonic())
    env = _env(tmp_path, lease.path, 1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = TrainState(model=model, opt=opt, environ=env)
    assert state.commit(7, loop={"epoch": 2})
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the step in flight, lost with the worker
    again = TrainState(model=model, opt=opt, environ=env)
    got = again.restore()
    assert got is not None
    assert (got.step, got.loop, got.broadcast) == (7, {"epoch": 2}, False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, kept[k]), k
    assert "momentum_buffer" in str(opt.state_dict()["state"])
    lease.revoke()
    assert not again.commit(8) and again.refused == 1
