"""Ingest bounds the depth of its JSON fields (logs' attrs, spans' tags, products' info, LLM
requests' routing), not only their size: 8 KiB nests hundreds of levels deep, and a trace whose
tags did could be stored but never returned (get_traces' result could not be published, and its
tool call hung until the watchdog timed it out). Past ``MAX_DEPTH`` the item is refused, naming
the field, like every other ingest refusal."""

from __future__ import annotations

from typing import Any

import pytest

from kortex.errors import InvalidInput
from kortex.nesting import MAX_DEPTH
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from tests.kortex.telemetry.test_ingest import GOOD

NOW = utcnow()
FIELDS = [("logs", "attrs"), ("spans", "tags"), ("products", "info"), ("llm-requests", "routing")]


def _nested(depth: int) -> Any:
    """A JSON object ``depth`` levels deep (the field's own object is the first)."""
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(("kind", "field"), FIELDS)
def test_a_json_field_may_nest_max_depth_levels(kind: str, field: str) -> None:
    [row] = ingest.validate_batch(kind, [{**GOOD[kind], field: _nested(MAX_DEPTH)}], now=NOW)
    assert row[field] == _nested(MAX_DEPTH)


@pytest.mark.parametrize(("kind", "field"), FIELDS)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 50_000])  # 50,000: past Python's recursion
def test_a_json_field_nested_deeper_is_refused_naming_it(kind: str, field: str, depth: int) -> None:
    with pytest.raises(InvalidInput) as caught:
        ingest.validate_batch(kind, [GOOD[kind], {**GOOD[kind], field: _nested(depth)}], now=NOW)
    assert caught.value.code == "invalid_items"
    [detail] = caught.value.details
    assert detail["index"] == 1 and detail["field"] == field
    assert f"nested deeper than {MAX_DEPTH} levels" in detail["message"]


def test_a_nul_inside_a_json_field_is_still_found_at_its_deepest_allowed_level() -> None:
    tags = _nested(MAX_DEPTH - 1)
    inner = tags
    for _ in range(MAX_DEPTH - 2):
        inner = inner["a"]
    inner["a"] = {"k": "nul \x00 here"}  # the field's object and MAX_DEPTH - 1 more levels
    with pytest.raises(InvalidInput) as caught:
        ingest.validate_batch("spans", [{**GOOD["spans"], "tags": tags}], now=NOW)
    [detail] = caught.value.details
    assert detail["field"].startswith("tags.a.a") and detail["field"].endswith(".k")
    assert "NUL" in detail["message"]

