"""The pure parts of the kubelet's records and fault helpers: /proc parsing,
process trees, record round trips, gratuitous ARP frames, lost containers."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest

from e2e.cluster.network import ARP_REPLY, ARP_REQUEST, garp_frame
from e2e.kubelet import records, status
from e2e.kubelet.records import PodRecord, Proc

STAT = (
    "4242 (python3 -c (x) y) S 4000 4242 4242 0 -1 4194560 2155 0 0 0 5 1 0 0 20 0 1 0 987654 2 0"
)


def test_stat_parsing_survives_spaces_and_parens_in_the_command_name() -> None:
    st = records.parse_stat(STAT)
    assert (st.pid, st.state, st.ppid, st.start) == (4242, "S", 4000, 987654)


@pytest.mark.parametrize(
    ("parents", "roots", "want"),
    [
        # agent 10 -> fork server 11 -> workers 12, 13; 20 belongs to someone else
        ({10: 1, 11: 10, 12: 11, 13: 11, 20: 1}, [10], [10, 11, 12, 13]),
        # two containers, one of them already gone
        ({10: 1, 11: 10, 30: 1}, [10, 99], [10, 11]),
        # a root listed twice, a child listed under two roots cannot happen twice
        ({10: 1, 11: 10}, [10, 10], [10, 11]),
        ({}, [10], []),
    ],
)
def test_descendants_walk_parents_before_children(
    parents: dict[int, int], roots: list[int], want: list[int]
) -> None:
    assert records.descendants(parents, roots) == want


def test_record_round_trip_and_find_picks_the_newest(tmp_path: Path) -> None:
    rec = PodRecord("uid-1", "ns", "w-0", "tfpod4-uid-1", "tfvabc", "10.221.0.2", {"c": Proc(7, 8)})
    older = tmp_path / "ns_w-0_uid-0"
    newer = tmp_path / "ns_w-0_uid-1"
    older.mkdir()
    newer.mkdir()
    records.write(older, PodRecord("uid-0", "ns", "w-0", "n", "v", "10.221.0.3", {}))
    records.write(newer, rec)
    os.utime(older, (1, 1))
    os.utime(newer, (2, 2))
    assert records.read(newer) == rec
    assert records.find(tmp_path, "ns", "w-0") == rec
    with pytest.raises(LookupError):
        records.find(tmp_path, "ns", "w-1")
    assert records.read(tmp_path) is None


def test_gratuitous_arp_frames_claim_the_address_for_the_mac() -> None:
    mac = bytes.fromhex("02aabbccddee")
    for op in (ARP_REQUEST, ARP_REPLY):
        frame = garp_frame(mac, "10.221.0.7", op)
        assert len(frame) == 42
        assert frame[:6] == b"\xff" * 6 and frame[6:12] == mac
        assert struct.unpack("!H", frame[12:14])[0] == 0x0806
        htype, ptype, hlen, plen, got_op = struct.unpack("!HHBBH", frame[14:22])
        assert (htype, ptype, hlen, plen, got_op) == (1, 0x0800, 6, 4, op)
        assert frame[22:28] == mac
        # Sender and target protocol address are the same: gratuitous.
        assert frame[28:32] == frame[38:42] == socket.inet_aton("10.221.0.7")
    with pytest.raises(ValueError, match="6 bytes"):
        garp_frame(b"\x01", "10.0.0.1", ARP_REQUEST)


def _pod(statuses: list[dict[str, object]]) -> dict[str, object]:
    return {
        "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]},
        "status": {"containerStatuses": statuses},
    }


def test_a_pod_that_never_ran_has_no_lost_containers() -> None:
    assert status.lost_containers(_pod([])) == {}
    waiting = {"name": "a", "restartCount": 0, "state": {"waiting": {"reason": "X"}}}
    assert status.lost_containers(_pod([waiting])) == {}


def test_running_containers_are_lost_terminated_ones_keep_their_exit() -> None:
    running = {
        "name": "a",
        "restartCount": 2,
        "state": {"running": {"startedAt": "2026-11-23T10:00:00Z"}},
    }
    done = {
        "name": "b",
        "restartCount": 0,
        "state": {"terminated": {"exitCode": 3, "reason": "Error", "startedAt": "s"}},
    }
    lost = status.lost_containers(_pod([running, done]), "ContainerStatusUnknown", "gone")
    a, b = lost["a"], lost["b"]
    assert (a.exit_code, a.reason, a.message, a.restart_count) == (
        137,
        "ContainerStatusUnknown",
        "gone",
        2,
    )
    assert a.terminated_state()["reason"] == "ContainerStatusUnknown"
    assert (b.exit_code, b.reason) == (3, "Error")
    # restartPolicy Never: the pod fails; Always: it stays Running (restarts).
    assert status.phase(list(lost.values()), "Never") == "Failed"
    assert status.phase(list(lost.values()), "Always") == "Running"
