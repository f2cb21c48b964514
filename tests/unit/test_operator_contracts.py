"""The operator's package contracts in pyproject.toml (issue 27) hold, and each bites.

Layers between the operator's packages (every package placed: ``exhaustive``), layers
inside the planner, steps and backends independent of one another, no import cycle
between siblings, and purity over whole packages: each test adds one import (or one
module) to the real import graph and shows the contract it breaks. A module added to a
pure package is held to purity without being listed anywhere.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import api
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

REPO = Path(__file__).resolve().parents[2]
OP = "torchflex_operator"
LAYERS = "operator layers: cli > runtime > kube | planning > render > model"
PLANNER = "operator's planner: pipeline > steps > ledger > context > rules | lease | scheduling"
STEPS = "operator's planning steps are independent"
BACKENDS = "operator's rendezvous backends are independent"
ACYCLIC = "operator has no import cycles between siblings"
PURE = "operator's pure layer (planner, spec, status, ...) does no I/O"
KINDS: dict[str, type[Contract]] = {
    "forbidden": ForbiddenContract,
    "layers": LayersContract,
    "independence": IndependenceContract,
    "acyclic_siblings": AcyclicSiblingsContract,
}


@functools.cache
def _config() -> dict[str, Any]:
    return api.read_configuration(str(REPO / "pyproject.toml"))


@functools.cache
def _graph() -> grimp.ImportGraph:
    roots = _config()["session_options"]["root_packages"]
    return grimp.build_graph(*roots, include_external_packages=True)


def _kept(name: str, *, module: str | None = None, edge: tuple[str, str] | None = None) -> bool:
    options = next(c for c in _config()["contracts_options"] if c["name"] == name)
    contract = KINDS[options["type"]](
        name=name, session_options=_config()["session_options"], contract_options=options
    )
    graph = copy.deepcopy(_graph())
    if module is not None:
        graph.add_module(module)
    if edge is not None:
        graph.add_import(importer=edge[0], imported=edge[1])
    return contract.check(graph, verbose=False).kept


@pytest.mark.parametrize("name", [LAYERS, PLANNER, STEPS, BACKENDS, ACYCLIC, PURE])
def test_the_operator_contracts_are_kept(name: str) -> None:
    assert _kept(name)


@pytest.mark.parametrize(
    ("name", "importer", "imported"),
    [
        # Each layer imports only those below it.
        (LAYERS, f"{OP}.model.spec", f"{OP}.render.builders"),
        (LAYERS, f"{OP}.render.builders", f"{OP}.planning.rules.pacing"),
        (LAYERS, f"{OP}.planning.pipeline", f"{OP}.runtime.reconcile"),
        (LAYERS, f"{OP}.runtime.reconcile", f"{OP}.cli"),
        # kube and planning sit side by side: neither imports the other.
        (LAYERS, f"{OP}.kube.calls", f"{OP}.planning.pipeline"),
        (LAYERS, f"{OP}.planning.steps.scaling", f"{OP}.kube"),
        # Inside the planner: rules know nothing of a pass, the context no step.
        (PLANNER, f"{OP}.planning.rules.pacing", f"{OP}.planning.context"),
        (PLANNER, f"{OP}.planning.context", f"{OP}.planning.steps.spares"),
        (PLANNER, f"{OP}.planning.steps.spares", f"{OP}.planning.pipeline"),
        # A step never calls another: what it hands on is a field of the Draft.
        (STEPS, f"{OP}.planning.steps.spares", f"{OP}.planning.steps.scaling"),
        (STEPS, f"{OP}.planning.steps.outcome", f"{OP}.planning.steps.lifecycle"),
        (BACKENDS, f"{OP}.render.backends.etcd", f"{OP}.render.backends.c10d"),
        # A cycle anywhere between siblings (here: two modules of the model).
        (ACYCLIC, f"{OP}.model.kueue", f"{OP}.model.observed"),
        (PURE, f"{OP}.render.netpol", "logging"),
        (PURE, f"{OP}.planning.steps.store", "time"),
        (PURE, f"{OP}.model.kueue", "asyncio"),
        (PURE, f"{OP}.planning.ledger", f"{OP}.runtime.memory"),
    ],
)
def test_each_operator_contract_breaks_on_the_import_it_forbids(
    name: str, importer: str, imported: str
) -> None:
    assert not _kept(name, edge=(importer, imported))


def test_a_new_module_in_a_pure_package_is_held_to_purity_unlisted() -> None:
    new = f"{OP}.planning.steps.new_concern"
    assert _kept(PURE, module=new, edge=(new, "json"))
    assert not _kept(PURE, module=new, edge=(new, "socket"))


def test_a_new_top_level_module_must_be_given_its_layer() -> None:
    assert not _kept(LAYERS, module=f"{OP}.helpers")
