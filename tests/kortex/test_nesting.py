"""The one depth limit (kortex/nesting.py) and its check, which answers at any depth."""

from __future__ import annotations

from typing import Any

import pytest

from kortex.nesting import MAX_DEPTH, deeper_than


def _lists(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("value", "depth"), [
    ("x", 0), (1, 0), (None, 0), ({}, 1), ([], 1), ((1, 2), 1), ({"a": [1]}, 2), ([{"a": {}}, 3], 3),
    ({"a": "x", "b": {"c": [[]]}}, 4), (_lists(MAX_DEPTH), MAX_DEPTH)])
def test_depth_counts_containers(value: Any, depth: int) -> None:
    assert not deeper_than(value, depth)
    assert deeper_than(value, depth - 1) or depth == 0


def test_the_default_limit_is_max_depth_and_any_depth_is_answered() -> None:
    assert not deeper_than(_lists(MAX_DEPTH)) and deeper_than(_lists(MAX_DEPTH + 1))
    assert deeper_than(_lists(200_000))  # far past Python's recursion limit
    wide = {str(n): [n, {"x": n}] for n in range(10_000)}
    assert not deeper_than(wide, 3) and deeper_than(wide, 2)
