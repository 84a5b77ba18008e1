"""``scrub`` at any depth (kortex/redaction.py): data nested past ``MAX_DEPTH`` (a remote
source's answer, a plugin's result) is scrubbed exactly as shallow data is, without a
RecursionError, whose ~500 levels used to be enough to fail the call that scrubbed it."""

from __future__ import annotations

from typing import Any

import pytest

from kortex.nesting import MAX_DEPTH
from kortex.redaction import REDACTED, scrub


def _wrap(inner: Any, depth: int) -> Any:
    """``inner`` under ``depth`` levels of alternating objects and lists."""
    value = inner
    for n in range(depth):
        value = {"level": n, "next": value} if n % 2 else [value, "Bearer abcdefghijkl"]
    return value


def _unwrap(value: Any, depth: int) -> Any:
    for n in reversed(range(depth)):
        if n % 2:
            assert value["level"] == n
            value = value["next"]
        else:
            assert value[1] == f"Bearer {REDACTED}"  # every level was scrubbed
            value = value[0]
    return value


LEAF = {"password": "hunter2", "enabled": True, "api_key": None, "note": "token=abc123def456", "n": 1.5,
        "ids": ("a", "b")}
SCRUBBED = {"password": REDACTED, "enabled": True, "api_key": None, "note": f"token={REDACTED}", "n": 1.5,
            "ids": ["a", "b"]}


@pytest.mark.parametrize("depth", [0, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 600, 50_000])
def test_scrub_is_the_same_at_any_depth(depth: int) -> None:
    assert scrub(LEAF) == SCRUBBED
    assert _unwrap(scrub(_wrap(LEAF, depth)), depth) == SCRUBBED


def test_past_max_depth_keys_keep_their_order_and_secret_subtrees_are_dropped_whole() -> None:
    leaf = {"z": 1, "secret": {"deep": ["kept out"]}, "a": [{"token": ["x"]}, "plain"], "m": None}
    out = _unwrap(scrub(_wrap(leaf, MAX_DEPTH + 3)), MAX_DEPTH + 3)
    assert list(out) == ["z", "secret", "a", "m"]
    assert out == {"z": 1, "secret": REDACTED, "a": [{"token": REDACTED}, "plain"], "m": None}
