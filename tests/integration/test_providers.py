"""Turns through each HTTP provider on the real stack: the API under uvicorn, a Celery worker
process streaming from the fake LLM server over its real wire format, PostgreSQL and Redis."""

from __future__ import annotations

import httpx
import pytest

from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.integration.sse import read_events
from tests.integration.test_turns import auth, start_turn, wait_done

pytestmark = pytest.mark.integration

DEPLOYS = {"product": "checkout", "time_range": "last 2h"}


@pytest.fixture(scope="module")
def tenant(pg: Harness) -> tuple[str, str]:
    tenant_id = pg.tenant("llm-vendors")
    pg.seed(tenant_id)
    return tenant_id, pg.api_key(tenant_id)


@pytest.mark.parametrize(("spec", "price"), [("anthropic:claude-sonnet-4-6", (3.0, 15.0)),
                                             ("openai:gpt-4o", (2.5, 10.0)), ("ollama:llama3.2", (0.0, 0.0))])
def test_a_tool_turn_through_each_vendor_wire_format(api_url: str, pg: Harness, tenant, fake_llm: FakeLLM,
                                                     spec: str, price: tuple[float, float]) -> None:
    _, key = tenant
    vendor, model = spec.split(":", 1)
    fake_llm.add(model, {"steps": [
        {"text": ["Checking ", "recent deploys."], "usage": {"input_tokens": 2000, "output_tokens": 50},
         "tool_calls": [{"id": f"call_{vendor}", "name": "get_recent_deploys", "arguments": DEPLOYS, "fragments": 4}]},
        {"text": ["Deploy v2.14.0 ", "exhausted the pool."], "usage": {"input_tokens": 3000, "output_tokens": 80}}]})
    started = start_turn(api_url, key, f"why is checkout slow? ({vendor})", model=spec)
    events = read_events(api_url + started["events_url"], key)
    assert [e.event for e in events] == ["turn", "text", "text", "tool_call", "tool_result", "turn", "text", "text",
                                         "done"]
    assert events[0].data["model"] == spec and events[3].data["arguments"] == DEPLOYS
    assert events[4].data["content"]["deploys"][0]["version"] == "v2.14.0"
    assert "".join(e.data["delta"] for e in events if e.event == "text") == \
        "Checking recent deploys.Deploy v2.14.0 exhausted the pool."
    turn = wait_done(api_url, key, started["turn_id"])
    assert turn["status"] == "done" and turn["model_used"] == spec
    assert (turn["usage"]["input_tokens"], turn["usage"]["output_tokens"]) == (5000, 130)
    assert turn["usage"]["cost_usd"] == pytest.approx((5000 * price[0] + 130 * price[1]) / 1e6)
    last = [r for r in fake_llm.requests if r.body and r.body.get("model") == model][-1].body
    assert "v2.14.0" in str(last["messages"][-1])  # the tool result went back to the model


def test_providers_endpoint_on_the_running_api(api_url: str, tenant) -> None:
    _, key = tenant
    body = httpx.get(f"{api_url}/v1/llm/providers", headers=auth(key)).json()
    by_name = {p["name"]: p for p in body["providers"]}
    assert by_name["anthropic"]["available"] and by_name["openai"]["available"]
    assert by_name["ollama"]["reachable"] is True
    assert "test-key" not in str(body)


def test_kortex_ask_against_the_running_api_streams_a_vendor_answer(api_url: str, tenant, fake_llm: FakeLLM) -> None:
    import json

    from typer.testing import CliRunner

    from kortex_cli.main import app

    _, key = tenant
    fake_llm.add("claude-haiku-4-6", {"steps": [
        {"text": ["Looking."], "usage": {"input_tokens": 1000, "output_tokens": 10},
         "tool_calls": [{"id": "toolu_cli", "name": "get_recent_deploys", "arguments": DEPLOYS, "fragments": 3}]},
        {"text": ["Deploy v2.14.0 ", "did it [toolu_cli]."], "usage": {"input_tokens": 2000, "output_tokens": 20}}]})
    result = CliRunner().invoke(app, ["ask", "why is checkout slow?", "--url", api_url, "--api-key", key,
                                      "--model", "anthropic:claude-haiku-4-6", "--json"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds == ["turn", "text", "tool_call", "tool_result", "turn", "text", "text", "done"]
    assert "".join(e["data"]["delta"] for e in events if e["event"] == "text") == \
        "Looking.Deploy v2.14.0 did it [toolu_cli]."
    assert events[3]["data"]["content"]["deploys"][0]["version"] == "v2.14.0"
    assert events[-1]["data"]["status"] == "done" and events[-1]["data"]["usage"]["input_tokens"] == 3000

    refused = CliRunner().invoke(app, ["ask", "why?", "--url", api_url, "--api-key", "kx_wrong"])
    assert refused.exit_code != 0
