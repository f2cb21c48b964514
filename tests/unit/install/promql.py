"""The metric names a PromQL expression (or a Grafana template query) reads, and the
series the operator exports, for the tests that hold the chart's dashboard and alert
rules to the operator's metrics.

Where it sits: imported by ``test_chart_dashboard.py`` and ``test_chart_alerts.py``.
The names come from a small lexer, not a full parser: string literals, label
matchers, range and subquery brackets and the label lists of ``by``/``without``/
``on``/``ignoring``/``group_*`` are dropped, then every identifier that is not a
keyword, a number's exponent or a duration's unit, and is not followed by ``(``
(a function or an aggregation), names a series. Grafana's ``$variables`` are
replaced first. The exported series come from a fresh ``Metrics`` registry, so a
series the operator stops exporting fails the tests at once.
"""

from __future__ import annotations

import re

from prometheus_client.core import Metric

from torchflex_operator.runtime.metrics import Metrics

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
)
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Grafana's template variables ($name, ${name}, [[name]]) and built-ins ($__rate_interval).
GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
# Suffixes of the series a family of each type writes.
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("", "_count", "_sum"),
    "info": ("_info",),
}


def metric_names(expr: str) -> set[str]:
    """The series names ``expr`` selects."""
    text = GRAFANA_VAR.sub("1", expr)
    text = STRING.sub('""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = LABEL_LIST.sub(" ", text)
    names: set[str] = set()
    for m in IDENT.finditer(text):
        word = m[0]
        before = text[m.start() - 1] if m.start() else " "
        if before.isdigit() or before == ".":
            continue  # 1e3, 5m: part of a number or a duration
        if text[m.end() :].lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def template_query_names(query: str) -> set[str]:
    """The series a Grafana Prometheus template query reads: ``label_values(metric,
    label)``, ``label_values(label)`` (none), ``metrics(regex)`` (none) or
    ``query_result(expr)``."""
    query = query.strip()
    m = re.fullmatch(r"label_values\((.*),\s*\w+\s*\)", query, re.S)
    if m:
        return metric_names(m[1])
    if re.fullmatch(r"(label_values|label_names|metrics)\([^,]*\)", query):
        return set()
    m = re.fullmatch(r"query_result\((.*)\)", query, re.S)
    if m:
        return metric_names(m[1])
    raise ValueError(f"not a Grafana Prometheus template query: {query!r}")


def families() -> list[Metric]:
    """The metric families a fresh operator registry describes (every one, with or
    without samples: the per-job collector yields its families with no jobs too)."""
    return list(Metrics().registry.collect())


def exported_series() -> set[str]:
    """Every series name the operator's ``/metrics`` can serve."""
    return {f.name + suffix for f in families() for suffix in SUFFIXES[f.type]}
