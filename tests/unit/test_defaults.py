"""One default per ElasticJob field and per flag: the CRD, operator, agent and docs agree.

A default lives where users meet it, the CRD's schema (``crds/elasticjob.yaml``
and the chart's copy): the API server writes it into every new object. The
operator's ``JobSpec.parse`` falls back to its own values for objects stored
before a default existed, ``JobSpec``'s fields carry defaults for code that
builds one directly, the agent defaults its flags from
``torchflex_contract.env`` when run without the environment the operator
gives a worker (and that environment, for a bare job, says the same),
docs/api.md's annotated example names the job's defaults and docs/agent.md's
flag table the agent's, and its operator usage line the operator's. Each test
here fails when one of these places says something else than the schema (or,
for a flag, than the program that has it).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.layout import REPO_ROOT
from tests.unit.docs_tables import doc_table
from torchflex_agent.loop.logic.config import build_parser, parse_args
from torchflex_contract import labels
from torchflex_operator import cli
from torchflex_operator.model.settings import Settings
from torchflex_operator.model.spec import JobSpec, Rendezvous
from torchflex_operator.render import builders

CRDS = (REPO_ROOT / "crds" / "elasticjob.yaml", REPO_ROOT / "helm/torchflex/crds/elasticjob.yaml")

# The smallest object the schema accepts: only fields without a default.
BARE: dict[str, Any] = {
    "apiVersion": "torchflex.io/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "demo", "namespace": "ns", "uid": "0123456789"},
    "spec": {
        "minReplicas": 1,
        "maxReplicas": 2,
        "template": {
            "spec": {"containers": [{"name": "trainer", "image": "i", "command": ["python"]}]}
        },
    },
}

# Each schema default (dotted path under spec) -> where the operator keeps the
# value, and another valid value that must arrive there (proves the field is read).
Getter = Callable[[JobSpec], object]
READS: dict[str, tuple[Getter, object, dict[str, object]]] = {
    "nprocPerNode": (lambda j: j.nproc_per_node, "cpu", {}),
    "rendezvous.backend": (
        lambda j: j.rendezvous.backend,
        "etcd",
        {"rendezvous.endpoint": "http://127.0.0.1:2379"},
    ),
    "rendezvous.joinTimeoutSeconds": (lambda j: j.rendezvous.join_timeout_s, 30, {}),
    "rendezvous.lastCallSeconds": (lambda j: j.rendezvous.last_call_s, 2.5, {}),
    "maxRestarts": (lambda j: j.max_restarts, 0, {}),
    "backoffLimit": (lambda j: j.backoff_limit, 1, {}),
    "minAvailableTimeoutSeconds": (lambda j: j.min_available_timeout_s, 5, {}),
    "suspend": (lambda j: j.suspend, True, {}),
    "cleanPodPolicy": (lambda j: j.clean_pod_policy, "All", {}),
    "stragglerPolicy": (lambda j: j.straggler_policy, "Replace", {}),
    "nodeCheck.enabled": (lambda j: j.node_check, True, {}),
    "networkPolicy.enabled": (lambda j: j.network_policy, False, {}),
    "sharedMemory.enabled": (lambda j: j.shared_memory.enabled, False, {}),
    "sharedMemory.sizeLimit": (lambda j: j.shared_memory.size_limit, "8Gi", {}),
}


def _schema(path: Path) -> dict[str, Any]:
    (crd,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    (version,) = crd["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _with_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` defaulted as the API server does: absent properties get their
    schema default, then defaulting goes on inside (also into what it added)."""
    if isinstance(value, dict):
        out = dict(value)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = _with_defaults(out[key], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [_with_defaults(item, schema["items"]) for item in value]
    return value


def _leaf_defaults(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, default) of every defaulted field that is not an object."""
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{key}"
        if "default" in sub and not isinstance(sub["default"], dict):
            yield path, sub["default"]
        yield from _leaf_defaults(sub, f"{path}.")


def _spec_defaults(path: Path) -> dict[str, Any]:
    return dict(_leaf_defaults(_schema(path)["properties"]["spec"]))


def _set(obj: dict[str, Any], dotted: str, value: object) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    obj[leaf] = value


@pytest.mark.parametrize("crd", CRDS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_schema_defaults_give_the_job_the_operator_falls_back_to(crd: Path) -> None:
    defaulted = _with_defaults(copy.deepcopy(BARE), _schema(crd))
    assert defaulted != BARE
    assert JobSpec.parse(defaulted) == JobSpec.parse(BARE)


@pytest.mark.parametrize("crd", CRDS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_schema_default_is_a_field_the_operator_reads(crd: Path) -> None:
    defaults = _spec_defaults(crd)
    assert set(defaults) == set(READS), "a schema default without a READS entry, or gone"
    bare = JobSpec.parse(BARE)
    for path, (get, other, extra) in READS.items():
        assert get(bare) == defaults[path], path
        obj = copy.deepcopy(BARE)
        for dotted, value in {path: other, **extra}.items():
            _set(obj["spec"], dotted, value)
        assert get(JobSpec.parse(obj)) == other, path


@pytest.mark.parametrize("cls", [JobSpec, Rendezvous])
def test_dataclass_field_defaults_are_the_parse_fallbacks(cls: type) -> None:
    bare = JobSpec.parse(BARE)
    value = bare if cls is JobSpec else bare.rendezvous
    with_default = [f for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING]
    assert with_default
    for field in with_default:
        assert getattr(value, field.name) == field.default, field.name


def test_the_agent_without_flags_or_env_runs_a_bare_job_as_the_operator_would() -> None:
    job = JobSpec.parse(BARE)
    argv = ["--rdzv-id", "j", "--rdzv-endpoint", "127.0.0.1:29400", "--", "python"]
    alone = parse_args(argv, env={})
    assert alone.nproc_spec == job.nproc_per_node
    assert alone.rdzv_backend.value == job.rendezvous.backend.value
    assert alone.join_timeout == job.rendezvous.join_timeout_s
    assert alone.last_call == job.rendezvous.last_call_s
    assert alone.max_restarts == job.max_restarts
    # The env the operator gives a bare job's worker (Kubernetes' default grace
    # period included) sets each of these to what the agent assumes without it.
    (trainer,) = [
        c
        for c in builders.worker_pod(job, 0, Settings())["spec"]["containers"]
        if c["name"] == labels.TRAINER_CONTAINER
    ]
    injected = {e["name"]: e["value"] for e in trainer["env"] if "value" in e}
    told = parse_args(argv, env=injected)
    for name in (
        "nproc_spec",
        "rdzv_backend",
        "join_timeout",
        "last_call",
        "max_restarts",
        "termination_grace",
    ):
        assert getattr(told, name) == getattr(alone, name), name


def _documented_defaults() -> dict[str, Any]:
    """docs/api.md's example: (dotted path under spec, default) for each line
    whose comment names a default ("(default X)", "X (default)", "default X")."""
    text = (REPO_ROOT / "docs" / "api.md").read_text()
    block = text.split("## Complete annotated example", 1)[1].split("```yaml\n", 1)[1]
    block = block.split("```", 1)[0]
    found: dict[str, Any] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = re.match(r"^( *)([A-Za-z]+):[^#]*(?:#(.*))?$", line)
        if m is None:
            continue
        indent, key, comment = len(m[1]), m[2], m[3] or ""
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        said = (
            re.search(r"\(default ([^)\s;]+)\)", comment)
            or re.search(r"(\S+) \(default\)", comment)
            or re.search(r"(?:^|;)\s*default ([^\s;:,]+)", comment)
        )
        if said is not None:
            path = [k for _, k in stack]
            assert path[0] == "spec", line
            found[".".join(path[1:])] = yaml.safe_load(said[1])
    return found


def test_docs_example_names_each_schema_default_as_the_schema_does() -> None:
    assert _documented_defaults() == _spec_defaults(CRDS[0])


def _same(documented: str, default: str) -> bool:
    try:
        return float(documented) == float(default)
    except ValueError:
        return documented == default


def test_docs_agent_flag_table_gives_each_flag_its_env_and_default() -> None:
    """docs/agent.md's flag table: every flag the environment can set, its variable,
    and its default when neither flag nor variable is given."""
    options = build_parser({})._option_string_actions
    documented: set[str] = set()
    for row in doc_table("agent.md", "Each flag defaults from the env var"):
        flag_cell, env_cell, default_cell = row
        flag = re.match(r"`(--[a-z-]+)", flag_cell)
        if flag is None:
            continue  # a variable the agent reads without a flag
        action = options[flag[1]]
        documented.add(action.dest)
        assert f"; env {env_cell.strip('`')})" in (action.help or ""), row
        default = re.match(r"`([^`]+)`", default_cell)
        if default is None:
            assert not action.default, row  # documented as having none
        else:
            assert _same(default[1], str(action.default)), row
    with_env = {a.dest for a in options.values() if "; env " in (a.help or "")}
    assert documented == with_env


def test_docs_operator_usage_names_the_operators_defaults() -> None:
    """docs/api.md's ``torchflex-operator [...]`` line: each ``[--flag N]`` is a flag
    of the operator, and N its default (flags whose default is computed from
    others, the lease timings, are only checked to exist)."""
    text = (REPO_ROOT / "docs" / "api.md").read_text().split("\n## Operator\n", 1)[1]
    usage = text.split("`", 2)[1]
    options = cli.parser()._option_string_actions
    shown = re.findall(r"\[(--[a-z-]+) (\d+(?:\.\d+)?)\]", usage)
    checked = 0
    for flag, value in shown:
        assert flag in options, flag
        default = options[flag].default
        if default is not None:
            assert float(default) == float(value), flag
            checked += 1
    assert checked >= 5, shown
