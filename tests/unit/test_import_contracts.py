"""The import-linter contracts in pyproject.toml hold, and each one bites.

`make lint` runs ``lint-imports`` over the tree; these tests run the same
contracts from pytest, and also on the real import graph with one import
added, to show each rule catches the import it is there for (a pure
operator module reaching for kopf or the clock, directly or through a chain;
the agent's decision module importing ``workers`` as ``restart_policy`` once
did; its flag parsing reaching a store client, as ``config`` once did through
``backends``; an agent module other than the rendezvous's two naming store keys). A
contract weakened by a typo or an option would pass ``lint-imports``
silently; here it fails.
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
PURE_OPERATOR = "operator's pure layer (planner, spec, status, ...) does no I/O"
API_CLIENT = "only kube talks to the API"
PURE_AGENT = "agent's pure decisions spawn, signal and connect nothing"
STORE_KEYS = "only the rendezvous reads and writes rendezvous keys"
AGENT_NO_STATE = "the agent never imports the state API's torch side"
STATE_NO_TORCH = "the state API's copies and decisions import no torch"
AGENT_LAYERS = "agent layers: cli > loop > workers > rendezvous > stores > memstate > pulse | fence"
AGENT_ACYCLIC = "no import cycles between the agent's sibling packages or modules"
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


def _names() -> list[str]:
    return [c["name"] for c in _config()["contracts_options"]]


def _kept(name: str, added: tuple[str, str] | None = None) -> bool:
    """Check one contract on the tree's graph, with ``added`` (importer, imported) if given
    (a new module when ``imported`` is empty)."""
    options = next(c for c in _config()["contracts_options"] if c["name"] == name)
    contract = KINDS[options["type"]](
        name=name,
        session_options=_config()["session_options"],
        contract_options=options,
    )
    graph = copy.deepcopy(_graph())
    if added is not None and added[1]:
        graph.add_import(importer=added[0], imported=added[1])
    elif added is not None:
        graph.add_module(added[0])
    return contract.check(graph, verbose=False).kept


def test_the_contracts_named_here_are_in_pyproject() -> None:
    named = {PURE_OPERATOR, API_CLIENT, PURE_AGENT, STORE_KEYS, AGENT_NO_STATE, STATE_NO_TORCH}
    named |= {AGENT_LAYERS, AGENT_ACYCLIC}
    assert named <= set(_names())


@pytest.mark.parametrize("name", _names())
def test_every_contract_is_kept_by_the_tree(name: str) -> None:
    assert _kept(name)


@pytest.mark.parametrize(
    ("name", "importer", "imported"),
    [
        (PURE_OPERATOR, "torchflex_operator.planning.pipeline", "kopf"),
        (PURE_OPERATOR, "torchflex_operator.model.status", "asyncio"),
        (PURE_OPERATOR, "torchflex_operator.model.spec", "time"),
        (PURE_OPERATOR, "torchflex_operator.render.builders", "torchflex_operator.kube"),
        # Through a chain: the planner imports the contract's labels.
        (PURE_OPERATOR, "torchflex_contract.labels", "subprocess"),
        (API_CLIENT, "torchflex_operator.runtime.reconcile", "kubernetes"),
        (PURE_AGENT, "torchflex_agent.loop.logic.policy", "torchflex_agent.workers.group"),
        (PURE_AGENT, "torchflex_agent.rendezvous.logic", "subprocess"),
        (PURE_AGENT, "torchflex_agent.rendezvous.logic", "threading"),
        # Flag parsing reaches no store client (config once did, through backends' openers).
        (PURE_AGENT, "torchflex_agent.loop.logic.config", "torchflex_agent.stores.registry"),
        (PURE_AGENT, "torchflex_agent.stores.logic", "torchflex_agent.stores.tcp"),
        (STORE_KEYS, "torchflex_agent.rendezvous.liveness", "torchflex_contract.store_keys"),
        (STORE_KEYS, "torchflex_agent.loop.supervise", "torchflex_contract.store_keys"),
        # The agent reaches the state API's copies only through state_shm (issue 18).
        (AGENT_NO_STATE, "torchflex_agent.loop.agent", "torchflex_agent.state"),
        (STATE_NO_TORCH, "torchflex_agent.fence", "torch"),
        (PURE_AGENT, "torchflex_agent.memstate.logic.copies", "time"),
        (PURE_AGENT, "torchflex_agent.rendezvous.logic", "logging"),
        # A new pure module is checked by its name alone.
        (PURE_AGENT, "torchflex_agent.workers.logic", "subprocess"),
        # Lower layers never reach up; sibling packages stay apart; new modules take a place.
        (AGENT_LAYERS, "torchflex_agent.workers.group", "torchflex_agent.loop.logic.policy"),
        (AGENT_LAYERS, "torchflex_agent.stores.kvstore", "torchflex_agent.rendezvous.protocol"),
        (AGENT_LAYERS, "torchflex_agent.memstate.shm", "torchflex_agent.progress"),
        (AGENT_LAYERS, "torchflex_agent.loop.agent", "torchflex_agent.peer.ring"),
        (AGENT_LAYERS, "torchflex_agent.newroom", ""),
        (AGENT_ACYCLIC, "torchflex_agent.stores.kvstore", "torchflex_agent.stores.registry"),
        (AGENT_ACYCLIC, "torchflex_agent.rendezvous.logic", "torchflex_agent.rendezvous.records"),
        (STATE_NO_TORCH, "torchflex_agent.memstate.logic.shards", "torchflex_agent.peer.ring"),
    ],
)
def test_each_contract_breaks_on_the_import_it_forbids(
    name: str, importer: str, imported: str
) -> None:
    assert not _kept(name, (importer, imported))


@pytest.mark.parametrize(
    "module",
    [
        "torchflex_agent.rendezvous.protocol",
        "torchflex_agent.rendezvous.records",
        "torchflex_agent.rendezvous.node_check",
    ],
)
def test_the_rendezvous_itself_may_name_store_keys(module: str) -> None:
    edge = (module, "torchflex_contract.store_keys")
    assert _graph().direct_import_exists(importer=edge[0], imported=edge[1])
    assert _kept(STORE_KEYS, edge)
