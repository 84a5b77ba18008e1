"""POST /v1/ingest/{kind} refuses a JSON field nested past ``MAX_DEPTH`` with a 422 naming the
item and the field, and stores nothing of the batch (kortex/telemetry/ingest.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from kortex.nesting import MAX_DEPTH
from kortex.timeparse import isoformat, utcnow
from tests.api.conftest import bearer
from tests.conftest import Harness


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_tags_nested_too_deeply_are_a_422_naming_the_field(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    span = {"trace_id": "t1", "span_id": "s1", "service": "billing", "operation": "op",
            "start": isoformat(utcnow() - timedelta(minutes=1)), "duration_us": 5}
    deep = {**span, "span_id": "s2", "parent_span_id": "s1", "tags": _nested(300)}
    response = client.post("/v1/ingest/spans", json={"items": [span, deep]}, headers=bearer(key))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_items" and "nothing was stored" in error["message"]
    [detail] = error["details"]
    assert (detail["index"], detail["field"]) == (1, "tags")
    assert f"nested deeper than {MAX_DEPTH} levels" in detail["message"]
    assert harness.call(tenant, "get_traces", {"request_id": "t1"}).error_code == "not_found"

    fits = {**span, "tags": _nested(MAX_DEPTH)}
    assert client.post("/v1/ingest/spans", json={"items": [fits]}, headers=bearer(key)).status_code == 200
    traced = harness.call(tenant, "get_traces", {"request_id": "t1"})
    assert not traced.is_error and traced.content["root"]["tags"] == _nested(MAX_DEPTH)
