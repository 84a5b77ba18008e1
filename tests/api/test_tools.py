"""GET /v1/tools: the catalog a tenant's sessions may call."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import bearer
from tests.conftest import Harness

RFC_005 = {"get_logs", "get_metrics", "get_traces", "compare_to_baseline", "get_recent_deploys",
           "get_incident_history", "get_admin_info", "propose_action"}
LLM_OPS = {"get_deployment_status", "get_active_incidents", "get_recent_requests", "get_request_detail",
           "get_user_context", "get_latency_trends", "get_quality_summary", "get_request_volume"}


def test_the_catalog_lists_every_allowed_tool_with_schema_effect_and_timeout(client: TestClient,
                                                                               harness: Harness) -> None:
    key = harness.api_key(harness.tenant("acme"))
    assert client.get("/v1/tools").status_code == 401
    tools = {t["name"]: t for t in client.get("/v1/tools", headers=bearer(key)).json()["tools"]}
    assert RFC_005 | LLM_OPS <= set(tools)
    logs = tools["get_logs"]
    assert logs["effect"] == "read_only" and logs["category"] == "query"
    assert (logs["timeout_s"], logs["max_timeout_s"]) == (30.0, 300.0)
    assert logs["input_schema"]["required"] == ["product", "time_range"]
    assert logs["input_schema"]["properties"]["limit"]["maximum"] == 100
    assert tools["propose_action"]["effect"] == "state_change" and tools["propose_action"]["timeout_s"] == 5.0
    assert tools["compare_to_baseline"]["timeout_s"] == 10.0 and tools["get_incident_history"]["timeout_s"] == 5.0
    assert "NEVER" in tools["propose_action"]["description"]


def test_the_catalog_follows_the_policy_and_the_timeout_overrides(harness_factory) -> None:
    h = harness_factory(tools={"allowed": ["get_logs", "get_request_volume"]},
                        llm={"tools": {"get_logs": {"timeout": "45s"}, "get_request_volume": {"timeout": "5m"}}})
    key = h.api_key(h.tenant("acme"))
    with TestClient(create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)) as c:
        tools = {t["name"]: t for t in c.get("/v1/tools", headers=bearer(key)).json()["tools"]}
    assert set(tools) == {"get_logs", "get_request_volume"}  # deny by default: nothing else, not even debug tools
    assert tools["get_logs"]["timeout_s"] == 45.0
    assert tools["get_request_volume"]["timeout_s"] == 60.0  # clamped to the analysis ceiling
