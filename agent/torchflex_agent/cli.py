"""``torchflex-agent`` entry point: parse flags, open the backend's store, run the agent.

Where it sits: the console script (``pyproject.toml``) calls ``main``. Three
modes: ``torchflex-agent store`` serves the per-job TCPStore
(``stores.server``); a command starting with ``torchrun`` is exec'd as is
(compatibility: stock torchrun behaviour); anything else runs an
``loop.agent.ElasticAgent`` and exits with its ``ExitCode``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from torchflex_agent import pid1
from torchflex_agent.errors import ConfigError, StoreUnavailableError
from torchflex_agent.loop.logic.config import AgentConfig, parse_args, resolve_nproc
from torchflex_agent.stores import registry as backends
from torchflex_contract import env as tfenv
from torchflex_contract.exit_codes import ExitCode

if TYPE_CHECKING:
    from torchflex_agent.workers.prewarm import ForkServer

log = logging.getLogger("torchflex_agent")

USAGE_HINT = "usage: torchflex-agent [options] -- <training command...>  (torchflex-agent --help)"


def _cuda_count() -> int:
    import torch

    return int(torch.cuda.device_count())


def _usage_error(message: str) -> int:
    print(f"torchflex-agent: error: {message}", file=sys.stderr)
    print(USAGE_HINT, file=sys.stderr)
    return int(ExitCode.USAGE)


def _run_agent(config: AgentConfig, environ: Mapping[str, str]) -> int:
    # The fork server first: its imports (torch, 1.5-3 s) are the longest part
    # of a new node's start and run beside ours, which are its slower half
    # otherwise: the agent's modules (~50 ms) and, with --nproc-per-node auto
    # and no GPU limit, torch itself to count GPUs (~0.8 s on the dev box).
    from torchflex_agent.workers.group import start_fork_server

    fork = start_fork_server(config.command, environ) if config.prewarm else None
    try:
        return _run_with(config, environ, fork)
    finally:
        if fork is not None:
            fork.close()


def _run_with(config: AgentConfig, environ: Mapping[str, str], fork: ForkServer | None) -> int:
    from torchflex_agent.loop.agent import ElasticAgent
    from torchflex_agent.loop.health import HealthServer

    try:
        nproc = resolve_nproc(config.nproc_spec, environ.get(tfenv.GPU_LIMIT), _cuda_count)
    except ConfigError as exc:
        return _usage_error(str(exc))
    connect = backends.backend(config.rdzv_backend).opener(config.endpoints, config.tls_dir)
    agent = ElasticAgent(config, connect, nproc, environ, fork=fork)

    def on_term(signum: int, frame: FrameType | None) -> None:
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    health = None
    if config.health_port:
        try:
            health = HealthServer(
                config.health_host, config.health_port, agent.report, agent.wait_round
            )
        except OSError as exc:
            return _usage_error(f"--health-port {config.health_port}: {exc}")
        health.start()
    try:
        return agent.run()
    except StoreUnavailableError as exc:
        log.error("rendezvous store unavailable: %s", exc)
        return int(ExitCode.INFRA_ERROR)
    finally:
        if health is not None:
            health.stop()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # A container's PID 1 must reap orphans; the agent's own waits must not race it.
    pid1.become_init_if_pid1()
    if args and args[0] == "store":
        logging.basicConfig(level=logging.INFO, format="[torchflex-store] %(message)s")
        from torchflex_agent.stores.server import main as store_main

        return store_main(args[1:])
    command = args[args.index("--") + 1 :] if "--" in args else []
    if command and os.path.basename(command[0]) == "torchrun":
        # Compatibility mode: the user asked for stock torchrun; get out of the way.
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"torchflex-agent: error: cannot run {command[0]!r}: {exc}", file=sys.stderr)
            return int(ExitCode.BAD_COMMAND)
    environ = dict(os.environ)
    try:
        config = parse_args(args, environ)
    except ConfigError as exc:
        return _usage_error(str(exc))
    # c10d logs every failed connect attempt with a C++ stack; our own
    # messages say what matters. Workers get the user's original setting.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    logging.basicConfig(
        level=logging.INFO,
        format="[torchflex-agent] %(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    _exit_after_run(_run_agent(config, environ))
    return 0  # not reached


def _exit_after_run(code: int) -> NoReturn:
    """Leave without Python's interpreter teardown once the agent has finished.

    Everything that matters is already done (workers stopped, the report
    written, the rendezvous left); what teardown would add is destroying
    torch C++ objects (store servers and clients) from the finalizer while
    their native threads may still be joinable, which aborts the process
    ("terminate called without an active exception", exit 134) and turns a
    clean exit into a counted failure. So flush and ``_exit`` with our code.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
