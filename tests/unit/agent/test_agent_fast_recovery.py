"""Table tests of the pure parts behind fast recovery.

Covers: which commands the fork server can run (``prewarm.python_launch``),
what it preloads (``zygote.preimport_names``), the next round's expected size
and early close (``rdzv_logic``), rank order across rounds, descriptor
compatibility, and the restart counter surviving a store that forgot it
(over the in-memory store).
"""

from __future__ import annotations

import json
import sys

import pytest

from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic.config import parse_args
from torchflex_agent.rendezvous.logic import (
    NodeDescriptor,
    RendezvousResult,
    RendezvousSettings,
    close_decision,
    encode_membership,
    expected_next,
    rank_order,
)
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.stores.kvstore import MemoryStore
from torchflex_agent.workers.group import LaunchContext, worker_env
from torchflex_agent.workers.prewarm import PythonLaunch, python_launch
from torchflex_agent.workers.zygote import drop_teardown_finalizers, preimport_names
from torchflex_contract.progress import RestartReason
from torchflex_contract.store_keys import CLOSED, RESTARTS, round_key

BASE = ["--rdzv-id", "job-1", "--rdzv-endpoint", "store:29400"]


@pytest.mark.parametrize(
    ("cmd", "want"),
    [
        (["python", "train.py", "--x", "1"], PythonLaunch("python", (), ("train.py", "--x", "1"))),
        (
            ["/venv/bin/python3.11", "-u", "-W", "ignore", "t.py"],
            PythonLaunch("/venv/bin/python3.11", ("-u", "-W", "ignore"), ("t.py",)),
        ),
        (
            ["python3", "-m", "pkg.train", "-m"],
            PythonLaunch("python3", (), ("-m", "pkg.train", "-m")),
        ),
        (["python", "-c", "print(1)"], None),
        (["python", "-"], None),
        (["python", "-uB", "t.py"], None),  # combined flags: not parsed, spawn normally
        (["python"], None),
        (["python", "-m"], None),
        (["bash", "run.sh"], None),
        (["./train"], None),
        ([], None),
    ],
)
def test_python_launch(cmd: list[str], want: PythonLaunch | None) -> None:
    assert python_launch(cmd) == want


def test_python_launch_target() -> None:
    assert python_launch(["python", "a.py"]).target == {"kind": "path", "target": "a.py"}  # type: ignore[union-attr]
    got = python_launch(["python", "-m", "p.q"])
    assert got is not None and got.target == {"kind": "module", "target": "p.q"}


def test_preimport_names_top_level_only() -> None:
    source = """
import os, torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel
from . import local
from .sibling import thing
from x import *
try:
    import numpy
except ImportError:
    pass
if True:
    import json
else:
    import csv

def main():
    import inside_function
"""
    assert preimport_names(source) == [
        "os", "torch.distributed", "torch", "torch.nn", "torch.optim", "torch.nn.parallel",
        "torch.nn.parallel.DistributedDataParallel", "x", "numpy", "json", "csv",
    ]  # fmt: skip


def test_drop_teardown_finalizers_detaches_only_the_named_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types
    import weakref

    class Obj:
        pass

    fake = types.ModuleType("fake_torch_library")

    def _del_library(name: str) -> None:
        raise AssertionError(f"teardown finalizer ran for {name}")

    fake._del_library = _del_library  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_torch_library", fake)
    held = [Obj(), Obj(), Obj()]
    teardown = [weakref.finalize(o, _del_library, f"lib{i}") for i, o in enumerate(held[:2])]
    ran: list[str] = []
    user = weakref.finalize(held[2], ran.append, "user")
    names = (("fake_torch_library", "_del_library"), ("not_loaded_module", "anything"))
    assert drop_teardown_finalizers(names) == 2
    assert [f.alive for f in teardown] == [False, False]
    assert user.alive  # a script's (or tempfile's) finalizer still runs at exit
    assert drop_teardown_finalizers(names) == 0
    # Nothing named is loaded: nothing dropped, nothing imported.
    assert drop_teardown_finalizers((("not_loaded_module", "x"),)) == 0
    assert "not_loaded_module" not in sys.modules
    user()
    assert ran == ["user"]


def test_preimport_names_bad_source() -> None:
    assert preimport_names("def (:") == []


@pytest.mark.parametrize(
    ("prev", "reason", "waiting", "want"),
    [
        (3, RestartReason.MEMBER_LOST, 0, 2),
        (3, RestartReason.MEMBER_LEFT, 0, 2),
        (2, RestartReason.MEMBER_JOINED, 1, 3),
        (3, RestartReason.MEMBER_JOINED, 4, 4),  # capped at max
        (3, RestartReason.WORKER_FAILED, 0, 3),
        (3, RestartReason.STORE_LOST, 0, 3),
        (1, RestartReason.MEMBER_LOST, 0, 1),  # never below 1
        (0, RestartReason.MEMBER_LOST, 0, None),
    ],
)
def test_expected_next(prev: int, reason: RestartReason, waiting: int, want: int | None) -> None:
    assert expected_next(prev, reason, waiting, max_nodes=4) == want


@pytest.mark.parametrize(
    ("arrivals", "expected", "close"),
    [
        (2, 2, True),  # every expected survivor is here: no last call
        (3, 2, True),
        (2, 3, False),  # someone expected is missing: the last call runs
        (1, 1, False),  # below min never closes
        (2, None, False),
    ],
)
def test_close_decision_with_expected(arrivals: int, expected: int | None, close: bool) -> None:
    s = RendezvousSettings(min_nodes=2, max_nodes=4, last_call=1.0, join_timeout=60)
    d = close_decision(
        now=10.0,
        arrivals=arrivals,
        settings=s,
        min_reached_at=None,
        fallback_wait=5.0,
        expected=expected,
    )
    assert d.close is close


def _node(name: str, prev: int = -1) -> NodeDescriptor:
    return NodeDescriptor(name, "10.0.0.1", 1, 1, 0, prev)


def test_rank_order_keeps_previous_ranks_newcomers_last() -> None:
    arrived = [_node("new1"), _node("b", 1), _node("a", 0), _node("new2"), _node("c", 2)]
    assert [n.node_id for n in rank_order(arrived)] == ["a", "b", "c", "new1", "new2"]
    # A lost rank leaves a gap; the order still follows the old ranks.
    assert [n.node_id for n in rank_order([_node("c", 2), _node("a", 0)])] == ["a", "c"]


def test_descriptor_json_is_backward_compatible() -> None:
    old = {"node_id": "n", "addr": "10.0.0.1", "port": 5, "nproc": 2}
    d = NodeDescriptor.from_json(old)
    assert (d.watch_port, d.prev_rank, d.agent_store) == (0, -1, False)
    full = NodeDescriptor("n", "10.0.0.1", 5, 2, 7, 3, True)
    assert NodeDescriptor.from_json(json.loads(json.dumps(full.to_json()))) == full


@pytest.mark.parametrize("agent_store", [True, False])
def test_worker_env_uses_agent_store_of_master(agent_store: bool, tmp_path: object) -> None:
    nodes = (NodeDescriptor("m", "10.0.0.1", 9, 1, 0, -1, agent_store), _node("w"))
    result = RendezvousResult(0, 1, nodes)
    ctx = LaunchContext("r", 0, 3, 1, tmp_path)  # type: ignore[arg-type]
    env = worker_env({}, result, ctx, 0)
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == str(agent_store)
    assert env["MASTER_PORT"] == "9"


def _rdzv(store: MemoryStore, name: str) -> Rendezvous:
    return Rendezvous(store, "job", _node(name), RendezvousSettings(1, 3, 0.1, 5))


def test_restart_count_republished_after_store_loss() -> None:
    backend = MemoryStore()
    a, b = _rdzv(backend.clone(), "a"), _rdzv(backend.clone(), "b")
    backend.add(a.keys.key(RESTARTS), 2)
    assert a.restarts() == 2
    backend.set_available(False)
    backend.set_available(True)  # a restarted store pod comes back empty
    assert a.restarts() == 0
    assert a.raise_restarts_to(2) == 2
    assert b.raise_restarts_to(2) == 2  # a second agent does not add again
    assert b.raise_restarts_to(0) == 2
    backend.add(a.keys.key(RESTARTS), 1)  # a failure counted meanwhile is kept
    assert b.raise_restarts_to(2) == 3


def test_end_round_after_store_loss_only_for_our_round() -> None:
    store = MemoryStore()
    me = _rdzv(store, "me")
    theirs = encode_membership([_node("x"), _node("y")], closer="x")
    store.set(round_key(me.keys, 4, CLOSED), theirs)
    me.end_round_after_store_loss(4)
    assert me.stale_mark(4) is None  # a reused round number of a store that restarted
    ours = encode_membership([_node("x"), _node("me")], closer="x")
    store.set(round_key(me.keys, 5, CLOSED), ours)
    me.end_round_after_store_loss(5)
    mark = me.stale_mark(5)
    assert mark is not None and mark.reason is RestartReason.STORE_LOST
    me.end_round_after_store_loss(6)  # nothing there: no-op
    assert me.stale_mark(6) is None


@pytest.mark.parametrize(
    ("argv", "env", "want"),
    [
        (BASE, {}, True),
        (["--prewarm", "off", *BASE], {}, False),
        (BASE, {"TORCHFLEX_PREWARM": "off"}, False),
        (["--prewarm", "auto", *BASE], {"TORCHFLEX_PREWARM": "off"}, True),
    ],
)
def test_prewarm_flag(argv: list[str], env: dict[str, str], want: bool) -> None:
    assert parse_args([*argv, "--", "python", "t.py"], env).prewarm is want


def test_prewarm_flag_rejects_other_values() -> None:
    with pytest.raises(ConfigError, match="--prewarm"):
        parse_args(["--prewarm", "yes", *BASE, "--", "python", "t.py"], {})
