"""POST /v1/ingest/{kind}: tenant-scoped, validated, all-or-nothing batches."""

from __future__ import annotations

import json
from datetime import timedelta

from fastapi.testclient import TestClient

from kortex.timeparse import isoformat, utcnow
from tests.api.conftest import bearer
from tests.conftest import Harness


def test_ingested_telemetry_is_what_the_tools_read_for_that_tenant(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    now = utcnow()
    logs = [{"product": "billing", "ts": isoformat(now - timedelta(minutes=i)), "level": "error" if i % 2 else "info",
             "message": f"invoice {i} failed: upstream timeout", "host": "billing-1"} for i in range(1, 121)]
    response = client.post("/v1/ingest/logs", json={"items": logs}, headers=bearer(key))
    assert response.status_code == 200 and response.json() == {"kind": "logs", "accepted": 120}
    deploy = {"product": "billing", "ts": isoformat(now - timedelta(minutes=30)), "version": "v9", "commit": "abc"}
    assert client.post("/v1/ingest/deploys", json={"items": [deploy]}, headers=bearer(key)).status_code == 200
    metrics = [{"product": "billing", "metric": "queue_depth", "ts": isoformat(now - timedelta(minutes=i)),
                "value": float(i), "labels": {"queue": "invoices"}} for i in range(1, 11)]
    assert client.post("/v1/ingest/metrics", json={"items": metrics}, headers=bearer(key)).json()["accepted"] == 10
    span = {"trace_id": "t1", "span_id": "s1", "service": "billing", "operation": "POST /invoice",
            "start": isoformat(now - timedelta(minutes=1)), "duration_us": 1200, "status": "error",
            "error_message": "upstream timeout"}
    for _ in range(2):  # a retried batch of spans is stored once
        assert client.post("/v1/ingest/spans", json={"items": [span]}, headers=bearer(key)).status_code == 200
    incident = {"ref": "INC-7", "product": "billing", "title": "invoices stuck", "opened_at": isoformat(now)}
    assert client.post("/v1/ingest/incidents", json={"items": [incident]}, headers=bearer(key)).status_code == 200

    errors = harness.call(tenant, "get_logs", {"product": "billing", "time_range": "last 3h", "level": "error"})
    assert errors.content["total_matches"] == 60
    assert harness.call(tenant, "get_recent_deploys", {"product": "billing", "time_range": "last 1h"}) \
        .content["deploys"][0]["version"] == "v9"
    series = harness.call(tenant, "get_metrics", {"product": "billing", "metric_name": "queue_depth",
                                                  "time_range": "last 1h", "labels": {"queue": "invoices"}})
    assert len(series.content["samples"]) == 10
    assert harness.call(tenant, "get_traces", {"request_id": "t1"}).content["span_count"] == 1
    assert harness.call(tenant, "get_active_incidents", {}).content["incidents"][0]["id"] == "INC-7"
    other = harness.tenant("other")
    assert harness.call(other, "get_logs", {"product": "billing", "time_range": "last 3h"}) \
        .content["total_matches"] == 0


def test_a_batch_with_bad_items_is_rejected_whole_naming_them(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    now = utcnow()
    good = {"product": "billing", "ts": isoformat(now), "level": "info", "message": "ok"}
    items = [good, {**good, "level": "loud"}, {**good, "ts": "2026-04-07T14:00:00"},
             {**good, "ts": isoformat(now + timedelta(hours=2))}, {**good, "message": "x" * 20_000},
             {**good, "secret_field": 1}, "not an object"]
    response = client.post("/v1/ingest/logs", json={"items": items}, headers=bearer(key))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_items" and "nothing was stored" in error["message"]
    by_index = {}
    for detail in error["details"]:
        by_index.setdefault(detail["index"], []).append(detail)
    assert sorted(by_index) == [1, 2, 3, 4, 5, 6]
    assert by_index[1][0]["field"] == "level" and "time zone" in by_index[2][0]["message"]
    assert "future" in by_index[3][0]["message"] and by_index[3][0]["field"] == "ts"
    assert by_index[5][0]["field"] == "secret_field"
    assert harness.call(tenant, "get_logs", {"product": "billing", "time_range": "last 1h"}) \
        .content["total_matches"] == 0
    nan = {"product": "b", "metric": "m", "ts": isoformat(now), "value": "NaN"}
    assert client.post("/v1/ingest/metrics", json={"items": [nan]}, headers=bearer(key)).status_code == 422
    closed_early = {"ref": "INC-1", "title": "t", "opened_at": isoformat(now), "closed_at": isoformat(
        now - timedelta(hours=1))}
    refused = client.post("/v1/ingest/incidents", json={"items": [closed_early]}, headers=bearer(key))
    assert refused.status_code == 422 and refused.json()["error"]["details"][0]["field"] == "closed_at"


def test_a_timestamp_that_leaves_the_calendar_in_utc_is_a_422_naming_it(client: TestClient, harness: Harness) -> None:
    key = harness.api_key(harness.tenant("acme"))
    for moment in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        item = {"product": "billing", "ts": moment, "level": "info", "message": "m"}
        response = client.post("/v1/ingest/logs", json={"items": [item]}, headers=bearer(key))
        assert response.status_code == 422, response.json()
        assert response.json()["error"]["details"][0]["field"] == "ts"


def test_non_finite_numbers_are_a_422_naming_the_field(client: TestClient, harness: Harness) -> None:
    key = harness.api_key(harness.tenant("acme"))
    user = {"user_id": "u1", "tier": "premium", "daily_budget_usd": "__X__"}
    for literal in ("Infinity", "1e400", "NaN"):  # what Python's JSON parser lets through
        body = json.dumps({"items": [user]}).replace('"__X__"', literal)
        response = client.post("/v1/ingest/llm-users", content=body.encode(),
                               headers={**bearer(key), "Content-Type": "application/json"})
        assert response.status_code == 422, (literal, response.json())
        assert response.json()["error"]["details"][0]["field"] == "daily_budget_usd"


def test_limits_kinds_and_auth(client: TestClient, harness: Harness) -> None:
    key = harness.api_key(harness.tenant("acme"))
    item = {"product": "b", "ts": isoformat(utcnow()), "level": "info", "message": "m"}
    assert client.post("/v1/ingest/logs", json={"items": [item]}).status_code == 401
    assert client.post("/v1/ingest/logs", json={"items": []}, headers=bearer(key)).status_code == 422
    too_many = client.post("/v1/ingest/logs", json={"items": [{"a": 1}] * 5001}, headers=bearer(key))
    assert too_many.status_code == 422
    unknown = client.post("/v1/ingest/tweets", json={"items": [item]}, headers=bearer(key))
    assert unknown.status_code == 404 and "logs" in unknown.json()["error"]["message"]
    huge = client.post("/v1/ingest/logs", json={"items": [{**item, "message": "x" * 16_000}] * 80},
                       headers=bearer(key))
    assert huge.status_code == 413


def test_ids_that_ingest_accepts_are_ids_the_tools_accept(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    now = utcnow()
    model, user, deployment = "meta-llama/Llama-3-70b", "a+b@x.com", "meta-llama/Llama-3-70b/k8s"
    users = [{"user_id": user, "tier": "premium"}]
    deployments = [{"deployment_id": deployment, "model_id": model, "backend_id": "k8s", "status": "degraded",
                    "updated_at": isoformat(now)}]
    requests = [{"request_id": "chatcmpl-9x/0=", "user_id": user, "user_tier": "premium", "deployment_id": deployment,
                 "model_id": model, "backend_id": "k8s", "latency_ms": 900, "status": "success",
                 "task_type": "code-review", "created_at": isoformat(now - timedelta(minutes=2))}]
    for kind, items in (("llm-users", users), ("llm-deployments", deployments), ("llm-requests", requests)):
        response = client.post(f"/v1/ingest/{kind}", json={"items": items}, headers=bearer(key))
        assert response.status_code == 200, response.json()
    for name, args in (("get_user_context", {"user_id": user}), ("get_request_detail", {"request_id": "chatcmpl-9x/0="}),
                       ("get_recent_requests", {"model_id": model, "user_id": user, "deployment_id": deployment}),
                       ("get_deployment_status", {"model_id": model}),
                       ("get_latency_trends", {"deployment_id": deployment, "model_id": model}),
                       ("get_quality_summary", {"model_id": model, "task_type": "code-review"})):
        result = harness.call(tenant, name, args)
        assert not result.is_error, (name, result.content)
    assert harness.call(tenant, "get_recent_requests", {"model_id": model}).content["count"] == 1
    for bad in ("two words", 'quo"te', "{brace}", "back\\slash"):  # refused alike on both sides
        refused = client.post("/v1/ingest/llm-users", json={"items": [{"user_id": bad, "tier": "premium"}]},
                              headers=bearer(key))
        assert refused.status_code == 422, bad
        assert harness.call(tenant, "get_user_context", {"user_id": bad}).error_code == "validation"


def test_ingest_and_tools_share_their_id_patterns() -> None:
    from kortex.telemetry import ingest
    from kortex.tools.builtin.get_recent_requests import GetRecentRequestsInput

    tool = GetRecentRequestsInput.model_json_schema()["properties"]
    item = ingest.LLMRequestItem.model_json_schema()["properties"]
    for field in ("user_id", "model_id", "backend_id", "deployment_id"):
        tool_pattern = next(o["pattern"] for o in tool[field]["anyOf"] if "pattern" in o)
        assert tool_pattern == item[field]["pattern"], field
