"""The etcd gateway connection (``etcd_http``) against a real etcd on 127.0.0.1.

What the kvstore contract cannot show: a read at a compacted revision is
the typed ``RevisionCompactedError`` (``take_ticket`` recovers from it), any
other refusal a plain ``GatewayError``, and the connection keeps serving
after both.
"""

from __future__ import annotations

import base64
import uuid

import pytest

from e2e.localproc import free_port
from torchflex_agent.stores.etcd_http import GatewayConnection, GatewayError, RevisionCompactedError


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.timeout(60)
def test_compacted_revision_is_typed_and_the_connection_stays_usable(etcd_server: int) -> None:
    conn = GatewayConnection("http", "127.0.0.1", etcd_server, "/v3/", timeout=10.0)
    key = _b64(f"/etcd-http/{uuid.uuid4().hex}")
    first = int(conn.post("/kv/put", {"key": key, "value": _b64("1")})["header"]["revision"])
    latest = int(conn.post("/kv/put", {"key": key, "value": _b64("2")})["header"]["revision"])
    conn.post("/kv/compaction", {"revision": latest})
    with pytest.raises(RevisionCompactedError):
        conn.post("/kv/range", {"key": key, "revision": first})
    with pytest.raises(GatewayError, match="HTTP 4") as refused:
        conn.post("/kv/range", {"key": "not base64 at all!"})
    assert not isinstance(refused.value, RevisionCompactedError)
    kvs = conn.post("/kv/range", {"key": key})["kvs"]
    assert base64.b64decode(kvs[0]["value"]) == b"2"
    conn.close()
    # Closed: the next request opens a new connection.
    assert conn.post("/kv/range", {"key": key})["kvs"][0]["key"] == key


@pytest.mark.timeout(60)
def test_unreachable_endpoint_is_a_gateway_error() -> None:
    conn = GatewayConnection("http", "127.0.0.1", free_port(), "/v3/", timeout=2.0)
    with pytest.raises(GatewayError, match=r"Connection refused|ConnectionRefused"):
        conn.post("/kv/range", {"key": _b64("k")})
