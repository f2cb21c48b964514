"""A counting pass-through proxy between the operator and the API server (loopback).

Where it sits: ``benchmarks.operator_scale`` runs it as its own process
(``python -m benchmarks._scale_proxy ADMIN_KUBECONFIG PORT LOG``) and gives
the operator a kubeconfig that points at ``http://127.0.0.1:PORT``. Every
request is forwarded to the cluster's API server (as the admin user, with
the client certificate of ``ADMIN_KUBECONFIG``), responses (watches
included) are streamed back unchanged, and one line ``<monotonic time>
<METHOD> <path?query>`` per request is appended to ``LOG``. The API server's
own ``/metrics`` carries no per-client label, and its audit log is not
enabled on the local control plane, so this is how requests are attributed
to the operator alone. Only the API server of the kubeconfig is dialled.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

# Hop-by-hop headers, and the ones the proxy sets itself.
_DROP = {
    "host",
    "authorization",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
    "upgrade",
}


def upstream(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The API server URL and a TLS context with the admin client certificate."""
    cfg: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    ctx_name = cfg["current-context"]
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    tls.load_cert_chain(user["client-certificate"], user["client-key"])
    return str(cluster["server"]).rstrip("/"), tls


def make_app(server: str, tls: ssl.SSLContext, log: Path) -> web.Application:
    log_fh = log.open("a", buffering=1)
    session: ClientSession | None = None

    async def forward(request: web.Request) -> web.StreamResponse:
        nonlocal session
        if session is None:
            session = ClientSession(
                connector=TCPConnector(ssl=tls, limit=0),
                timeout=ClientTimeout(total=None, sock_connect=30),
                auto_decompress=False,
            )
        log_fh.write(f"{time.monotonic():.6f} {request.method} {request.path_qs}\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        body = await request.read()
        async with session.request(
            request.method,
            server + request.path_qs,
            headers=headers,
            data=body if body else None,
            allow_redirects=False,
            # The kubernetes client may send no Content-Type (the API server
            # then assumes JSON); aiohttp would add application/octet-stream.
            skip_auto_headers=("Content-Type", "User-Agent"),
        ) as up:
            out = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _DROP:
                    out.headers[k] = v
            if up.headers.get("Content-Length") is not None:
                out.content_length = int(up.headers["Content-Length"])
            await out.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except (ConnectionResetError, asyncio.CancelledError):
                pass
            return out

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main(argv: list[str]) -> int:
    kubeconfig, port, log = Path(argv[0]), int(argv[1]), Path(argv[2])
    server, tls = upstream(kubeconfig)
    print(f"proxy: 127.0.0.1:{port} -> {server}", flush=True)
    web.run_app(
        make_app(server, tls, log), host="127.0.0.1", port=port, print=None, access_log=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
