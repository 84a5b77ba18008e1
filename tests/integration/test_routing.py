"""Routing on the real stack: a turn with model "auto" through the API under uvicorn and a
Celery worker, the fake LLM answering as Anthropic. The `route`, `anomaly` and `recovery` events
reach the client in order on the SSE stream, and the same decisions are in the audit."""

from __future__ import annotations

import pytest

from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.integration.sse import read_events
from tests.integration.test_turns import start_turn, wait_done

pytestmark = pytest.mark.integration


def test_route_anomaly_and_recovery_events_in_order_on_the_stream_and_in_the_audit(
        api_url: str, pg: Harness, fake_llm: FakeLLM) -> None:
    tenant = pg.tenant("routing")
    key = pg.api_key(tenant)
    fake_llm.add("claude-haiku-4-6", {"steps": [{"text": []}]})  # the cheap model says nothing
    fake_llm.add("claude-sonnet-4-6", {"steps": [{"text": ["Checkout is up; ", "every check passed."]}]})
    started = start_turn(api_url, key, "Is checkout up?", model="auto")
    events = read_events(api_url + started["events_url"], key)
    kinds = [e.event for e in events]
    assert kinds[0] == "turn" and kinds[-1] == "done", kinds
    assert kinds.index("route") < kinds.index("anomaly") < kinds.index("recovery") < kinds.index("text"), kinds
    route, anomaly, recovery = (next(e.data for e in events if e.event == k) for k in ("route", "anomaly", "recovery"))
    assert route["model"] == "anthropic:claude-haiku-4-6" and route["fallback"] == "anthropic:claude-sonnet-4-6"
    assert anomaly["kind"] == "empty_answer" and recovery["action"] == "retry"
    assert "".join(e.data["delta"] for e in events if e.event == "text") == "Checkout is up; every check passed."
    turn = wait_done(api_url, key, started["turn_id"])
    assert turn["status"] == "done" and turn["model_used"] == "anthropic:claude-sonnet-4-6"
    with pg.k.db.connect() as conn:
        rows = audit.list_for_turn(conn, tenant, started["turn_id"])
    noted = [(r["kind"], r["subject"]) for r in rows if r["kind"] in ("route", "anomaly", "recovery")]
    assert noted == [("route", "anthropic:claude-haiku-4-6"), ("anomaly", "empty_answer"), ("recovery", "retry")]
