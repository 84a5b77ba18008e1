"""One turn on the real stack is one trace, though its spans come from several processes: the
API (the request), the prefork worker's children (steps, LLM calls, tool calls), joined through
the trace context the hand-offs carry in their Celery message headers. The services export
OTLP over HTTP to a receiver in this test process."""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.conftest import Harness
from tests.integration.conftest import OTLPReceiver
from tests.integration.sse import read_events


def test_one_turn_is_one_trace_across_the_api_and_the_worker(api_url: str, pg: Harness, otlp: OTLPReceiver) -> None:
    tenant = pg.tenant("tracing")
    pg.seed(tenant)
    key = pg.api_key(tenant)
    auth = {"Authorization": f"Bearer {key}"}
    sid = httpx.post(f"{api_url}/v1/sessions", json={"model": "scripted:two_tools"}, headers=auth).json()["id"]
    posted = httpx.post(f"{api_url}/v1/sessions/{sid}/messages", json={"content": "why?"}, headers=auth).json()
    assert read_events(api_url + posted["events_url"], key)[-1].event == "done"

    def turn_spans() -> list[dict[str, Any]]:
        spans = otlp.snapshot()
        steps = [s for s in spans if s["name"] == "kortex.step" and s["attributes"].get("kortex.turn_id") == posted["turn_id"]]
        if not steps:
            return []
        return [s for s in spans if s["trace_id"] == steps[0]["trace_id"]]

    expected = ["kortex.step", "kortex.step", "kortex.tool", "kortex.tool", "llm.call", "llm.call"]
    deadline = time.monotonic() + 20  # each process exports its spans in batches, every 100 ms here
    spans: list[dict[str, Any]] = []
    names: list[str] = []
    while time.monotonic() < deadline:
        spans = turn_spans()
        names = sorted(s["name"] for s in spans if not s["name"].startswith("HTTP"))
        if names == expected and any(s["name"].startswith("HTTP POST") for s in spans):
            break
        time.sleep(0.2)
    assert names == expected
    post = next(s for s in spans if s["name"] == "HTTP POST /v1/sessions/{session_id}/messages")
    assert post["process"] == "api" and {s["process"] for s in spans if s is not post} == {"worker"}
    by_id = {s["span_id"]: s for s in spans}
    first = next(s for s in spans if s["name"] == "kortex.step" and s["attributes"]["kortex.step"] == 0)
    assert first["parent_id"] == post["span_id"]
    assert all(by_id[s["parent_id"]]["name"] == "kortex.step" for s in spans if s["name"] in ("kortex.tool", "llm.call"))
