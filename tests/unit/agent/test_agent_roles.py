"""Multi-role jobs, the agent's pure side: the role flags, each worker's role env, the
roles file's views and codec, the Joint role ranks, and the helper scripts call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchflex_agent import roles
from torchflex_agent.cli import USAGE_HINT, main
from torchflex_agent.errors import ConfigError
from torchflex_agent.loop.logic.config import parse_args, rendezvous_settings, role_key_id
from torchflex_agent.loop.roster import next_guess, peek_view
from torchflex_agent.rendezvous.logic import (
    NodeDescriptor,
    RendezvousResult,
    RendezvousSettings,
    RoundPeek,
    close_decision,
    joint_members,
    joint_room,
    rank_order,
)
from torchflex_agent.rendezvous.protocol import Rendezvous
from torchflex_agent.stores.kvstore import MemoryStore
from torchflex_agent.workers.group import LaunchContext, worker_env
from torchflex_agent.workers.roster import (
    RoleState,
    decode_roles_file,
    encode_roles_file,
    format_role_ranks,
    parse_role_ranks,
    role_view,
    write_roles_file,
)
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode
from torchflex_contract.progress import RestartReason
from torchflex_contract.roles import Coupling, RoleSize
from torchflex_contract.store_keys import ARRIVALS, Keys, round_key

BASE = ["--rdzv-id", "job-1", "--rdzv-endpoint", "store:29400"]
SIZES = "trainer=2:2,reader=1:4"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--role", "Bad_Name"], "--role"),
        (["--role", "store"], "--role"),
        (["--role", "x" * 21], "--role"),
        (["--role", "ps", "--role-sizes", SIZES], "--role"),
        (["--role-sizes", SIZES], "--role"),  # sizes given: the role must be one of them
        (["--role", "reader", "--role-sizes", "reader=2:1"], "--role-sizes"),
        (["--role", "reader", "--role-sizes", "reader"], "--role-sizes"),
        (["--role", "reader", "--role-sizes", "reader=1:2,reader=1:2"], "--role-sizes"),
        (["--role", "reader", "--coupling", "Loose"], "--coupling"),
        (["--role", "reader", "--coupling", "Joint"], "--coupling"),  # Joint needs the sizes
        (["--role", "reader", "--role-sizes", SIZES, "--nnodes", "2:2"], "--nnodes"),
    ],
)
def test_bad_role_flags_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args([*argv, *BASE, "--", "python", "train.py"], env={})


def test_bad_role_exits_with_usage_and_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--role", "Bad_Name", *BASE, "--", "true"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert "--role" in err[0] and err[1] == USAGE_HINT


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        # No role: a single-role job, its keys exactly as before.
        ([], {}, ("default", Coupling.INDEPENDENT, (1, 1), "job-1")),
        (["--role", "default"], {}, ("default", Coupling.INDEPENDENT, (1, 1), "job-1")),
        # torchrun style: --role alone, its own keys.
        (["--role", "reader", "--nnodes", "1:3"], {},
         ("reader", Coupling.INDEPENDENT, (1, 3), "job-1.reader")),
        # The operator's env: the role's range from --role-sizes, or both agreeing.
        ([], {tfenv.ROLE: "reader", tfenv.ROLE_SIZES: SIZES},
         ("reader", Coupling.INDEPENDENT, (1, 4), "job-1.reader")),
        ([], {tfenv.ROLE: "trainer", tfenv.ROLE_SIZES: SIZES, tfenv.NNODES: "2:2",
              tfenv.COUPLING: "Independent"},
         ("trainer", Coupling.INDEPENDENT, (2, 2), "job-1.trainer")),
        # Joint: one rendezvous under the job's id.
        (["--coupling", "joint"], {tfenv.ROLE: "reader", tfenv.ROLE_SIZES: SIZES},
         ("reader", Coupling.JOINT, (1, 4), "job-1")),
    ],
)  # fmt: skip
def test_role_flags_and_env(
    argv: list[str], env: dict[str, str], expected: tuple[str, Coupling, tuple[int, int], str]
) -> None:
    """``expected``: the role, the coupling, the node range, the rendezvous key id."""
    cfg = parse_args([*argv, *BASE, "--", "true"], env=env)
    nodes = (cfg.min_nodes, cfg.max_nodes)
    assert (cfg.role, cfg.coupling, nodes, cfg.rdzv_key_id) == expected
    assert cfg.run_id == "job-1"  # TORCHELASTIC_RUN_ID stays the job's


def test_a_joint_role_joins_one_rendezvous_over_every_roles_range() -> None:
    env = {tfenv.ROLE: "reader", tfenv.ROLE_SIZES: SIZES, tfenv.COUPLING: "Joint"}
    settings = rendezvous_settings(parse_args([*BASE, "--", "true"], env=env))
    assert (settings.min_nodes, settings.max_nodes) == (3, 6)
    assert settings.role_names == ("trainer", "reader")
    alone = rendezvous_settings(parse_args(["--role", "reader", *BASE, "--", "true"], env={}))
    assert (alone.min_nodes, alone.max_nodes, alone.roles) == (1, 1, ())


def node(name: str, role: str, nproc: int = 2, prev: int = -1) -> NodeDescriptor:
    ports = tuple(40000 + 10 * int(name[-1]) + i for i in range(nproc))
    return NodeDescriptor(name, f"10.0.0.{name[-1]}", 29500, nproc, 0, prev, False, "",
                          role, ports)  # fmt: skip


def envs(result_nodes: list[NodeDescriptor], role: str, joint: bool) -> list[dict[str, str]]:
    """Every worker's env of a round, node by node."""
    out = []
    for rank, n in enumerate(result_nodes):
        result = RendezvousResult(3, rank, tuple(result_nodes))
        ctx = LaunchContext("job-1", 0, 3, n.nproc, Path("/tmp/e"), role=n.role or role,
                            joint=joint, roles_file=Path("/tmp/e/roles.json"))  # fmt: skip
        out += [worker_env({}, result, ctx, local) for local in range(n.nproc)]
    return out


def test_independent_role_env_describes_the_roles_own_group() -> None:
    got = envs([node("r0", "reader"), node("r1", "reader")], "reader", joint=False)
    assert [(e["RANK"], e["ROLE_RANK"], e["WORLD_SIZE"], e["ROLE_WORLD_SIZE"]) for e in got] == [
        (str(r), str(r), "4", "4") for r in range(4)
    ]
    assert {e["ROLE_NAME"] for e in got} == {"reader"}
    assert [e[tfenv.SERVICE_PORT] for e in got] == ["40000", "40001", "40010", "40011"]
    assert {e[tfenv.ROLES_FILE] for e in got} == {"/tmp/e/roles.json"}
    assert all(tfenv.ROLE_RANKS not in e for e in got)


def test_single_role_env_is_unchanged() -> None:
    result = RendezvousResult(0, 0, (NodeDescriptor("a", "h", 1, 2),))
    env = worker_env({}, result, LaunchContext("job-1", 0, 3, 2, Path("/tmp/e")), 1)
    assert (env["ROLE_NAME"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("default", "1", "2")
    assert tfenv.SERVICE_PORT not in env and tfenv.ROLE_RANKS not in env


def test_joint_rank_order_makes_each_roles_ranks_contiguous() -> None:
    arrived = [node("n1", "ps", 1), node("n2", "trainer", 2, prev=1),
               node("n3", "trainer", 2, prev=0), node("n4", "ps", 1, prev=2)]  # fmt: skip
    ordered = rank_order(arrived, ["trainer", "ps"])
    assert [n.node_id for n in ordered] == ["n3", "n2", "n4", "n1"]
    assert format_role_ranks(ordered) == "trainer:0-3,ps:4-5"
    got = envs(ordered, "", joint=True)
    table = [(e["ROLE_NAME"], e["RANK"], e["ROLE_RANK"], e["WORLD_SIZE"], e["ROLE_WORLD_SIZE"])
             for e in got]  # fmt: skip
    assert table == [
        ("trainer", "0", "0", "6", "4"), ("trainer", "1", "1", "6", "4"),
        ("trainer", "2", "2", "6", "4"), ("trainer", "3", "3", "6", "4"),
        ("ps", "4", "0", "6", "2"), ("ps", "5", "1", "6", "2"),
    ]  # fmt: skip
    assert {e[tfenv.ROLE_RANKS] for e in got} == {"trainer:0-3,ps:4-5"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("trainer:0-3,ps:4-5", {"trainer": range(4), "ps": range(4, 6)}),
        ("solo:0-0", {"solo": range(1)}),
    ],
)
def test_parse_role_ranks(text: str, expected: dict[str, range]) -> None:
    assert parse_role_ranks(text) == expected


@pytest.mark.parametrize("text", ["trainer", "trainer:3-1", ":0-1", "t:a-b"])
def test_parse_role_ranks_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="role ranks"):
        parse_role_ranks(text)


@pytest.mark.parametrize(
    ("peek", "state", "round_no", "world", "guess"),
    [
        (RoundPeek(-1, None, False, True), RoleState.UNKNOWN, -1, 0, 0),
        (RoundPeek(0, None, False, True), RoleState.FORMING, 0, 0, 0),
        (RoundPeek(2, (node("r0", "reader"),), False, False), RoleState.RUNNING, 2, 2, 2),
        (RoundPeek(2, (node("r0", "reader"),), True, False), RoleState.ENDING, 2, 2, 2),
        (RoundPeek(2, (node("r0", "reader"),), True, True), RoleState.FORMING, 2, 2, 2),
    ],
)
def test_peek_view_states(
    peek: RoundPeek, state: RoleState, round_no: int, world: int, guess: int
) -> None:
    view = peek_view("reader", peek)
    assert (view.state, view.round, view.world_size) == (state, round_no, world)
    assert next_guess(peek) == guess


def test_role_view_lists_one_roles_workers_with_role_ranks() -> None:
    nodes = [node("n1", "trainer", 1), node("n2", "reader", 2), node("n3", "reader", 1)]
    view = role_view("reader", 5, RoleState.RUNNING, nodes)
    assert [(p.rank, p.global_rank, p.node_rank, p.host, p.port) for p in view.members] == [
        (0, 1, 1, "10.0.0.2", 40020), (1, 2, 1, "10.0.0.2", 40021), (2, 3, 2, "10.0.0.3", 40030)
    ]  # fmt: skip
    assert view.world_size == 3
    assert view.endpoints == [("10.0.0.2", 40020), ("10.0.0.2", 40021), ("10.0.0.3", 40030)]


def test_roles_file_round_trips_and_the_helper_reads_it(tmp_path: Path) -> None:
    views = [
        role_view("trainer", 1, RoleState.RUNNING, [node("n1", "trainer")]),
        role_view("reader", 4, RoleState.FORMING, [node("n2", "reader"), node("n3", "reader")]),
    ]
    data = encode_roles_file(views, coupling="Independent", role="trainer", updated=12.5)
    doc = json.loads(data)
    assert (doc["coupling"], doc["role"], doc["updated"]) == ("Independent", "trainer", 12.5)
    assert [r["name"] for r in doc["roles"]] == ["trainer", "reader"]
    assert decode_roles_file(data) == {v.name: v for v in views}
    path = tmp_path / "roles.json"
    assert write_roles_file(path, data)
    environ = {tfenv.ROLES_FILE: str(path), tfenv.SERVICE_PORT: "41000"}
    assert [(p.host, p.port) for p in roles.peers("reader", environ)] == [
        ("10.0.0.2", 40020), ("10.0.0.2", 40021), ("10.0.0.3", 40030), ("10.0.0.3", 40031)
    ]  # fmt: skip
    assert roles.peers("ps", environ) == []
    view = roles.role("reader", environ)
    assert view is not None and (view.round, view.state) == (4, RoleState.FORMING)
    assert roles.service_port(environ) == 41000
    assert roles.roles({}) == {} and roles.service_port({}) == 0  # outside the agent
    assert roles.role_ranks({tfenv.ROLE_RANKS: "a:0-1,b:2-2"}) == {"a": range(2), "b": range(2, 3)}


def test_peek_round_follows_another_roles_rounds_without_writing() -> None:
    store = MemoryStore()
    settings = RendezvousSettings(1, 1, 0.0, 5.0)
    key_id = role_key_id("job-1", "reader", Coupling.INDEPENDENT)
    onlooker = Rendezvous(store, "job-1.trainer", node("n9", "trainer"), settings)
    records = onlooker.for_run(key_id)
    assert records.peek_round(0).round == -1  # the role never started
    assert store.get_many([records.keys.key("rdzv/current")]) == [None]  # wrote nothing
    member = Rendezvous(store, key_id, node("n1", "reader"), settings)
    first = member.next_round()
    peek = records.peek_round(0)
    assert (peek.round, peek.stale, peek.forming) == (0, False, False)
    assert peek.nodes is not None and [n.node_id for n in peek.nodes] == ["n1"]
    member.mark_stale(first.round, RestartReason.MEMBER_LOST)
    assert records.peek_round(0).stale
    second = member.next_round(first.round + 1)
    # The hint still says 0 (members re-join at round + 1): the onlooker steps on.
    peek = records.peek_round(0)
    assert (peek.round, peek.stale, peek.forming) == (second.round, False, False)
    # Someone arrived in the round after: the role is forming, its members still listed.
    store.take_ticket(round_key(Keys(key_id), second.round + 1, ARRIVALS))
    peek = records.peek_round(second.round)
    assert (peek.round, peek.forming, peek.nodes is not None) == (second.round, True, True)


JOINT = RendezvousSettings.joint(
    (RoleSize("trainer", 2, 2), RoleSize("ps", 1, 2)), last_call=1.0, join_timeout=9, liveness=1.5
)


@pytest.mark.parametrize(
    ("counts", "close", "wait"),
    [
        ({"trainer": 2}, False, 5.0),  # ps below its minimum: no last call yet
        ({"trainer": 1, "ps": 3}, False, 5.0),  # enough nodes, not of every role
        ({"trainer": 2, "ps": 1}, False, 1.0),  # every minimum: the last call runs
        ({"trainer": 2, "ps": 2}, True, 0.0),  # every role at its maximum: close now
    ],
)
def test_joint_round_closes_on_every_roles_minimum(
    counts: dict[str, int], close: bool, wait: float
) -> None:
    got = close_decision(
        now=10.0, arrivals=sum(counts.values()), settings=JOINT, min_reached_at=None,
        fallback_wait=5.0, role_counts=counts,
    )  # fmt: skip
    assert (got.close, got.wait) == (close, wait)


def test_joint_members_cap_each_role_and_order_by_role() -> None:
    arrived = [node("n1", "ps", 1), node("n2", "trainer"), node("n3", "ps", 1),
               node("n4", "ps", 1), node("n5", "bogus"), node("n6", "trainer")]  # fmt: skip
    members = joint_members(arrived, JOINT.roles)
    assert [n.node_id for n in members] == ["n2", "n6", "n1", "n3"]
    assert joint_room(members[:3], "ps", JOINT.roles)
    assert not joint_room(members, "ps", JOINT.roles)
    assert not joint_room(members, "bogus", JOINT.roles)


def test_joint_rendezvous_admits_by_role_over_a_store() -> None:
    """Real protocol threads over the in-memory store: a third ps waits, ranks by role."""
    import threading

    store = MemoryStore()
    settings = RendezvousSettings.joint(
        (RoleSize("trainer", 1, 1), RoleSize("ps", 1, 1)), 0.2, 10.0, 1.5
    )
    out: dict[str, RendezvousResult] = {}
    names = [("n1", "ps"), ("n2", "trainer")]

    def join(name: str, role: str) -> None:
        rdzv = Rendezvous(store.clone(), "job-1", node(name, role), settings)
        out[name] = rdzv.next_round()

    threads = [threading.Thread(target=join, args=nr, daemon=True) for nr in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert [n.node_id for n in out["n1"].nodes] == ["n2", "n1"]  # trainer first
    assert (out["n2"].node_rank, out["n1"].node_rank) == (0, 1)
    assert (out["n1"].role_rank_offset, out["n1"].role_world_size, out["n1"].rank_offset) == (
        0, 2, 2
    )  # fmt: skip
