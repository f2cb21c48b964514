"""Kubernetes timestamps: RFC 3339 strings on the wire, aware datetimes inside.

Where it sits: at the edges of the pure layer. ``status`` parses and writes
the job's status times with these, ``observed`` reads pods' creation and
deletion times, ``planning.lease`` reads and writes a Lease's times and ``kube``
stamps Events; everything in between compares ``datetime`` values, never strings.
"""

from __future__ import annotations

import datetime as dt


def parse_time(value: object) -> dt.datetime | None:
    """RFC 3339 from the API (``2024-01-01T00:00:00Z``) to an aware datetime; None if not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_time(value: dt.datetime) -> str:
    """The API's form: UTC, whole seconds, ``Z`` (``metav1.Time``)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(value: dt.datetime) -> str:
    """``metav1.MicroTime`` (a Lease's acquire/renew times): UTC, microseconds, ``Z``."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
