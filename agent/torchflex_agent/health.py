"""The agent's HTTP endpoint and its final report.

Where it sits: the agent serves ``GET /healthz`` (liveness probe: the agent
loop is alive) and ``GET /status`` (``AgentReport`` JSON, read by the
operator) from a stdlib ``ThreadingHTTPServer`` thread, and writes the final
report to the container's termination-message file when it exits.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from torchflex_contract import env as tfenv
from torchflex_contract.progress import (
    HEALTH_PATH,
    MAX_TERMINATION_MESSAGE,
    STATUS_PATH,
    TERMINATION_LOG,
    AgentReport,
)

log = logging.getLogger(__name__)


class HealthServer:
    """Serves the current report; ``report`` is called per request."""

    def __init__(self, host: str, port: int, report: Callable[[], AgentReport]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == HEALTH_PATH:
                    body, ctype = b"ok\n", "text/plain"
                elif self.path == STATUS_PATH:
                    body, ctype = report().to_json().encode(), "application/json"
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
    text = report.to_json()
    message = report.message
    for _ in range(32):
        if len(text) <= MAX_TERMINATION_MESSAGE or not message:
            break
        # Trim the free-text message (keeping its head), never the JSON
        # structure; escaping makes the JSON longer than the text, so scale.
        keep = int(len(message) * (MAX_TERMINATION_MESSAGE - 64) / len(text))
        message = message[: max(0, min(keep, len(message) - 1))]
        text = dataclasses.replace(report, message=message).to_json()
    try:
        path.write_text(text)
    except OSError as exc:
        log.warning("cannot write termination log %s: %s", path, exc)
