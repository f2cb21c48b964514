"""The harness's CRD wait: a CRD whose conditions are still null is waited for, not an error
(``kubectl wait`` fails at once on it), and a wait that runs out names what it waited for."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from e2e.cluster.crds import (
    CrdNotEstablishedError,
    established,
    names_in,
    not_established,
    wait_established,
)


def crd(name: str, conditions: list[dict[str, str]] | None) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "status": {"conditions": conditions, "acceptedNames": {"kind": "", "plural": ""}},
    }


ESTABLISHED = [
    {"type": "NamesAccepted", "status": "True"},
    {"type": "Established", "status": "True"},
]


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        (crd("a.x.io", ESTABLISHED), True),
        (crd("a.x.io", None), False),  # just created: what kubectl wait trips on
        (crd("a.x.io", []), False),
        (crd("a.x.io", [{"type": "NamesAccepted", "status": "True"}]), False),
        (crd("a.x.io", [{"type": "Established", "status": "False"}]), False),
        ({"kind": "CustomResourceDefinition", "metadata": {"name": "a.x.io"}}, False),
        ({"metadata": {"name": "a.x.io"}, "status": None}, False),
    ],
)
def test_established_only_with_the_condition_true(obj: dict[str, Any], want: bool) -> None:
    assert established(obj) is want


def test_names_in_keeps_only_crds() -> None:
    docs = [crd("a.x.io", None), None, {"kind": "Namespace", "metadata": {"name": "n"}},
            crd("b.x.io", None)]  # fmt: skip
    assert names_in(docs) == ["a.x.io", "b.x.io"]


class FakeKubectl:
    """Answers ``kubectl get crd NAMES -o json`` from a script of states, one per call."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        if answer is None:
            return subprocess.CompletedProcess(list(argv), 1, "", "NotFound")
        return subprocess.CompletedProcess(list(argv), 0, json.dumps(answer), "")


def as_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


@pytest.mark.parametrize(
    ("answer", "names", "want"),
    [
        (crd("a.x.io", ESTABLISHED), ["a.x.io"], []),  # one name: kubectl prints the object
        (crd("a.x.io", None), ["a.x.io"], ["a.x.io"]),
        (as_list(crd("a.x.io", ESTABLISHED), crd("b.x.io", None)), ["a.x.io", "b.x.io"],
         ["b.x.io"]),
        (None, ["a.x.io", "b.x.io"], ["a.x.io", "b.x.io"]),  # the read failed
        (subprocess.TimeoutExpired(["kubectl"], 30), ["a.x.io"], ["a.x.io"]),
    ],
)  # fmt: skip
def test_not_established_reads_one_object_or_a_list(
    answer: Any, names: list[str], want: list[str]
) -> None:
    kubectl = FakeKubectl([answer])
    assert not_established(kubectl, names) == want
    assert kubectl.calls == [["get", "crd", *names, "-o", "json"]]


def test_the_wait_outlasts_null_conditions_and_returns_once_established() -> None:
    kubectl = FakeKubectl([crd("a.x.io", None), None, crd("a.x.io", ESTABLISHED)])
    wait_established(kubectl, ["a.x.io"], timeout_s=10)
    assert len(kubectl.calls) == 3


def test_a_wait_that_runs_out_names_the_crds_not_established() -> None:
    kubectl = FakeKubectl([as_list(crd("a.x.io", ESTABLISHED), crd("b.x.io", None))])
    with pytest.raises(CrdNotEstablishedError, match=r"within 1 s: b\.x\.io$"):
        wait_established(kubectl, ["a.x.io", "b.x.io"], timeout_s=1.0)
    assert len(kubectl.calls) >= 2
