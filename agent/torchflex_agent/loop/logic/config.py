"""Agent configuration: torchrun-style flags, each defaulting from the operator's env.

Where it sits: ``cli`` parses argv with ``parse_args`` into an
``AgentConfig``; everything else takes the config object. Parsing is pure
(argv and an env mapping in, config or ``ConfigError`` out) so every bad
input is table-tested; the error message always names the offending flag.
The backend's endpoint syntax comes from ``stores.logic``, never from
``stores.registry`` (whose openers reach the store clients): an import-linter
contract in pyproject.toml keeps it so.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TypeVar

from torchflex_agent.errors import ConfigError
from torchflex_agent.rendezvous.logic import RendezvousSettings
from torchflex_agent.stores import logic as rdzv_endpoints
from torchflex_agent.stores.logic import Endpoint
from torchflex_contract import env as tfenv
from torchflex_contract.rendezvous_backends import DEFAULT_BACKEND, RendezvousBackend
from torchflex_contract.roles import (
    DEFAULT_ROLE,
    Coupling,
    RoleSize,
    RoleSizesError,
    parse_role_sizes,
    role_name_problem,
)

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    min_nodes: int
    max_nodes: int
    nproc_spec: str
    rdzv_backend: RendezvousBackend
    endpoints: tuple[Endpoint, ...]
    run_id: str
    last_call: float
    join_timeout: float
    max_restarts: int
    monitor_interval: float
    health_port: int
    health_host: str
    node_addr: str
    termination_grace: float
    stop_grace: float
    heartbeat_interval: float
    liveness_timeout: float
    tls_dir: str | None
    command: tuple[str, ...]
    prewarm: bool = True
    """Fork Python workers from a fork server that imported torch ahead of time."""
    standby_file: str | None = None
    """While this file reads ``true`` the agent is a warm spare: it does not join
    (``loop.standby``)."""
    teardown_grace: float = tfenv.DEFAULT_TEARDOWN_GRACE_S
    """Seconds a worker whose script returned may take to exit (then: stacks, SIGKILL)."""
    completion_grace: float = tfenv.DEFAULT_COMPLETION_GRACE_S
    """Seconds workers may run on once another member finished the job (then: stacks, end)."""
    node_check: bool = False
    """Check the node's devices against its peers before the first join (``loop.preflight``)."""
    hang_timeout: float | None = None
    """Seconds without progress anywhere before a hang is declared; None: derived from the
    job's step times (``loop.logic.stall``); 0: no hang detection."""
    role: str = DEFAULT_ROLE
    """This agent's training role (``--role``); ``DEFAULT_ROLE``: a single-role job."""
    coupling: Coupling = Coupling.INDEPENDENT
    """How the job's roles rendezvous (``--coupling``); only read when ``role_sizes`` is set."""
    role_sizes: tuple[RoleSize, ...] = ()
    """Every role of the job in spec order (``--role-sizes``); empty: one role."""
    job_scoped_roles: tuple[str, ...] = ()
    """Roles whose failure re-forms every role (``--job-scoped-roles``; Independent)."""

    @property
    def rdzv_key_id(self) -> str:
        """The id this agent's rendezvous keys live under (``store_keys.Keys``).

        A role of an Independent job has its own, ``<rdzv-id>.<role>``: its own rounds,
        heartbeats, lost lists and restart count, with no change to the protocol. A
        single-role job (no ``--role``) and a Joint job keep the job's id as it is.
        """
        return role_key_id(self.run_id, self.role, self.coupling)

    @property
    def store_name(self) -> str:
        """The rendezvous store as logs name it: backend and endpoints."""
        return rdzv_endpoints.describe(self.rdzv_backend, self.endpoints)


def rendezvous_settings(config: AgentConfig) -> RendezvousSettings:
    """The rendezvous this agent joins: its own role's range, or, Joint, every role's."""
    if config.role_sizes and config.coupling is Coupling.JOINT:
        return RendezvousSettings.joint(
            config.role_sizes, config.last_call, config.join_timeout, config.liveness_timeout
        )
    return RendezvousSettings(
        config.min_nodes,
        config.max_nodes,
        config.last_call,
        config.join_timeout,
        config.liveness_timeout,
    )


def role_key_id(run_id: str, role: str, coupling: Coupling) -> str:
    """The rendezvous key id of ``role`` in a job (see ``AgentConfig.rdzv_key_id``)."""
    if role == DEFAULT_ROLE or coupling is Coupling.JOINT:
        return run_id
    return f"{run_id}.{role}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        if len(parts) == 1:
            lo = hi = int(parts[0])
        elif len(parts) == 2:
            lo, hi = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--nnodes: expected N or MIN:MAX, got {text!r}") from None
    if lo < 1 or hi < lo:
        raise ConfigError(f"--nnodes: need 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


MAX_NPROC = 1024
"""Most workers one agent starts. Above any node's GPU count (16 at most today)
and the hardware threads of a two-socket server (768), where more processes
only contend; low enough that a typo (``--nproc-per-node 10000``) is refused
instead of forking ten thousand interpreters (each costs the agent 2 pipes
and 2 log threads too)."""


def check_nproc(text: str) -> str:
    if text in ("auto", "gpu", "cpu"):
        return text
    if text.isdigit() and 1 <= int(text) <= MAX_NPROC:
        return text
    raise ConfigError(f"--nproc-per-node: expected auto|gpu|cpu|N (1..{MAX_NPROC}), got {text!r}")


MIN_HANG_TIMEOUT_S = float(tfenv.MIN_HANG_TIMEOUT_S)
MAX_SECONDS = 86_400.0
"""Upper bound of every duration flag that takes no ``inf``: a day. Larger
values are typos, and some would overflow a thread wait (``OverflowError``)."""


def _plain(x: float) -> str:
    """1000000, not 1e+06; 0.05 as it is."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _number(
    flag: str, conv: Callable[[str], _T], low: float, high: float, *, inf_ok: bool = False
) -> Callable[[str], _T]:
    """A parser for a number in ``[low, high]``; NaN never, ``inf`` only if ``inf_ok``."""

    def parse(text: str) -> _T:
        try:
            value = conv(text)
        except ValueError:
            raise ConfigError(f"{flag}: not a number: {text!r}") from None
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(f"{flag}: not a number: {text!r}")
        if inf_ok and value == math.inf:
            return value
        if not low <= value <= high:  # type: ignore[operator]
            also = " (or inf)" if inf_ok else ""
            shown = text if len(text) <= 24 else text[:21] + "..."
            raise ConfigError(
                f"{flag}: must be between {_plain(low)} and {_plain(high)}{also}, got {shown!r}"
            )
        return value

    return parse


@dataclasses.dataclass(frozen=True)
class _Flag:
    """One option: its spellings (ours first, then torchrun's), where it lands, its env default."""

    names: tuple[str, ...]
    dest: str
    env: str | None
    default: str
    help: str


_FLAGS: tuple[_Flag, ...] = (
    _Flag(
        ("--nnodes",),
        "nnodes",
        tfenv.NNODES,
        "",
        "N or MIN:MAX nodes in the job, or in this role (unset: 1, or the role's range in "
        "--role-sizes)",
    ),
    _Flag(
        ("--nproc-per-node", "--nproc_per_node"),
        "nproc_per_node",
        tfenv.NPROC_PER_NODE,
        "auto",
        "workers per node: auto (one per GPU, else 1), gpu, cpu (1) or N",
    ),
    _Flag(
        ("--rdzv-backend", "--rdzv_backend"),
        "rdzv_backend",
        tfenv.RDZV_BACKEND,
        DEFAULT_BACKEND.value,
        f"rendezvous store: {', '.join(rdzv_endpoints.NAMES)}",
    ),
    _Flag(
        ("--rdzv-endpoint", "--rdzv_endpoint"),
        "rdzv_endpoint",
        tfenv.RDZV_ENDPOINT,
        "",
        "c10d: host[:port] of the store; etcd: comma-separated [http[s]://]host[:port]",
    ),
    _Flag(
        ("--rdzv-id", "--rdzv_id"),
        "rdzv_id",
        tfenv.RDZV_ID,
        "",
        "the job's unique id: agents with the same id form one group",
    ),
    _Flag(
        ("--role",),
        "role",
        tfenv.ROLE,
        DEFAULT_ROLE,
        "this node's training role (torchrun's flag): ROLE_NAME of its workers; with "
        "--role-sizes, one of the job's roles",
    ),
    _Flag(
        ("--coupling",),
        "coupling",
        tfenv.COUPLING,
        Coupling.INDEPENDENT.value,
        "how the roles rendezvous: Independent (each role its own group) or Joint (one "
        "group, contiguous ranks per role; torchrun --role semantics)",
    ),
    _Flag(
        ("--role-sizes",),
        "role_sizes",
        tfenv.ROLE_SIZES,
        "",
        "every role of the job in order, NAME=MIN:MAX joined by ',' (trainer=2:2,reader=1:4)",
    ),
    _Flag(
        ("--job-scoped-roles",),
        "job_scoped_roles",
        tfenv.JOB_SCOPED_ROLES,
        "",
        "roles of --role-sizes (Independent) whose failure or loss re-forms every other "
        "role too (failureScope: Job), joined by ','",
    ),
    _Flag(
        ("--rdzv-last-call",),
        "last_call",
        tfenv.RDZV_LAST_CALL,
        str(tfenv.DEFAULT_LAST_CALL_S),
        "seconds a round stays open for more nodes once MIN have joined",
    ),
    _Flag(
        ("--rdzv-join-timeout",),
        "join_timeout",
        tfenv.RDZV_JOIN_TIMEOUT,
        str(tfenv.DEFAULT_JOIN_TIMEOUT_S),
        "seconds to wait for MIN nodes before giving up",
    ),
    _Flag(
        ("--max-restarts", "--max_restarts"),
        "max_restarts",
        tfenv.MAX_RESTARTS,
        str(tfenv.DEFAULT_MAX_RESTARTS),
        "worker failures the job survives (counted job-wide)",
    ),
    _Flag(
        ("--monitor-interval", "--monitor_interval"),
        "monitor_interval",
        tfenv.MONITOR_INTERVAL,
        str(tfenv.DEFAULT_MONITOR_INTERVAL_S),
        "seconds between checks of the local workers",
    ),
    _Flag(
        ("--health-port",),
        "health_port",
        tfenv.HEALTH_PORT,
        str(tfenv.DEFAULT_HEALTH_PORT),
        "port of /healthz and /status (0: none)",
    ),
    _Flag(("--health-host",), "health_host", None, "0.0.0.0", "address the health server binds"),
    _Flag(
        ("--node-addr",),
        "node_addr",
        tfenv.POD_IP,
        "127.0.0.1",
        "address peers reach this node on (the pod IP)",
    ),
    _Flag(
        ("--termination-grace",),
        "termination_grace",
        tfenv.TERMINATION_GRACE,
        str(tfenv.DEFAULT_TERMINATION_GRACE_S),
        "seconds workers get to checkpoint after a SIGTERM",
    ),
    _Flag(
        ("--stop-grace",),
        "stop_grace",
        tfenv.STOP_GRACE,
        str(tfenv.DEFAULT_STOP_GRACE_S),
        "seconds workers get to exit when a round ends, before SIGKILL",
    ),
    _Flag(
        ("--teardown-grace",),
        "teardown_grace",
        tfenv.TEARDOWN_GRACE,
        str(tfenv.DEFAULT_TEARDOWN_GRACE_S),
        "seconds a worker whose script returned may take to exit before its stack is "
        "recorded and it is killed (its exit code stays the script's)",
    ),
    _Flag(
        ("--completion-grace",),
        "completion_grace",
        tfenv.COMPLETION_GRACE,
        str(tfenv.DEFAULT_COMPLETION_GRACE_S),
        "seconds workers may run on after another member finished the job before their "
        "stacks are recorded and they are ended",
    ),
    _Flag(
        ("--node-check",),
        "node_check",
        tfenv.NODE_CHECK,
        "off",
        "on: before joining, time a matmul on each device (checked against the CPU) and "
        "exit 79 if a result is wrong or the node is over 2x slower than its peers' median",
    ),
    _Flag(
        ("--hang-timeout",),
        "hang_timeout",
        tfenv.HANG_TIMEOUT,
        "auto",
        "seconds without training progress anywhere in the job before a hang is declared "
        "(stacks recorded, workers restarted; a counted failure); 'auto' derives it from "
        "the step time (60-600 s), 0 turns it off",
    ),
    _Flag(
        ("--heartbeat-interval",),
        "heartbeat_interval",
        tfenv.HEARTBEAT_INTERVAL,
        str(tfenv.DEFAULT_HEARTBEAT_INTERVAL_S),
        "seconds between this node's heartbeats",
    ),
    _Flag(
        ("--liveness-timeout",),
        "liveness_timeout",
        tfenv.LIVENESS_TIMEOUT,
        str(tfenv.DEFAULT_LIVENESS_TIMEOUT_S),
        "seconds without a heartbeat before a peer counts as lost",
    ),
    _Flag(
        ("--rdzv-tls-dir",),
        "tls_dir",
        tfenv.RDZV_TLS_DIR,
        "",
        "directory with ca.crt, tls.crt, tls.key for etcd over TLS",
    ),
    _Flag(
        ("--prewarm",),
        "prewarm",
        tfenv.PREWARM,
        "auto",
        "auto: fork Python workers from a process that imported torch ahead; off",
    ),
    _Flag(
        ("--standby-file",),
        "standby_file",
        tfenv.STANDBY_FILE,
        "",
        "while this file reads 'true', wait as a warm spare before joining (the pod's "
        "standby annotation)",
    ),
)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The flags, each defaulting from the env var the operator sets (empty counts as unset)."""
    p = _Parser(
        prog="torchflex-agent",
        usage="torchflex-agent [options] -- <training command...>",
        description="Elastic PyTorch launcher (torchrun-compatible flags).",
    )
    for flag in _FLAGS:
        default = (env.get(flag.env) if flag.env else None) or flag.default
        p.add_argument(
            *flag.names,
            dest=flag.dest,
            default=default,
            # argparse %-formats help text; a default from the env may hold a '%'.
            help=(
                f"{flag.help} (default: {default or 'unset'}"
                + (f"; env {flag.env})" if flag.env else ")")
            ).replace("%", "%%"),
        )
    p.add_argument("command", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> AgentConfig:
    """Parse flags (defaults from ``env``); raises ``ConfigError`` naming the flag."""
    env = os.environ if env is None else env
    ns = build_parser(env).parse_args(list(argv))
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("missing training command (torchflex-agent [options] -- cmd ...)")
    role, coupling, sizes = parse_roles(ns.role, ns.coupling, ns.role_sizes)
    job_scoped = parse_job_scoped_roles(ns.job_scoped_roles, coupling, sizes)
    lo, hi = role_nnodes(ns.nnodes, role, sizes)
    backend = rdzv_endpoints.backend_name(ns.rdzv_backend)
    run_id = ns.rdzv_id
    if not run_id or run_id == "none":
        raise ConfigError("--rdzv-id: must be set and not 'none' (jobs would share state)")
    last_call = _number("--rdzv-last-call", float, 0.0, MAX_SECONDS)(ns.last_call)
    # inf: wait for the minimum forever (SIGTERM still ends the wait at once).
    join_timeout = _number("--rdzv-join-timeout", float, 0.1, MAX_SECONDS, inf_ok=True)(
        ns.join_timeout
    )
    heartbeat = _number("--heartbeat-interval", float, 0.01, 60.0)(ns.heartbeat_interval)
    liveness = _number("--liveness-timeout", float, 0.05, 3600.0)(ns.liveness_timeout)
    if liveness <= 2 * heartbeat:
        raise ConfigError("--liveness-timeout: must exceed twice --heartbeat-interval")
    if ns.prewarm not in ("auto", "off"):
        raise ConfigError(f"--prewarm: expected auto|off, got {ns.prewarm!r}")
    if ns.node_check not in ("on", "off"):
        raise ConfigError(f"--node-check: expected on|off, got {ns.node_check!r}")
    if ns.standby_file and not ns.standby_file.strip():
        raise ConfigError(f"--standby-file: expected a path, got {ns.standby_file!r}")
    return AgentConfig(
        min_nodes=lo,
        max_nodes=hi,
        nproc_spec=check_nproc(ns.nproc_per_node),
        rdzv_backend=backend,
        endpoints=rdzv_endpoints.parse_endpoints(ns.rdzv_endpoint, backend),
        run_id=run_id,
        last_call=last_call,
        join_timeout=join_timeout,
        max_restarts=_number("--max-restarts", int, 0, 1_000_000)(ns.max_restarts),
        monitor_interval=_number("--monitor-interval", float, 0.01, 60.0)(ns.monitor_interval),
        health_port=_number("--health-port", int, 0, 65535)(ns.health_port),
        health_host=ns.health_host,
        node_addr=ns.node_addr,
        termination_grace=_number("--termination-grace", float, 0.0, MAX_SECONDS)(
            ns.termination_grace
        ),
        stop_grace=_number("--stop-grace", float, 0.0, 3600.0)(ns.stop_grace),
        heartbeat_interval=heartbeat,
        liveness_timeout=liveness,
        tls_dir=ns.tls_dir or None,
        command=tuple(command),
        prewarm=ns.prewarm == "auto",
        standby_file=ns.standby_file or None,
        teardown_grace=_number("--teardown-grace", float, 0.0, MAX_SECONDS)(ns.teardown_grace),
        completion_grace=_number("--completion-grace", float, 1.0, MAX_SECONDS)(
            ns.completion_grace
        ),
        hang_timeout=parse_hang_timeout(ns.hang_timeout),
        node_check=ns.node_check == "on",
        role=role,
        coupling=coupling,
        role_sizes=sizes,
        job_scoped_roles=job_scoped,
    )


def parse_roles(role: str, coupling: str, sizes: str) -> tuple[str, Coupling, tuple[RoleSize, ...]]:
    """``--role``, ``--coupling`` and ``--role-sizes``, checked together."""
    role = role.strip() or DEFAULT_ROLE
    if role != DEFAULT_ROLE:
        problem = role_name_problem(role)
        if problem is not None:
            raise ConfigError(f"--role: {problem}")
    by_name = {c.value.lower(): c for c in Coupling}
    got = by_name.get(coupling.strip().lower() or Coupling.INDEPENDENT.value.lower())
    if got is None:
        raise ConfigError(f"--coupling: expected Independent|Joint, got {coupling!r}")
    try:
        parsed = parse_role_sizes(sizes) if sizes.strip() else ()
    except RoleSizesError as exc:
        raise ConfigError(f"--role-sizes: {exc}") from None
    names = [s.name for s in parsed]
    if parsed and role not in names:
        raise ConfigError(
            f"--role: {role!r} is not one of the roles in --role-sizes ({', '.join(names)})"
        )
    if got is Coupling.JOINT and not parsed:
        raise ConfigError("--coupling: Joint needs --role and --role-sizes (every role's range)")
    return role, got, parsed


def parse_job_scoped_roles(
    text: str, coupling: Coupling, sizes: tuple[RoleSize, ...]
) -> tuple[str, ...]:
    """``--job-scoped-roles``: names of ``--role-sizes``, Independent coupling only (a
    Joint group re-forms every role on any failure already)."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        return ()
    if coupling is Coupling.JOINT:
        raise ConfigError(
            "--job-scoped-roles: not read with --coupling Joint (one group: any failure "
            "re-forms every role already); drop the flag"
        )
    known = [s.name for s in sizes]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"--job-scoped-roles: {', '.join(unknown)} not among the roles of --role-sizes "
            f"({', '.join(known) or 'none given'})"
        )
    return names


def role_nnodes(text: str, role: str, sizes: tuple[RoleSize, ...]) -> tuple[int, int]:
    """This agent's ``--nnodes`` range: the flag's, else its role's in ``--role-sizes``, else 1.

    Both given must agree: the operator writes the role's range into both.
    """
    mine = next((s for s in sizes if s.name == role), None)
    if not text.strip():
        return (mine.min_nodes, mine.max_nodes) if mine is not None else (1, 1)
    lo, hi = parse_nnodes(text)
    if mine is not None and (lo, hi) != (mine.min_nodes, mine.max_nodes):
        raise ConfigError(
            f"--nnodes: {text!r} disagrees with role {role!r} in --role-sizes "
            f"({mine.min_nodes}:{mine.max_nodes})"
        )
    return lo, hi


def parse_hang_timeout(text: str) -> float | None:
    """``auto`` (None: derived), 0 (off) or 10 s to a day."""
    if text.strip().lower() == "auto":
        return None
    value = _number("--hang-timeout", float, 0.0, float(tfenv.MAX_HANG_TIMEOUT_S))(text)
    if 0 < value < MIN_HANG_TIMEOUT_S:
        raise ConfigError(
            f"--hang-timeout: must be 0 (off), 'auto' or at least {_plain(MIN_HANG_TIMEOUT_S)} "
            f"seconds, got {text!r}"
        )
    return value


def resolve_nproc(spec: str, gpu_limit: str | None, cuda_count: Callable[[], int]) -> int:
    """Workers per node: one per GPU when GPUs are visible, else 1 on CPU.

    ``cpu`` and ``auto`` without GPUs give 1 rather than torchrun's
    ``os.cpu_count()``: in a container that is the host's core count, not
    the pod's CPU limit, and one process using intra-op threads is the
    better default for CPU training.
    """
    if spec.isdigit():
        return int(spec)
    if spec == "cpu":
        return 1
    gpus = 0
    if gpu_limit:
        try:
            gpus = int(gpu_limit)
        except ValueError:
            raise ConfigError(f"{tfenv.GPU_LIMIT}: not an integer: {gpu_limit!r}") from None
    else:
        gpus = cuda_count()
    if gpus > MAX_NPROC:
        raise ConfigError(f"{tfenv.GPU_LIMIT}: {gpus} GPUs is above {MAX_NPROC} workers per node")
    if gpus > 0:
        return gpus
    if spec == "gpu":
        raise ConfigError("--nproc-per-node: 'gpu' requested but no GPU is visible")
    return 1
