"""The chart's default values start the operator with the operator's own defaults.

values.yaml restates most operator flags so that users can see and set them;
each restated value is a second copy of a default in
``torchflex_operator.model.settings`` / ``cli``. Rendered with its defaults, the chart
must pass the operator nothing it would not assume itself, except the few
flags the chart decides for a cluster install (named below, each with why).
"""

from __future__ import annotations

from tests.unit.install.chart import operator_container, render
from torchflex_operator import cli

# Flags the chart sets on purpose to something else than the operator's default.
CHART_CHOICES = {
    "all_namespaces": "the chart names its watch mode (cluster-wide by default)",
    "standalone": "one replica, no peering, unless replicaCount > 1",
    "log_format": "json, for log collectors",
    "operator_pod_namespace": "the release's namespace, named in each job's NetworkPolicy",
    "operator_pod_label": "the release's pod labels, named in each job's NetworkPolicy",
}


def test_default_values_pass_the_operators_own_defaults() -> None:
    parser = cli.parser()
    rendered = vars(parser.parse_args(operator_container(render({}))["args"]))
    own = vars(parser.parse_args([]))
    differ = {k for k in rendered.keys() | own.keys() if rendered.get(k) != own.get(k)}
    assert differ == set(CHART_CHOICES), {k: (own.get(k), rendered.get(k)) for k in differ}
