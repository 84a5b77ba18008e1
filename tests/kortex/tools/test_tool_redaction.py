"""Secrets in telemetry never reach the model, whatever their key is called and however deep
an allowlisted subtree holds them (admin info, span tags, routing decisions, proposal params)."""

from __future__ import annotations

import json
from datetime import timedelta

from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from tests.conftest import Harness

SECRETS = {
    "db_password": "pw-0001", "aws_secret_access_key": "aws-0002", "x-api-key": "xak-0003", "stripe_key": "stk-0004",
    "pass": "pass-0005", "slack": "https://hooks.slack.com/services/T1/B1/hook0006", "clientSecret": "cs-0007",
    "dsn": "postgres://app:dsn0008@db/x", "callback": "https://cb.example.com/x?access_token=tok0009",
}
KEPT = {"pool_max_size": 10, "region": "eu-west-1", "auth_enabled": True}


def _leaks(content: object) -> list[str]:
    text = json.dumps(content)
    return [v for v in ("pw-0001", "aws-0002", "xak-0003", "stk-0004", "pass-0005", "hook0006", "cs-0007", "dsn0008",
                        "tok0009") if v in text]


def _write(h: Harness, tenant: str, kind: str, rows: list[dict]) -> None:
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, kind, rows)


def test_admin_info_subtrees_are_scrubbed(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _write(harness, tenant, "products", [{"product": "vault", "updated_at": utcnow(), "info": {
        "version": "1.0", "config": {**SECRETS, **KEPT, "nested": {"db": dict(SECRETS)}},
        "build": {"commit": "abc", "ci_token": "ci-0010", **SECRETS}, "feature_flags": {"beta": True, **SECRETS}}}])
    info = harness.call(tenant, "get_admin_info", {"product": "vault"}).content
    assert _leaks(info) == [] and "ci-0010" not in json.dumps(info)
    assert {k: info["config"][k] for k in KEPT} == KEPT and info["build"]["commit"] == "abc"
    assert info["feature_flags"]["beta"] is True


def test_span_tags_are_scrubbed(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _write(harness, tenant, "spans", [{
        "trace_id": "tr1", "span_id": "s1", "parent_span_id": None, "request_id": None, "service": "api",
        "operation": "GET /", "start_ts": utcnow() - timedelta(minutes=1), "duration_us": 10, "status": "ok",
        "error_message": "upstream said password=pw-0001", "tags": {**SECRETS, **KEPT}}])
    trace = harness.call(tenant, "get_traces", {"request_id": "tr1"}).content
    assert _leaks(trace) == [] and trace["root"]["tags"]["region"] == "eu-west-1"


def test_routing_decisions_are_scrubbed(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _write(harness, tenant, "llm-requests", [{
        "request_id": "req_1", "user_id": "u1", "user_tier": "premium", "deployment_id": "gpt-4/aws",
        "model_id": "gpt-4", "backend_id": "aws", "task_type": "chat", "input_tokens": 1, "output_tokens": 1,
        "cost_usd": 0.0, "latency_ms": 5, "status": "success", "quality_score": None, "router_version": "r1",
        "experiment_id": None, "created_at": utcnow() - timedelta(minutes=1),
        "routing": {"decision": "cheapest", "backend_auth": {"x-api-key": "xak-0003"}, **SECRETS}}])
    detail = harness.call(tenant, "get_request_detail", {"request_id": "req_1"}).content
    assert _leaks(detail) == [] and detail["request"]["routing_decision"]["decision"] == "cheapest"


def test_proposal_params_are_scrubbed_in_the_result_the_card_and_the_store(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    result = harness.call(tenant, "propose_action", {
        "action": "rotate-key", "product": "checkout", "params": {**SECRETS, "host": "db1"},
        "rationale": "leaked stripe_key=stk-0004"}, turn_id="01a2b3c4-0000-7000-8000-000000000001")
    assert not result.is_error
    stored = harness.k.proposals.get(tenant, result.content["proposal_id"])
    assert _leaks(stored.params) == [] and _leaks(stored.rationale) == [] and stored.params["host"] == "db1"
