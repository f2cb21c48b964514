"""Waiting until the API server serves a CRD the harness just applied.

Where it sits: under every CRD install of the harness (the ElasticJob CRD of the
tests, the demo and the benchmarks through ``e2e.workload.apply_crd``; Kueue's
in ``kueue.install_crds``). ``kubectl wait --for=condition=Established`` does not
wait when it reads a CRD created a moment ago whose ``status.conditions`` is
still null: it fails at once ("accessor error: <nil> is of the type <nil>,
expected []interface{}"), a race a loaded machine loses now and then, and a
session fixture that loses it errors every test after it. So the wait reads
the conditions itself, bounded like every harness wait (``e2e.polling``).
``established`` and ``names_in`` are pure; ``wait_established`` takes the
kubectl to run, so each caller keeps its own kubeconfig and environment.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from e2e.polling import poll_until

Kubectl = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


class CrdNotEstablishedError(RuntimeError):
    """A CRD was not Established within the wait's bound (permanent for this run)."""


def established(crd: Mapping[str, Any]) -> bool:
    """Whether a CRD object carries ``Established: True`` (null conditions: not yet)."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def names_in(docs: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """The CRD names among manifest documents (other kinds and empty documents skipped)."""
    return [
        str(d["metadata"]["name"])
        for d in docs
        if d and d.get("kind") == "CustomResourceDefinition"
    ]


def not_established(kubectl: Kubectl, names: Sequence[str]) -> list[str]:
    """The names among ``names`` that are not Established yet (all of them if the read fails)."""
    try:
        out = kubectl(["get", "crd", *names, "-o", "json"])
    except subprocess.TimeoutExpired:
        return list(names)
    if out.returncode != 0:
        return list(names)
    doc: dict[str, Any] = json.loads(out.stdout)
    items = doc.get("items", []) if doc.get("kind") == "List" else [doc]
    ready = {str(i["metadata"]["name"]) for i in items if established(i)}
    return [n for n in names if n not in ready]


def wait_established(kubectl: Kubectl, names: Sequence[str], timeout_s: float = 60.0) -> None:
    """Return once every named CRD is Established; raise ``CrdNotEstablishedError`` naming
    the ones that are not after ``timeout_s``."""
    pending = list(names)

    def done() -> bool:
        nonlocal pending
        pending = not_established(kubectl, names)
        return not pending

    if not poll_until(done, timeout_s, 0.2):
        raise CrdNotEstablishedError(
            f"CRD(s) not Established within {timeout_s:.0f} s: {', '.join(pending)}"
        )
