"""Sharded state's previous copies (``state_shm.CopyStore.write(previous=...)``) and failed writes.

Where it sits: beside ``test_agent_state_api.py``'s fenced-write test, against
a real lease file and a real folder: the copy before is rotated into its
``previous`` slot only by a write that lands (a refused one, fenced or older,
leaves both slots as they were), and a write that fails (``/dev/shm`` full,
here a folder in the temp file's place) is a refusal, not an exception (the
peer ring stays in lockstep: issue 18, review items 5 and 6). Then the peer
ring's receiver side, its bytes handed in directly (no group): a copy of
another round than the member's, or one its fenced lease refuses, replaces
nothing and rotates nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from torchflex_agent.fence import Lease
from torchflex_agent.memstate.logic.copies import CopyMeta
from torchflex_agent.memstate.logic.shards import OWN, OWN_PREVIOUS, PEER, PEER_PREVIOUS
from torchflex_agent.memstate.shm import CopyStore
from torchflex_agent.peer.ring import PeerRing, _Receiver
from torchflex_contract import env as tfenv


def _store(folder: Path, lease: Lease, round_no: int) -> CopyStore:
    env = {
        tfenv.STATE_DIR: str(folder),
        tfenv.FENCE_FILE: str(lease.path),
        tfenv.ROUND: str(round_no),
        "LOCAL_RANK": "0",
    }
    return CopyStore(env)


def test_only_a_write_that_lands_rotates_the_previous_copy(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(3, "inc", time.monotonic())
    store = _store(tmp_path, lease, 3)
    assert store.write(CopyMeta("inc", 3, 10), b"ten", previous=OWN_PREVIOUS) is None
    assert store.read(OWN_PREVIOUS) is None  # nothing before the first copy
    assert store.write(CopyMeta("inc", 3, 11), b"eleven", previous=OWN_PREVIOUS) is None
    assert store.read(OWN_PREVIOUS) == (CopyMeta("inc", 3, 10), b"ten")
    # An older step is refused: step 10 stays the copy before.
    refused = store.write(CopyMeta("inc", 3, 9), b"nine", previous=OWN_PREVIOUS)
    assert refused is not None and "newer" in refused
    # Fenced (the agent moved on): neither slot changes.
    lease.grant(4, "inc", time.monotonic())
    refused = store.write(CopyMeta("inc", 3, 12), b"twelve", previous=OWN_PREVIOUS)
    assert refused == "fenced (other-round)"
    assert store.read(OWN) == (CopyMeta("inc", 3, 11), b"eleven")
    assert store.read(OWN_PREVIOUS) == (CopyMeta("inc", 3, 10), b"ten")


def test_a_failed_write_is_a_refusal(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(1, "inc", time.monotonic())
    store = _store(tmp_path, lease, 1)
    assert store.write(CopyMeta("inc", 1, 1), b"one", previous=OWN_PREVIOUS) is None
    # The temp file cannot be created (as when /dev/shm is full): refused, nothing moved.
    (tmp_path / f".{OWN}-0.{os.getpid()}.tmp").mkdir()
    refused = store.write(CopyMeta("inc", 1, 2), b"two", previous=OWN_PREVIOUS)
    assert refused is not None and refused.startswith("not written")
    assert store.read(OWN) == (CopyMeta("inc", 1, 1), b"one")
    assert store.read(OWN_PREVIOUS) is None


def test_the_receiver_keeps_only_this_rounds_copies_while_its_lease_holds(
    tmp_path: Path,
) -> None:
    lease = Lease(tmp_path / "lease", duration=30.0)
    lease.grant(2, "inc", time.monotonic())
    store = _store(tmp_path, lease, 2)
    ring = PeerRing(store)
    receiver = _Receiver(None, 0, store, ring)

    def arrive(meta: CopyMeta, payload: bytes) -> None:
        receiver._keep(bytearray(meta.header() + payload))

    arrive(CopyMeta("inc", 2, 5, 1, 3), b"five")
    arrive(CopyMeta("inc", 2, 6, 1, 3), b"six")
    assert ring.received == 2
    # A stale sender of round 1 (or of another incarnation) at a higher step: refused.
    arrive(CopyMeta("inc", 1, 50, 1, 3), b"stale")
    arrive(CopyMeta("old", 2, 50, 1, 3), b"stale")
    # This member's lease is revoked (fenced): round-2 copies no longer land either.
    lease.revoke()
    arrive(CopyMeta("inc", 2, 7, 1, 3), b"seven")
    assert ring.received == 2
    assert store.read(PEER) == (CopyMeta("inc", 2, 6, 1, 3), b"six")
    assert store.read(PEER_PREVIOUS) == (CopyMeta("inc", 2, 5, 1, 3), b"five")
