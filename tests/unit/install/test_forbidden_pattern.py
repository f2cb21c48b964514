"""The install tests' "denied call" pattern: it must see every refusal and nothing else.

A UID ending in ``...db403`` once matched it and made the HA install test fail at random
(issue 19); these cases pin the pattern both ways.
"""

from __future__ import annotations

import pytest

from tests.integration.install.release import FORBIDDEN, _warning_or_plain


@pytest.mark.parametrize(
    "line",
    [
        "reconcile ns/a: get elasticjob ns/a: HTTP 403 Forbidden",
        '{"message": "create pod: (403)", "severity": "error"}',
        "pods is forbidden: User cannot list resource",
        "Not enough permissions to watch for resources",
    ],
)
def test_a_refusal_is_seen(line: str) -> None:
    assert FORBIDDEN.search(line)


@pytest.mark.parametrize(
    "line",
    [
        '{"uid": "3f9220cc-4517-4cdd-9eb4-6486025db403", "severity": "info"}',
        '{"uid": "4030aaaa-0000-0000-0000-000000000000"}',
        '"timestamp": "2026-11-23T21:52:55.403+00:00"',
        "step=14030 loss=0.4031",
    ],
)
def test_ids_times_and_numbers_are_not_refusals(line: str) -> None:
    assert not FORBIDDEN.search(line)


@pytest.mark.parametrize(
    ("line", "accepted"),
    [
        ('{"message": "operator rights withdrawn: x", "severity": "warn"}', True),
        ('{"message": "operator rights withdrawn: x", "severity": "warning"}', True),
        ('{"message": "operator rights withdrawn: x", "severity": "error"}', False),
        ("operator rights withdrawn: x", True),  # logFormat plain carries no level
    ],
)
def test_the_rights_withdrawn_line_must_be_a_warning(line: str, accepted: bool) -> None:
    assert _warning_or_plain(line) is accepted
