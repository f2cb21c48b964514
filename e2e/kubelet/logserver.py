"""The kubelet's container-log endpoint, so ``kubectl logs [-f]`` works here.

Where it sits: ``agent.Kubelet.run`` starts one :class:`LogServer` per node
on the node's InternalIP (127.10.<slot>.<n>) at :data:`KUBELET_PORT`, the
port the node registers in ``status.daemonEndpoints``. The API server
proxies ``kubectl logs`` to ``GET /containerLogs/<ns>/<pod>/<container>``
over TLS: it checks our serving certificate against the cluster CA
(``--kubelet-certificate-authority``) and we accept only its own
kubelet-client certificate (``apiserver-kubelet-client``), as a kubelet with
webhook authentication would for that identity. Nothing else is served.

Supported query parameters: ``follow``, ``tailLines``, ``limitBytes``.
``previous`` is refused: a container's runs share one log file here (the
e2e log readers want the whole history), so there is no separate previous
log to give.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import socketserver
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

KUBELET_PORT = 10250
# The API server's identity when it proxies logs (see e2e/cluster/pki.py).
APISERVER_CLIENT_CN = "kube-apiserver-kubelet-client"
FOLLOW_POLL_S = 0.2
_PATH = re.compile(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)$")

# (namespace, pod, container) -> (log file, is the container running now).
# None when the kubelet has no such container.
LogLookup = Callable[[str, str, str], "tuple[Path, bool] | None"]


def tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of ``path`` begin."""
    data = path.read_bytes()
    if lines <= 0:
        return len(data)
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    pos = end
    for _ in range(lines):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        # Quiet: every kubectl logs would otherwise print a line.
        return

    def _peer_is_apiserver(self) -> bool:
        conn = self.connection
        cert = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
        if not cert:
            return False
        for rdn in cert.get("subject", ()):
            for attr in rdn:
                if tuple(attr) == ("commonName", APISERVER_CLIENT_CN):
                    return True
        return False

    def _error(self, code: int, text: str) -> None:
        body = text.encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if not self._peer_is_apiserver():
            self._error(403, "only the API server's kubelet-client identity may read logs")
            return
        url = urllib.parse.urlsplit(self.path)
        match = _PATH.match(url.path)
        if match is None:
            self._error(404, f"not served here: {url.path}")
            return
        query = urllib.parse.parse_qs(url.query)

        def flag(name: str) -> bool:
            return query.get(name, ["false"])[-1].lower() in ("true", "1")

        def number(name: str) -> int | None:
            raw = query.get(name, [""])[-1]
            return int(raw) if raw.lstrip("-").isdigit() else None

        if flag("previous"):
            self._error(400, "previous logs are not kept apart by the process kubelet")
            return
        ns, pod, container = (urllib.parse.unquote(g) for g in match.groups())
        found = self.server.lookup(ns, pod, container)
        if found is None:
            self._error(404, f"container {container!r} of pod {ns}/{pod} is not on this node")
            return
        path, _ = found
        tail, limit = number("tailLines"), number("limitBytes")
        offset = tail_offset(path, tail) if tail is not None and path.exists() else 0
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        # No length: the body ends when the connection closes (follow streams).
        self.send_header("Connection", "close")
        self.end_headers()
        self._stream(
            ns=ns,
            pod=pod,
            container=container,
            path=path,
            offset=offset,
            follow=flag("follow"),
            limit=limit,
        )

    def _stream(
        self,
        *,
        ns: str,
        pod: str,
        container: str,
        path: Path,
        offset: int,
        follow: bool,
        limit: int | None,
    ) -> None:
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            while True:
                chunk = b""
                if path.exists():
                    with path.open("rb") as fh:
                        fh.seek(offset)
                        chunk = fh.read(1 << 16)
                if limit is not None:
                    chunk = chunk[: max(0, limit - sent)]
                if chunk:
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    offset += len(chunk)
                    sent += len(chunk)
                    if limit is not None and sent >= limit:
                        return
                    continue
                # Drained. Without follow that is the answer; with it, the
                # stream ends when the container stops (as a kubelet's
                # does), the pod goes away, the client leaves (a write
                # fails) or the kubelet stops.
                if not follow or self.server.stop.is_set():
                    return
                current = self.server.lookup(ns, pod, container)
                if current is None or not current[1] or current[0] != path:
                    return
                time.sleep(FOLLOW_POLL_S)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    lookup: LogLookup
    stop: threading.Event


def tls_context(pki: Path) -> ssl.SSLContext:
    """Serve with the kubelet serving certificate; require a client certificate
    from the cluster CA (the identity is checked per request)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(pki / "kubelet-serving.crt"), str(pki / "kubelet-serving.key"))
    ctx.load_verify_locations(cafile=str(pki / "ca.crt"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class LogServer:
    def __init__(
        self, ip: str, port: int, ctx: ssl.SSLContext, lookup: LogLookup, stop: threading.Event
    ) -> None:
        self.server = _Server((ip, port), _Handler, bind_and_activate=False)
        self.server.lookup, self.server.stop = lookup, stop
        self.server.allow_reuse_address = True
        self.server.server_bind()
        self.server.server_activate()
        # Handshakes happen in the per-request thread (first read), so a slow
        # client never holds up accept.
        self.server.socket = ctx.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )

    def serve_in_thread(self) -> None:
        threading.Thread(target=self.server.serve_forever, args=(0.5,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(nodes: dict[str, str], pki: Path, lookup: LogLookup, stop: threading.Event) -> None:
    """One server per node (name -> InternalIP), each in its own thread."""
    ctx = tls_context(pki)
    for node, ip in nodes.items():
        try:
            server = LogServer(ip, KUBELET_PORT, ctx, lookup, stop)
        except OSError as exc:
            # Pods still run; only kubectl logs for this node fails.
            print(f"[process-kubelet] no log endpoint for {node} on {ip}: {exc}", flush=True)
            continue
        server.serve_in_thread()


def newest_log(pods_dir: Path, ns: str, pod: str, container: str) -> Path | None:
    """The log of the newest pod directory of that name (``<ns>_<pod>_<uid>``)."""
    dirs = sorted(pods_dir.glob(f"{ns}_{pod}_*"), key=lambda d: d.stat().st_mtime)
    for pod_dir in reversed(dirs):
        path = pod_dir / f"{container}.log"
        if path.exists():
            return path
    return None
