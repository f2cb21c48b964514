"""The LIST-into-cache merge: a re-read of a job's pods never undoes newer watch events."""

from __future__ import annotations

from typing import Any

from torchflex_contract import labels
from torchflex_operator.runtime.cache import OwnedCache


def pod(name: str, uid: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "labels": {labels.Label.JOB_NAME: "demo", labels.Label.ROLE: "worker"},
        },
        "status": {"phase": phase},
    }


def test_merge_listed_lets_newer_watch_events_win() -> None:
    cache = OwnedCache()
    key = ("ns", "demo")
    cache.update_pod("ADDED", pod("ghost", "g"))  # deleted while we were not watching
    cache.update_pod("ADDED", pod("kept", "k", "Pending"))
    mark = cache.mark()
    # Between the mark and the LIST's answer the watch says: "kept" runs, "gone" was deleted.
    cache.update_pod("MODIFIED", pod("kept", "k", "Running"))
    cache.update_pod("ADDED", pod("gone", "x"))
    cache.update_pod("DELETED", pod("gone", "x"))
    listed = [pod("kept", "k", "Pending"), pod("gone", "x"), pod("new", "n")]
    cache.merge_listed(key, listed, since=mark)
    views = {p.name: p for p in cache.job_pods(key)}
    assert set(views) == {"kept", "new"}  # ghost dropped, gone stays gone
    assert views["kept"].phase == "Running"  # the newer watch view, not the LIST's
