"""Pure parts of the operator-scale benchmark: request classes, /proc parsing, pairing.

Where it sits: ``benchmarks._scale_proxy`` logs every request the operator
sends to the API server; ``benchmarks.operator_scale`` turns those logs,
``/proc/<pid>`` snapshots and watch timestamps into the reported figures with
the functions below. No I/O here; tested in ``tests/unit/benchmarks``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qs, urlsplit


@dataclasses.dataclass(frozen=True)
class Request:
    """One API request as the counting proxy saw it."""

    t: float
    method: str
    path: str

    @property
    def verb(self) -> str:
        return classify(self.method, self.path)[0]

    @property
    def resource(self) -> str:
        return classify(self.method, self.path)[1]


def classify(method: str, target: str) -> tuple[str, str]:
    """(verb, resource) of a request line, in the API server's own vocabulary.

    ``resource`` is ``group/resource[/subresource]`` (core group: empty
    group, so ``pods`` or ``pods/status``); non-resource paths give
    ``("get", "/path")``.
    """
    parts = urlsplit(target)
    query = parse_qs(parts.query)
    segs = [s for s in parts.path.split("/") if s]
    if segs[:1] == ["api"] and len(segs) >= 2:
        rest, group = segs[2:], ""
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        rest, group = segs[3:], segs[1]
    else:
        return method.lower(), parts.path
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # namespaced: drop "namespaces/<ns>"
    elif rest[:1] == ["namespaces"] and len(rest) == 2:
        pass  # the Namespace object itself
    if not rest:
        return method.lower(), parts.path
    resource = rest[0]
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    full = f"{group}/{resource}" if group else resource
    m = method.upper()
    if m == "GET":
        if query.get("watch", ["false"])[0] in ("true", "1"):
            verb = "watch"
        else:
            verb = "get" if named else "list"
    elif m == "POST":
        verb = "create"
    elif m == "PUT":
        verb = "update"
    elif m == "PATCH":
        verb = "patch"
    elif m == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = m.lower()
    return verb, full


def count_by(requests: Iterable[Request], t0: float, t1: float) -> dict[tuple[str, str], int]:
    """Requests sent in ``[t0, t1)`` by (verb, resource)."""
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for r in requests:
        if t0 <= r.t < t1:
            out[(r.verb, r.resource)] += 1
    return dict(out)


def per_minute(counts: Mapping[tuple[str, str], int], seconds: float, watches: bool) -> float:
    """Rate per minute of the counted requests, with or without watch (re)opens."""
    if seconds <= 0:
        raise ValueError("window must be positive")
    total = sum(n for (verb, _res), n in counts.items() if (verb == "watch") == watches)
    return total * 60.0 / seconds


def format_counts(counts: Mapping[tuple[str, str], int]) -> str:
    """``verb resource xN`` items, most frequent first; "none" if empty."""
    if not counts:
        return "none"
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{verb} {res} x{n}" for (verb, res), n in items)


def cpu_seconds(stat_line: str, ticks_per_s: int) -> float:
    """utime + stime of ``/proc/<pid>/stat``, in seconds."""
    # The command name (field 2) may hold spaces; fields after its ")" are fixed.
    after = stat_line.rsplit(")", 1)[1].split()
    utime, stime = int(after[11]), int(after[12])
    return (utime + stime) / ticks_per_s


def status_kib(status_text: str, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``)."""
    for line in status_text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"{field} not in /proc status")


def replacement_latencies(
    deletions: Mapping[str, Sequence[float]], arrivals: Mapping[str, Sequence[float]]
) -> tuple[list[float], int]:
    """Pair each job's deletions with its next new pods, in time order.

    ``deletions``: job -> times we deleted one of its workers; ``arrivals``:
    job -> times a new worker of that job appeared (after the first
    deletion). The k-th deletion of a job is answered by the k-th new pod
    seen at or after it. Returns (latencies, number left unanswered).
    """
    out: list[float] = []
    missing = 0
    for job, dels in deletions.items():
        pending = sorted(arrivals.get(job, ()))
        i = 0
        for d in sorted(dels):
            while i < len(pending) and pending[i] < d:
                i += 1
            if i < len(pending):
                out.append(pending[i] - d)
                i += 1
            else:
                missing += 1
    return out, missing


def growth(xs: Sequence[float], ys: Sequence[float]) -> str:
    """How ``ys`` grows with ``xs``: the exponent k of y ~ x^k between the ends."""
    import math

    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pairs) < 2 or pairs[0][0] == pairs[-1][0]:
        return "n/a"
    (x0, y0), (x1, y1) = pairs[0], pairs[-1]
    k = math.log(y1 / y0) / math.log(x1 / x0)
    return f"~x^{k:.2f}"


def parse_log(text: str) -> list[Request]:
    """The counting proxy's log: ``<monotonic> <METHOD> <target>`` per line."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            try:
                out.append(Request(float(parts[0]), parts[1], parts[2]))
            except ValueError:
                continue
    return out
