"""Multi-role jobs with real agents: two Independent roles over one c10d store.

Two roles (``trainer`` 2:2, ``reader`` 1:2), two agents each, two workers per
agent, all on 127.0.0.1 with a real ``torchflex-agent store``. Every worker
prints its environment (``role_env.py``); the test checks each one's ranks
within its role's own group, its service port, and the roles file its agent
keeps (every role's round and members). Then one reader agent is SIGKILLed:
the readers re-form alone while the trainers' round and processes stay.
"""

from __future__ import annotations

import json
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.localproc import LineLog, free_port
from e2e.polling import poll_until
from tests.integration.agent.gloo_ranks import run_ranks
from tests.integration.agent.tfagent_helpers import PYTHON, Job, pid_alive
from torchflex_agent import roles
from torchflex_agent.workers.roster import RoleState, RoleView
from torchflex_contract import env as tfenv

SCRIPT = str(Path(__file__).with_name("role_env.py"))
SIZES = "trainer=2:2,reader=1:2"
RANGES = {"trainer": "2:2", "reader": "1:2"}


def start_role(job: Job, role: str) -> LineLog:
    """One agent of ``role``: two workers; readers get a long last call, so the two
    reader agents form one round whatever the machine's load."""
    extra = ["--nproc-per-node", "2", "--prewarm", "off", "--role", role, "--role-sizes", SIZES,
             "--rdzv-join-timeout", "180"]  # fmt: skip
    if role == "reader":
        extra += ["--rdzv-last-call", "20"]
    return job.start_agent([PYTHON, SCRIPT, "300"], RANGES[role], extra)


def worker_envs(log: LineLog, after: float = 0.0) -> list[dict[str, Any]]:
    """Every ``ENV`` line this agent's workers printed (at or after ``after``)."""
    return [json.loads(m.group(1)) for t, m in log.matching(r"ENV (\{.*\})$") if t >= after]


def wait_envs(log: LineLog, count: int, timeout: float, after: float = 0.0) -> list[dict[str, Any]]:
    if not poll_until(lambda: len(worker_envs(log, after)) >= count, timeout, 0.1):
        tail = "\n".join(line for _, line in log.lines[-30:])
        raise AssertionError(f"{log.name}: fewer than {count} workers printed their env:\n{tail}")
    return worker_envs(log, after)[:count]


def roles_of(env: dict[str, Any]) -> dict[str, RoleView]:
    return roles.roles({tfenv.ROLES_FILE: env["TORCHFLEX_ROLES_FILE"]})


def check_role_group(envs: list[dict[str, Any]], role: str, world: int) -> None:
    """One role's workers form their own group: ranks 0..world-1, role ranks equal."""
    assert sorted(int(e["RANK"]) for e in envs) == list(range(world)), envs
    for e in envs:
        assert e["ROLE_NAME"] == role
        assert (e["ROLE_RANK"], e["ROLE_WORLD_SIZE"]) == (e["RANK"], e["WORLD_SIZE"])
        assert int(e["WORLD_SIZE"]) == world
        assert int(e["TORCHFLEX_SERVICE_PORT"]) > 0
        assert e["TORCHFLEX_ROLE_RANKS"] is None
        assert e["TORCHELASTIC_RUN_ID"] and not e["TORCHELASTIC_RUN_ID"].endswith(role)
    assert len({e["MASTER_PORT"] for e in envs}) == 1  # one master per role's group


def wait_roles_file(
    env: dict[str, Any], want: dict[str, tuple[int, int]], timeout: float
) -> dict[str, RoleView]:
    """The roles file once each role in ``want`` is running at (min round, world size)."""
    got: dict[str, RoleView] = {}

    def ready() -> bool:
        got.clear()
        got.update(roles_of(env))
        return all(
            r in got
            and got[r].state is RoleState.RUNNING
            and got[r].round >= lo
            and got[r].world_size == world
            for r, (lo, world) in want.items()
        )

    if not poll_until(ready, timeout, 0.2):
        raise AssertionError(f"roles file never showed {want}: {got}")
    return got


@pytest.mark.timeout(420)
def test_independent_roles_form_their_own_groups_and_reform_alone(tmp_path: Path) -> None:
    with Job(tmp_path) as job:
        job.start_store()
        trainers = [start_role(job, "trainer") for _ in range(2)]
        readers = [start_role(job, "reader") for _ in range(2)]
        t_envs = [e for log in trainers for e in wait_envs(log, 2, 200)]
        r_envs = [e for log in readers for e in wait_envs(log, 2, 200)]
        check_role_group(t_envs, "trainer", 4)
        check_role_group(r_envs, "reader", 4)
        assert {e["TORCHFLEX_ROUND"] for e in t_envs + r_envs} == {"0"}

        # Each worker's roles file: both roles, every member with its service port.
        ports = {
            role: sorted((int(e["RANK"]), int(e["TORCHFLEX_SERVICE_PORT"])) for e in envs)
            for role, envs in (("trainer", t_envs), ("reader", r_envs))
        }
        for env in t_envs + r_envs:
            view = wait_roles_file(env, {"trainer": (0, 4), "reader": (0, 4)}, 30)
            assert list(view) == ["trainer", "reader"]  # --role-sizes order
            for role in ("trainer", "reader"):
                members = view[role].members
                assert [(p.rank, p.port) for p in members] == ports[role]
                assert {p.host for p in members} == {"127.0.0.1"}
                assert [p.global_rank for p in members] == [p.rank for p in members]

        # A reader's agent dies: only the readers re-form (round 1, one node).
        trainer_pids = [e["pid"] for e in t_envs]
        killed = readers[0]
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
        at = time.monotonic()
        survivors = wait_envs(readers[1], 2, 60, after=at)
        check_role_group(survivors, "reader", 2)
        assert {e["TORCHFLEX_ROUND"] for e in survivors} == {"1"}
        view = wait_roles_file(t_envs[0], {"trainer": (0, 4), "reader": (1, 2)}, 30)
        assert view["trainer"].round == 0  # the trainers' round never moved
        assert [(p.rank, p.port) for p in view["reader"].members] == sorted(
            (int(e["RANK"]), int(e["TORCHFLEX_SERVICE_PORT"])) for e in survivors
        )
        assert worker_envs(trainers[0], at) == [] and worker_envs(trainers[1], at) == []
        assert all(pid_alive(pid, 0.0) for pid in trainer_pids)
        assert all(log.proc.poll() is None for log in trainers)


JOINT_SIZES = "trainer=2:2,ps=2:2"


def torchrun_ranks(layout: list[tuple[str, int]]) -> list[tuple[int, int, int, int]]:
    """torch's own ``_assign_worker_ranks`` (torchrun ``--role``) for nodes of
    (role, nproc) in group-rank order: each worker's (RANK, ROLE_RANK, WORLD_SIZE,
    ROLE_WORLD_SIZE), over a real in-process store, one thread per node as its agents."""
    from torch._C._distributed_c10d import HashStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

    store = HashStore()
    got: dict[int, list[tuple[int, int, int, int]]] = {}

    def assign(group_rank: int) -> None:
        role, nproc = layout[group_rank]
        # Neither the rendezvous handler nor the agent (``self``) is read by it.
        handler: Any = None
        spec = WorkerSpec(role=role, local_world_size=nproc, rdzv_handler=handler, entrypoint="x")
        agent: Any = None
        workers = SimpleElasticAgent._assign_worker_ranks(
            agent, store, group_rank, len(layout), spec
        )
        got[group_rank] = [
            (w.global_rank, w.role_rank, w.world_size, w.role_world_size) for w in workers
        ]

    threads = [threading.Thread(target=assign, args=(g,)) for g in range(len(layout))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [ranks for g in range(len(layout)) for ranks in got[g]]


@pytest.mark.timeout(420)
def test_joint_roles_get_torchrun_role_ranks(tmp_path: Path) -> None:
    with Job(tmp_path) as job:
        job.start_store()
        # Interleaved: the round orders its nodes by role, not by arrival.
        order = ["ps", "trainer", "ps", "trainer"]
        logs = []
        for role in order:
            extra = ["--nproc-per-node", "2", "--prewarm", "off", "--role", role,
                     "--role-sizes", JOINT_SIZES, "--coupling", "Joint",
                     "--rdzv-join-timeout", "180"]  # fmt: skip
            logs.append(job.start_agent([PYTHON, SCRIPT, "300"], "2:2", extra))
        envs = [e for log in logs for e in wait_envs(log, 2, 200)]
        envs.sort(key=lambda e: int(e["RANK"]))
        assert [int(e["RANK"]) for e in envs] == list(range(8))
        assert {e["WORLD_SIZE"] for e in envs} == {"8"}
        assert [e["ROLE_NAME"] for e in envs] == ["trainer"] * 4 + ["ps"] * 4
        assert {e["TORCHFLEX_ROLE_RANKS"] for e in envs} == {"trainer:0-3,ps:4-7"}
        assert len({e["MASTER_PORT"] for e in envs}) == 1  # one group across roles
        # The same layout through torchrun's own rank assignment.
        nodes = sorted({(int(e["GROUP_RANK"]), e["ROLE_NAME"]) for e in envs})
        layout = [(role, 2) for _, role in nodes]
        ours = [(int(e["RANK"]), int(e["ROLE_RANK"]), int(e["WORLD_SIZE"]),
                 int(e["ROLE_WORLD_SIZE"])) for e in envs]  # fmt: skip
        assert ours == torchrun_ranks(layout)
        # Every agent's roles file lists both roles from the one round.
        for env in envs:
            view = wait_roles_file(env, {"trainer": (0, 4), "ps": (0, 4)}, 30)
            assert [p.global_rank for p in view["trainer"].members] == [0, 1, 2, 3]
            assert [p.global_rank for p in view["ps"].members] == [4, 5, 6, 7]
            assert [p.rank for p in view["ps"].members] == [0, 1, 2, 3]


ROLE_GROUP_RANK = textwrap.dedent(
    """
    import datetime, json, os
    import torch
    import torch.distributed as dist
    from torchflex_agent import roles

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    mine = roles.role_group(os.environ["ROLE_NAME"])
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value, group=mine)
    print(json.dumps({"rank": dist.get_rank(), "sum": value.item(),
                      "group_size": dist.get_world_size(mine),
                      "same": roles.role_group(os.environ["ROLE_NAME"]) is mine}), flush=True)
    dist.destroy_process_group()
    """
)


def test_role_group_is_a_process_group_of_the_roles_ranks() -> None:
    """Four real gloo ranks with a Joint job's env: each role's group reduces over its
    own ranks only, and a second call returns the same group."""
    port = free_port()
    role_of = ["trainer", "trainer", "trainer", "ps"]
    envs = [
        {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": ":".join(sys.path),
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "ROLE_NAME": role,
            tfenv.ROLE_RANKS: "trainer:0-2,ps:3-3",
        }
        for rank, role in enumerate(role_of)
    ]
    got = run_ranks(ROLE_GROUP_RANK, envs)
    assert [(r["rank"], r["sum"], r["group_size"], r["same"]) for r in got] == [
        (0, 3.0, 3, True), (1, 3.0, 3, True), (2, 3.0, 3, True), (3, 3.0, 1, True)
    ]  # fmt: skip
