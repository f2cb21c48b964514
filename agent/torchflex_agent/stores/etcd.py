"""``KVStore`` over etcd v3 through its grpc-gateway JSON API (``--rdzv-backend etcd``).

Where it sits: an alternative to the TCPStore backend for clusters that
already run etcd (or where the store must survive restarts: etcd persists,
a TCPStore pod does not). HTTP/JSON, no grpc wheels: ``etcd3gw`` finds a
reachable endpoint, ``stores.etcd_http`` carries the requests and watches.
``compare_set`` is one transaction, ``take_ticket`` one put of a key of
the taker's own and a count at its revision (its number is its rank by
revision: no contention, which is what makes a 64-agent rendezvous fast),
``add`` is a bounded compare-and-swap loop on the key's ``mod_revision`` (a
lost race returns the winner's value and revision in the same reply, so a
retry costs one request, not two, and retries back off with jitter so N
contending agents do not collide in lock-step), ``get_many`` is one
read-only transaction (a range for a parent's children), and ``wait`` is one
``get_many`` then one watch over the span of the keys still missing, started
at the revision right after that read, so a write landing between the read
and the watch is never lost.
"""

from __future__ import annotations

import base64
import random
import re
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from typing import Any

import etcd3gw
from etcd3gw import exceptions as etcd_exc

from torchflex_agent.errors import StoreUnavailableError
from torchflex_agent.stores.etcd_http import GatewayConnection, GatewayError, RevisionCompactedError

_MAX_ADD_ATTEMPTS = 200
_ADD_BACKOFF_S = 0.002
_ADD_BACKOFF_MAX_S = 0.05
# etcd's default ``--max-txn-ops``: the most point reads one transaction may carry.
_MAX_TXN_OPS = 128
# From this many keys of one parent on, ``get_many`` reads the parent's range
# (the rendezvous asks for all of a round's descriptors, which are all of
# ``node/``'s children) instead of one point read per key.
_SIBLING_RANGE = 8


def _ticket_prefix(key: str) -> str:
    """Where the tickets of ``key`` live: one key each, below ``key/tickets/``."""
    return key.rstrip("/") + "/tickets/"


def _prefix_range(prefix: str) -> dict[str, str]:
    """The range request fields that select every key starting with ``prefix``."""
    raw = prefix.encode()
    return {"key": _b64(raw), "range_end": _b64(raw[:-1] + bytes([raw[-1] + 1]))}


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def etcd_cause(exc: BaseException) -> str:
    """The real reason of an etcd3gw error in a few words.

    etcd3gw raises ``ConnectionFailedError(str(requests_error))`` with no
    ``args``, so ``str(exc)`` is empty and the text sits in ``detail_text``:
    a long urllib3 chain whose errno part (``[Errno 111] Connection
    refused``) or timeout is what a reader needs.
    """
    text = str(exc) or str(getattr(exc, "detail_text", "") or "")
    m = _ERRNO.search(text)
    if m:
        return m.group(0).strip()
    if "timed out" in text.lower():
        return f"timed out ({type(exc).__name__})"
    return text[:200] or type(exc).__name__


def _header_revision(result: dict[str, Any]) -> int:
    return int(result.get("header", {}).get("revision", 0))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class EtcdKVStore:
    """A client of one etcd endpoint (the first reachable one of a list)."""

    # Each wait opens a watch stream (an HTTP request of its own); 64
    # joiners re-waiting every 0.5 s took 5 s to rendezvous, with 2 s slices
    # 1.7 s (benchmarks.rendezvous, with etcd3gw's costlier watcher).
    wait_slice = 2.0

    def __init__(
        self,
        endpoints: Sequence[tuple[str, str, int]],
        request_timeout: float = 10.0,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        """``stores.logic``: (protocol, host, port); ``tls``: (ca, cert, key) file paths."""
        if not endpoints:
            raise ValueError("etcd backend needs at least one endpoint")
        self._endpoints = list(endpoints)
        self._timeout = request_timeout
        self._tls = tls
        self._client, self._http = self._connect()

    def _connect(self) -> tuple[etcd3gw.Etcd3Client, GatewayConnection]:
        causes = []
        for protocol, host, port in self._endpoints:
            kwargs: dict[str, Any] = {}
            if self._tls is not None:
                kwargs = {
                    "ca_cert": self._tls[0],
                    "cert_cert": self._tls[1],
                    "cert_key": self._tls[2],
                }
            client = etcd3gw.Etcd3Client(
                host=host, port=port, protocol=protocol, timeout=self._timeout, **kwargs
            )
            try:
                client.status()
            except (etcd_exc.Etcd3Exception, OSError) as exc:
                causes.append(f"{protocol}://{host}:{port}: {etcd_cause(exc)}")
                continue
            api_path = urllib.parse.urlsplit(client.get_url("")).path
            http = GatewayConnection(
                protocol, host, port, api_path, timeout=self._timeout, tls=self._tls
            )
            return client, http
        raise StoreUnavailableError(f"no etcd endpoint reachable: {'; '.join(causes)}")

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._http.post(path, payload)
        except GatewayError as exc:
            raise StoreUnavailableError(f"etcd {path}: {exc}") from exc

    def _range(self, key: str) -> tuple[bytes | None, int, int]:
        """(value, mod_revision, header revision) of ``key``."""
        result = self._post("/kv/range", {"key": _b64(key.encode())})
        revision = _header_revision(result)
        kvs = result.get("kvs") or []
        if not kvs:
            return None, 0, revision
        kv = kvs[0]
        return _unb64(kv.get("value", "")), int(kv.get("mod_revision", 0)), revision

    def get(self, key: str) -> bytes | None:
        return self._range(key)[0]

    def _range_many(self, keys: list[str]) -> tuple[list[bytes | None], int]:
        """(values of ``keys`` in order, None where absent; a revision they were read at).

        One read-only transaction: ``_SIBLING_RANGE`` or more siblings (keys
        with one parent, like a round's ``node/<i>`` descriptors) are one
        range over that parent, other keys one point read each (a range over
        a round's closed and stale keys would carry all its descriptors);
        more than ``_MAX_TXN_OPS`` of those take one transaction per batch.
        The revision is the oldest batch's, so a watch started right after it
        misses no write to any key.
        """
        if len(keys) == 1:
            value, _mod, revision = self._range(keys[0])
            return [value], revision
        by_parent: dict[str, list[str]] = {}
        for key in keys:
            by_parent.setdefault(key.rpartition("/")[0], []).append(key)
        ops: list[dict[str, Any]] = []
        for parent, children in by_parent.items():
            if parent and len(children) >= _SIBLING_RANGE:
                ops.append({"request_range": _prefix_range(parent + "/")})
            else:
                ops += [{"request_range": {"key": _b64(k.encode())}} for k in children]
        found: dict[str, bytes] = {}
        revisions = []
        for start in range(0, len(ops), _MAX_TXN_OPS):
            result = self._post("/kv/txn", {"success": ops[start : start + _MAX_TXN_OPS]})
            revisions.append(_header_revision(result))
            for response in result.get("responses") or []:
                for kv in response.get("response_range", {}).get("kvs") or []:
                    name = _unb64(kv.get("key", "")).decode(errors="replace")
                    found[name] = _unb64(kv.get("value", ""))
        return [found.get(k) for k in keys], min(revisions)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        names = list(keys)
        return self._range_many(names)[0] if names else []

    def set(self, key: str, value: bytes) -> None:
        self._post("/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})

    def _txn_put(
        self, key: str, compare: dict[str, Any], value: bytes
    ) -> tuple[bool, bytes | None, int]:
        """(won, value now, its mod_revision: 0 if absent or unknown)."""
        bkey = _b64(key.encode())
        compare = {"key": bkey, "result": "EQUAL", **compare}
        txn = {
            "compare": [compare],
            "success": [{"request_put": {"key": bkey, "value": _b64(value)}}],
            "failure": [{"request_range": {"key": bkey}}],
        }
        result = self._post("/kv/txn", txn)
        if result.get("succeeded"):
            return True, value, 0
        responses = result.get("responses") or [{}]
        kvs = responses[0].get("response_range", {}).get("kvs") or []
        if not kvs:
            return False, None, 0
        return False, _unb64(kvs[0].get("value", "")), int(kvs[0].get("mod_revision", 0))

    def add(self, key: str, amount: int) -> int:
        value, mod_rev, _rev = self._range(key)
        if amount == 0 and value is not None:
            # A read (the protocol reads counters with add(0), TCPStore's
            # non-blocking read); writing it back would only add contention.
            return int(value)
        backoff = _ADD_BACKOFF_S
        for _ in range(_MAX_ADD_ATTEMPTS):
            new = (int(value) if value else 0) + amount
            if value is None:
                compare: dict[str, Any] = {"target": "CREATE", "create_revision": 0}
            else:
                compare = {"target": "MOD", "mod_revision": mod_rev}
            won, value, mod_rev = self._txn_put(key, compare, str(new).encode())
            if won:
                return new
            if amount == 0 and value is not None:
                return int(value)  # lost the create to another reader: a read now
            time.sleep(random.uniform(0, backoff))
            backoff = min(backoff * 2, _ADD_BACKOFF_MAX_S)
            if value is not None and mod_rev == 0:
                value, mod_rev, _rev = self._range(key)
        raise StoreUnavailableError(f"etcd add on {key}: too much contention")

    def take_ticket(self, key: str) -> int:
        # One uncontended put of a key of our own under ``key/``; our number
        # is how many such keys were created up to and including ours. etcd
        # revisions are unique and totally ordered, and every put with a lower
        # revision is committed before ours, so the numbers are dense.
        prefix = _ticket_prefix(key)
        result = self._post(
            "/kv/put", {"key": _b64((prefix + uuid.uuid4().hex).encode()), "value": ""}
        )
        revision = int(result.get("header", {}).get("revision", 0))
        if revision <= 0:
            raise StoreUnavailableError(f"etcd put under {prefix}: no revision in the reply")
        # Ticket keys are never deleted, so the keys that exist at our put's
        # revision are exactly those created up to it: count them there (one
        # small reply; reading all N keys made N joiners parse N^2 entries).
        request = {**_prefix_range(prefix), "revision": revision, "count_only": True}
        try:
            return int(self._http.post("/kv/range", request).get("count", 0))
        except RevisionCompactedError:
            pass
        except GatewayError as exc:
            raise StoreUnavailableError(f"etcd count under {prefix}: {exc}") from exc
        # Our revision was compacted away meanwhile: etcd's reply ``count``
        # ignores revision filters, so read the keys (no values) and count
        # those created up to our put ourselves.
        kvs = self._post("/kv/range", {**_prefix_range(prefix), "keys_only": True}).get("kvs")
        return sum(1 for kv in kvs or [] if int(kv.get("create_revision", 0)) <= revision)

    def tickets(self, key: str) -> int:
        request = {**_prefix_range(_ticket_prefix(key)), "count_only": True}
        return int(self._post("/kv/range", request).get("count", 0))

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes | None:
        if expected is None:
            compare: dict[str, Any] = {"target": "CREATE", "create_revision": 0}
        else:
            compare = {"target": "VALUE", "value": _b64(expected)}
        _won, value, _mod = self._txn_put(key, compare, desired)
        return value

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        # One read of every key, then one watch over the span of the missing
        # ones (from the revision after the read, so no write is lost); any
        # event in the span means read again. Each pass costs a watch event.
        deadline = time.monotonic() + timeout
        names = list(keys)
        while names:
            values, revision = self._range_many(names)
            missing = [k for k, v in zip(names, values, strict=True) if v is None]
            if not missing:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            first, last = min(missing), max(missing)
            end = None if first == last else last + "\0"
            try:
                if not self._http.watch_once(first, end, revision + 1, left):
                    return False
            except GatewayError as exc:
                raise StoreUnavailableError(f"etcd watch {first}: {exc}") from exc
        return True

    def clone(self) -> EtcdKVStore:
        return EtcdKVStore(self._endpoints, self._timeout, self._tls)

    def close(self) -> None:
        self._http.close()
        self._client.session.close()


def connect_etcd_with_retry(
    endpoints: Sequence[tuple[str, str, int]],
    tls: tuple[str, str, str] | None,
    deadline: float,
) -> EtcdKVStore:
    """Connect to the first reachable endpoint, retrying until ``deadline`` (monotonic)."""
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            return EtcdKVStore(endpoints, request_timeout=max(0.5, min(left, 10.0)), tls=tls)
        except StoreUnavailableError:
            if deadline - time.monotonic() <= 0:
                raise
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
