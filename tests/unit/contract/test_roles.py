"""The role sizes both sides write and read (``torchflex_contract.roles``): a table."""

from __future__ import annotations

import pytest

from torchflex_contract.roles import (
    RoleSize,
    RoleSizesError,
    format_role_sizes,
    parse_role_sizes,
    role_name_problem,
)


def test_role_sizes_round_trip_in_order() -> None:
    sizes = (RoleSize("trainer", 2, 2), RoleSize("reader", 1, 4))
    text = format_role_sizes(sizes)
    assert text == "trainer=2:2,reader=1:4"
    assert parse_role_sizes(text) == sizes


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("trainer", "NAME=MIN:MAX"),
        ("trainer=2", "NAME=MIN:MAX"),
        ("trainer=a:2", "NAME=MIN:MAX"),
        ("trainer=3:2", "1 <= MIN <= MAX"),
        ("trainer=0:2", "1 <= MIN <= MAX"),
        ("trainer=1:1,trainer=1:2", "appears twice"),
        ("Trainer=1:1", "DNS label"),
        ("store=1:1", "reserved"),
        ("default=1:1", "reserved"),
    ],
)
def test_bad_role_sizes_name_the_problem(text: str, says: str) -> None:
    with pytest.raises(RoleSizesError, match=says):
        parse_role_sizes(text)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("reader", True), ("ps", True), ("rollout-2", True), ("2ps", False), ("a" * 21, False)],
)
def test_role_names(name: str, ok: bool) -> None:
    assert (role_name_problem(name) is None) is ok
