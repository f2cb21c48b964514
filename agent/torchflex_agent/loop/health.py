"""The agent's HTTP endpoint and its final report.

Where it sits: the agent serves ``GET /healthz`` (liveness probe: the agent
loop is alive) and ``GET /status`` (``AgentReport`` JSON, read by the
operator) from a stdlib ``ThreadingHTTPServer`` thread, and writes the final
report to the container's termination-message file when it exits.

``GET /status?after=R&wait=S`` is a long poll (``progress.StatusQuery``):
the request thread waits on the agent's ``ReportBoard`` until the round is
no longer ``R`` or the agent is ending, at most ``S`` seconds. The operator
holds one per job instead of polling every pod, and sees a re-formed group
(``kubectl scale``) as soon as it forms. Agents have no API credentials, so
the operator pulls; a held request costs one idle thread here.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from torchflex_contract import env as tfenv
from torchflex_contract.progress import (
    ENDING_STATES,
    HEALTH_PATH,
    TERMINATION_LOG,
    AgentReport,
    parse_status_target,
    termination_text,
)

log = logging.getLogger(__name__)

WaitFn = Callable[[int, float], AgentReport]
"""``wait(after, seconds)``: the report once its round is not ``after`` (or it is
ending), or the current one after ``seconds``."""


class ReportBoard:
    """The agent's current report, and a way to wait for its round to change."""

    def __init__(self, report: AgentReport) -> None:
        self._cond = threading.Condition()
        self._report = report

    def get(self) -> AgentReport:
        with self._cond:
            return self._report

    def replace(self, change: Callable[[AgentReport], AgentReport]) -> None:
        with self._cond:
            self._report = change(self._report)
            self._cond.notify_all()

    def wait_round(self, after: int, timeout: float) -> AgentReport:
        """Block until the round is not ``after`` or the agent is ending, at most ``timeout``."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._report.round != after or self._report.state in ENDING_STATES,
                timeout=max(0.0, timeout),
            )
            return self._report


class HealthServer:
    """Serves the current report; ``report`` is called per request.

    ``wait`` serves long polls; without it ``after`` is ignored (answered at once).
    """

    def __init__(
        self,
        host: str,
        port: int,
        report: Callable[[], AgentReport],
        wait: WaitFn | None = None,
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    query = parse_status_target(self.path)
                except ValueError as exc:
                    self.send_error(400, str(exc))
                    return
                if self.path == HEALTH_PATH:
                    body, ctype = b"ok\n", "text/plain"
                elif query is not None:
                    if query.after is not None and wait is not None:
                        current = wait(query.after, query.wait)
                    else:
                        current = report()
                    body, ctype = current.to_json().encode(), "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the training log

        self._server = _QuietServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="http")

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _QuietServer(ThreadingHTTPServer):
    """Drops a client that went away without a traceback.

    A probe that timed out while this process was paused (SIGSTOP, a busy
    node) has closed its socket by the time the reply is written; that is
    the prober's business, not an error of the agent's.
    """

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # BrokenPipe, ConnectionReset, ...
            log.debug("health client %s went away: %s", client_address, exc)
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


def termination_log_path(environ: Mapping[str, str]) -> Path | None:
    """Where to write the final report: the env override, else Kubernetes' file if present."""
    override = environ.get(tfenv.TERMINATION_LOG)
    if override:
        return Path(override)
    default = Path(TERMINATION_LOG)
    # Outside Kubernetes /dev/termination-log does not exist; never create it there.
    return default if default.exists() else None


def write_termination_log(report: AgentReport, environ: Mapping[str, str] | None = None) -> None:
    path = termination_log_path(os.environ if environ is None else environ)
    if path is None:
        return
    text = termination_text(report)  # the root cause's frames give way first
    try:
        path.write_text(text)
    except OSError as exc:
        log.warning("cannot write termination log %s: %s", path, exc)
