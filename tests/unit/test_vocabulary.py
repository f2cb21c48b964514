"""The closed vocabulary stays closed: each word defined once, used, documented, never respelled.

Where it sits: a check over the source tree (no cluster; it imports the
vocabulary modules and reads the rest as text and syntax trees). The words
are the operator's status and Event words (``torchflex_operator.model.vocabulary``)
and the contract's names (API names, labels, annotations, env variables, the
agent's states and restart reasons, exit codes, store keys); docs/api.md and
docs/agent.md list them as the code does. Product code (operator, agent, the
e2e harness) names them through their
enums and constants; tests may spell a word out where they check the wire
format, so tests are not scanned.
"""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from e2e.cluster.layout import REPO_ROOT
from tests.unit.docs_tables import doc_table
from torchflex_contract import env, exit_codes, labels, progress, store_keys
from torchflex_operator.model import vocabulary

STATUS_WORDS: tuple[type[enum.StrEnum], ...] = (
    vocabulary.Phase,
    vocabulary.ConditionType,
    vocabulary.Reason,
    vocabulary.EventReason,
    vocabulary.GangScheduling,
    vocabulary.KueueLabel,
    vocabulary.AutoscalerAnnotation,
)
CONTRACT_WORDS: tuple[type[enum.StrEnum], ...] = (
    labels.Label,
    labels.PodKind,
    labels.Annotation,
    progress.AgentState,
    progress.RestartReason,
)
PRODUCT = ("operator/torchflex_operator", "agent/torchflex_agent", "contract", "e2e")
DEFINING = {
    REPO_ROOT / "operator/torchflex_operator/model/vocabulary.py",
    *(REPO_ROOT / "contract/torchflex_contract").glob("*.py"),
}
# Files that run stdlib-only (never import torchflex) keep their own copy of
# an env name; each copy must still be a name the contract defines.
STDLIB_ONLY = {REPO_ROOT / "agent/torchflex_agent/workers/zygote.py"}
# Kubernetes' own words, read from pods (``status.phase``, ``status.reason``,
# a container's ``terminated.reason``) or, in the process kubelet, written to
# them: they spell the same as some of the job's words but are not ours.
KUBERNETES_WORDS = frozenset(
    {"Pending", "Running", "Succeeded", "Failed", "Evicted", "NodeLost", "OOMKilled"}
)


def _product_files() -> Iterator[Path]:
    for root in PRODUCT:
        yield from sorted((REPO_ROOT / root).rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _enum_bodies(tree: ast.Module) -> set[int]:
    """ids of the nodes that define an enum's members (their values are definitions)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Attribute) and b.attr.endswith("Enum") for b in node.bases
        ):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.Expr):
                    out.update(id(n) for n in ast.walk(stmt))
    return out


def test_crd_names_are_the_contracts() -> None:
    for path in (
        REPO_ROOT / "crds/elasticjob.yaml",
        REPO_ROOT / "helm/torchflex/crds/elasticjob.yaml",
    ):
        (crd,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
        names = crd["spec"]["names"]
        assert crd["spec"]["group"] == labels.GROUP, path
        assert [v["name"] for v in crd["spec"]["versions"]] == [labels.VERSION], path
        assert names["kind"] == labels.KIND, path
        assert names["plural"] == labels.PLURAL, path
        assert names["shortNames"] == [labels.SHORT_NAME], path
        assert names["categories"] == [labels.CATEGORY], path
        assert crd["metadata"]["name"] == f"{labels.PLURAL}.{labels.GROUP}", path


def _api_doc_section(title: str) -> str:
    text = (REPO_ROOT / "docs/api.md").read_text()
    body = text.split(f"\n### {title}", 1)[1].split("\n", 1)[1]
    return re.split(r"\n##", body, maxsplit=1)[0]


def test_docs_list_exactly_the_condition_types_and_event_reasons() -> None:
    table = _api_doc_section("Conditions")
    types = set(re.findall(r"^\| `([A-Za-z]+)` \|", table, flags=re.M))
    assert types == {t.value for t in vocabulary.ConditionType}
    events = set(re.findall(r"`([A-Za-z]+)`", _api_doc_section("Events")))
    assert events == {r.value for r in vocabulary.EventReason}


def test_docs_name_every_phase_and_reason() -> None:
    text = (REPO_ROOT / "docs/api.md").read_text()
    for words in (vocabulary.Phase, vocabulary.Reason):
        missing = [w.value for w in words if f"`{w.value}`" not in text]
        assert not missing, f"docs/api.md does not name {words.__name__} {missing}"


# How docs/agent.md's exit-code table words what the operator does with a code.
_TREATMENT = {
    "job may complete": exit_codes.Disposition.SUCCEEDED,
    "permanent": exit_codes.Disposition.PERMANENT,
    "retryable, counted": exit_codes.Disposition.RETRYABLE_COUNTED,
    "retryable, free": exit_codes.Disposition.RETRYABLE_FREE,
    "not a failure": exit_codes.Disposition.RETRYABLE_FREE,
}


def test_docs_exit_code_table_is_the_contracts() -> None:
    rows = doc_table("agent.md", "## Exit codes")
    named = {(int(r[0]), r[1]) for r in rows if r[0].isdigit() and r[1].isupper()}
    assert named == {(c.value, c.name) for c in exit_codes.ExitCode}
    for row in rows:
        if row[0].isdigit():
            assert _TREATMENT[row[3]] is exit_codes.disposition(int(row[0])), row


def test_docs_key_table_names_every_store_key() -> None:
    """docs/agent.md's key table: job-wide keys as they are, per-round ones under
    ``rdzv/round/<r>/``, a trailing ``/<rank>``-like segment left off."""
    cells = [r[0] for r in doc_table("agent.md", "## Rendezvous protocol")]
    keys = set()
    for cell in cells:
        path = cell.strip("`").removeprefix(f"{store_keys.ROUND}/<r>/")
        keys.add(re.sub(r"/<[a-z]+>$", "", path))
    defined = {
        v
        for k, v in vars(store_keys).items()
        if k.isupper() and isinstance(v, str) and k not in ("ROOT", "ROUND")
    }
    assert keys == defined


def test_every_word_is_used_by_product_code() -> None:
    """A word no code uses is a promise nothing keeps (an Event never posted,
    an annotation never written): remove it, or make the code use it."""
    used: set[tuple[str, str]] = set()
    for path in _product_files():
        tree = _tree(path)
        skip = _enum_bodies(tree) if path in DEFINING else set()
        for node in ast.walk(tree):
            if (
                id(node) not in skip
                and isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
            ):
                used.add((node.value.id, node.attr))
    groups: tuple[type[enum.Enum], ...] = (*STATUS_WORDS, *CONTRACT_WORDS, exit_codes.ExitCode)
    unused = [
        f"{words.__name__}.{w.name}"
        for words in groups
        for w in words
        if (words.__name__, w.name) not in used
    ]
    assert not unused


def _closed_strings() -> dict[str, str]:
    """Every word product code must name through its enum or constant, and that name."""
    words: dict[str, str] = {}
    # Role values are left out: "worker", "store" and "etcd" also name
    # containers, a backend, a binary and a CLI subcommand.
    for group in (*STATUS_WORDS, *(g for g in CONTRACT_WORDS if g is not labels.PodKind)):
        for w in group:
            if w.value and w.value not in KUBERNETES_WORDS:
                words.setdefault(w.value, f"{group.__name__}.{w.name}")
    for name, value in vars(env).items():
        if name.isupper() and isinstance(value, str) and value.startswith(env.PREFIX):
            words[value] = f"env.{name}"
    return words


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of the string constants of ``path`` outside enum definitions."""
    tree = _tree(path)
    skip = _enum_bodies(tree)
    for node in ast.walk(tree):
        if id(node) not in skip and isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_product_code_spells_no_word_of_the_vocabulary() -> None:
    words = _closed_strings()
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {text!r} is {words[text]}"
        for path in _product_files()
        if path not in DEFINING | STDLIB_ONLY
        for line, text in _strings(path)
        if text in words
    ]
    assert not found


def test_stdlib_only_copies_of_env_names_are_the_contracts() -> None:
    names = {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str)}
    for path in STDLIB_ONLY:
        copies = [(line, t) for line, t in _strings(path) if re.fullmatch(r"TORCHFLEX_[A-Z_]+", t)]
        assert [c for c in copies if c[1] not in names] == [], path
