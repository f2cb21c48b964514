"""One keep-alive HTTP/1.1 connection to etcd's JSON gateway, and one-shot watches.

Where it sits: ``stores.etcd.EtcdKVStore`` sends its unary requests (range,
put, txn) and its waits' watches through a ``GatewayConnection``; ``etcd3gw``
only picks the endpoint (its status call). The reason is CPU: a request
through etcd3gw's ``requests`` session costs about 0.5 ms of client CPU on
this project's machines, through ``http.client`` about 0.1 ms (a wait's
watch 2.3 ms against 0.65 ms), and N agents joining at once on a small node
are bound by exactly that (``benchmarks.rendezvous``).

Errors are typed: ``GatewayError`` for anything that leaves the request
without an answer (transport, HTTP status, unreadable body), its subclass
``RevisionCompactedError`` for etcd's "required revision has been compacted"
(gRPC OUT_OF_RANGE), which a caller reading at an old revision can recover
from.
"""

from __future__ import annotations

import base64
import http.client
import json
import select
import ssl
import time
from typing import Any, cast

# gRPC status code etcd answers for a read at a compacted revision.
_GRPC_OUT_OF_RANGE = 11


class GatewayError(Exception):
    """The request got no usable answer; ``str()`` says why in a few words."""


class RevisionCompactedError(GatewayError):
    """The revision read at is older than etcd's compaction point."""


class GatewayConnection:
    """A connection to ``protocol://host:port`` under ``api_path`` (e.g. ``/v3/``).

    Serves one thread at a time, like every ``KVStore`` connection. It opens
    on first use and again after the server closed it while idle; a request
    that fails mid-way closes it, so the next one starts clean.
    """

    def __init__(
        self,
        protocol: str,
        host: str,
        port: int,
        api_path: str,
        *,
        timeout: float,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        """``tls``: (ca, cert, key) file paths, for ``https``."""
        self._api_path = "/" + api_path.strip("/") + "/"
        self._address = (host, port)
        self._timeout = timeout
        self._context: ssl.SSLContext | None = None
        if protocol == "https":
            self._context = ssl.create_default_context(cafile=tls[0] if tls else None)
            if tls is not None:
                self._context.load_cert_chain(tls[1], tls[2])
        self._conn = self._new_connection(timeout)

    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        host, port = self._address
        if self._context is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _drop_if_closed_by_peer(self) -> None:
        # An idle keep-alive socket that reads as ready has been closed (or
        # answered out of turn): sending on it would fail half-way.
        sock = self._conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self._conn.close()

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` as JSON to ``api_path + path``; the decoded JSON reply."""
        body = json.dumps(payload)
        try:
            self._drop_if_closed_by_peer()
            self._conn.request(
                "POST",
                self._api_path + path.lstrip("/"),
                body,
                {"Content-Type": "application/json"},
            )
            response = self._conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise GatewayError(f"{type(exc).__name__}: {exc}") from exc
        try:
            data = json.loads(raw) if raw else {}
        except ValueError as exc:
            self._conn.close()
            raise GatewayError(f"unreadable reply (HTTP {response.status})") from exc
        if not isinstance(data, dict):
            raise GatewayError(f"HTTP {response.status}, not a JSON object: {raw[:200]!r}")
        if response.status != 200:
            message = str(data.get("message") or data.get("error") or raw[:200])
            if data.get("code") == _GRPC_OUT_OF_RANGE:
                raise RevisionCompactedError(message)
            raise GatewayError(f"HTTP {response.status}: {message}")
        return cast(dict[str, Any], data)

    def watch_once(
        self, key: str, range_end: str | None, start_revision: int, timeout: float
    ) -> bool:
        """Watch ``key`` (to ``range_end``) from ``start_revision``: True at the first event
        (or a watch etcd cancelled, e.g. compacted: read again), False after ``timeout``.

        One short-lived stream on a connection of its own, read on the
        caller's thread (etcd3gw's watch costs a thread pool and about 2 ms
        of CPU; this about a tenth of that).
        """
        deadline = time.monotonic() + timeout
        request: dict[str, Any] = {"key": _b64(key), "start_revision": start_revision}
        if range_end is not None:
            request["range_end"] = _b64(range_end)
        conn = self._new_connection(max(timeout, 0.001))
        try:
            conn.request(
                "POST",
                self._api_path + "watch",
                json.dumps({"create_request": request}),
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            if response.status != 200:
                raise GatewayError(f"watch: HTTP {response.status}: {response.read(200)!r}")
            while (left := deadline - time.monotonic()) > 0:
                if conn.sock is not None:
                    conn.sock.settimeout(left)
                line = response.readline()
                if not line:
                    raise GatewayError("watch stream ended")
                if not line.strip():
                    continue
                result = json.loads(line).get("result", {})
                if result.get("events") or result.get("canceled"):
                    return True
            return False
        except TimeoutError:
            return False
        except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
            raise GatewayError(f"watch: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()

    def close(self) -> None:
        self._conn.close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")
