"""Contract tests of ``KVStore`` itself, run against every backend.

The rendezvous relies on these semantics exactly (``kvstore.KVStore``): a
read never blocks and never disturbs anyone, ``compare_set`` has one
winner, and ``wait`` reports True only once every key exists. Each test
uses two connections, as two agents would.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.integration.agent.conftest import Backend
from torchflex_agent.stores.kvstore import KVStore


def fresh(prefix: str) -> str:
    return f"/kvcontract/{prefix}/{uuid.uuid4().hex[:10]}"


@pytest.mark.timeout(60)
def test_get_add_compare_set(backend: Backend) -> None:
    a, b = backend.connect(), backend.connect()
    key, counter = fresh("k"), fresh("n")
    assert a.get(key) is None
    assert a.compare_set(key, None, b"one") == b"one"
    assert b.compare_set(key, None, b"two") == b"one", "the second create must lose"
    assert b.compare_set(key, b"one", b"three") == b"three"
    assert a.compare_set(key, b"one", b"four") == b"three", "a stale expectation must lose"
    assert a.get(key) == b"three"
    assert a.add(counter, 0) == 0
    assert a.add(counter, 2) == 2
    assert b.add(counter, 3) == 5


@pytest.mark.timeout(60)
def test_wait_is_woken_by_a_write(backend: Backend) -> None:
    waiter, writer = backend.connect(), backend.connect()
    key = fresh("w")
    seen: list[tuple[bool, float]] = []

    def wait() -> None:
        t0 = time.monotonic()
        seen.append((waiter.wait([key], 10.0), time.monotonic() - t0))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    time.sleep(0.3)
    writer.set(key, b"x")
    thread.join(15)
    assert seen and seen[0][0] is True
    assert seen[0][1] < 5.0, f"woken after {seen[0][1]:.2f}s, not by the write"


@pytest.mark.timeout(60)
def test_wait_ignores_reads_of_the_absent_key(backend: Backend) -> None:
    # Regression: the libuv TCPStore server wakes a key's waiters on every
    # compare_set of it, even one that writes nothing -- and ``get`` is such
    # a compare_set. A woken wait must not report a key that is not there.
    waiter, reader = backend.connect(), backend.connect()
    key, other = fresh("absent"), fresh("other")
    seen: list[tuple[bool, float]] = []

    def wait() -> None:
        t0 = time.monotonic()
        seen.append((waiter.wait([key, other], 1.5), time.monotonic() - t0))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        assert reader.get(key) is None
        assert reader.compare_set(other, b"not-there", b"y") is None
        time.sleep(0.05)
    reader.set(other, b"only one of the two keys")
    thread.join(15)
    assert seen, "wait did not return"
    found, elapsed = seen[0]
    assert found is False, "wait reported a key that was never written"
    assert elapsed >= 1.4, f"wait gave up after {elapsed:.2f}s of 1.5s"


@pytest.mark.timeout(60)
def test_wait_times_out_and_the_connection_stays_usable(backend: Backend) -> None:
    store = backend.connect()
    key = fresh("t")
    t0 = time.monotonic()
    assert store.wait([key], 0.3) is False
    assert time.monotonic() - t0 >= 0.25
    store.set(key, b"v")
    assert store.wait([key], 0.3) is True
    assert store.get(key) == b"v"


@pytest.mark.timeout(60)
def test_tickets_are_unique_dense_and_counted(backend: Backend) -> None:
    # 16 takers at once, each on its own connection, as joining agents are.
    key = fresh("tickets")
    takers = [backend.connect() for _ in range(16)]
    numbers: list[int] = []
    lock = threading.Lock()
    go = threading.Event()

    def take(store: KVStore) -> None:
        go.wait(10)
        n = store.take_ticket(key)
        with lock:
            numbers.append(n)

    threads = [threading.Thread(target=take, args=(s,), daemon=True) for s in takers]
    for t in threads:
        t.start()
    assert takers[0].tickets(key) == 0
    go.set()
    for t in threads:
        t.join(30)
    assert sorted(numbers) == list(range(1, 17))
    assert takers[0].tickets(key) == 16
    assert takers[1].take_ticket(key) == 17
    assert takers[2].tickets(fresh("none")) == 0


@pytest.mark.timeout(120)
def test_get_many_reads_present_and_absent_keys_in_order(backend: Backend) -> None:
    # The shapes the rendezvous reads: a round's descriptors (siblings, all
    # of one parent's children, etcd reads them as one range), the job-wide
    # and per-round keys together (no common parent), present and absent
    # mixed, and more point reads than one etcd transaction may carry.
    writer, reader = backend.connect(), backend.connect()
    base = fresh("many")
    siblings = [f"{base}/node/{i}" for i in range(12)]
    for i, key in enumerate(siblings[:10]):
        writer.set(key, f"d{i}".encode())
    writer.set(f"{base}/node/3/deeper", b"not asked for")
    writer.set(f"{base}/closed", b"c")
    scattered = [f"{base}/closed", f"{base}/stale", f"{base}-other/job"]
    assert reader.get_many([]) == []
    assert reader.get_many(siblings) == [f"d{i}".encode() for i in range(10)] + [None, None]
    assert reader.get_many(list(reversed(siblings[:10]))) == [
        f"d{i}".encode() for i in reversed(range(10))
    ]
    assert reader.get_many([*siblings[:10], *scattered]) == [
        *(f"d{i}".encode() for i in range(10)),
        b"c",
        None,
        None,
    ]
    assert reader.get_many([siblings[3], siblings[11]]) == [b"d3", None]
    many = [f"{base}/wide-{i}/k" for i in range(140)]
    for key in many[::7]:
        writer.set(key, key.encode())
    assert reader.get_many(many) == [k.encode() if i % 7 == 0 else None for i, k in enumerate(many)]
    # A read of absent keys writes nothing and disturbs no later create.
    assert writer.compare_set(siblings[11], None, b"late") == b"late"


@pytest.mark.timeout(60)
def test_wait_on_many_keys_needs_all_of_them(backend: Backend) -> None:
    waiter, writer = backend.connect(), backend.connect()
    base = fresh("waitmany")
    keys = [f"{base}/node/{i}" for i in range(10)]
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(waiter.wait(keys, 15.0)), daemon=True)
    thread.start()
    for key in reversed(keys[1:]):
        writer.set(key, b"x")
    time.sleep(0.3)
    assert not seen, "wait returned before its last key existed"
    writer.set(keys[0], b"x")
    thread.join(20)
    assert seen == [True]
