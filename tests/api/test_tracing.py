"""One turn is one trace: the HTTP request that posted it, each step, each LLM call inside a
step and each tool call, parented through the hand-offs (Celery message headers), in the
embedded mode (a real Celery worker in-process) with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.main import create_app
from kortex import tracing
from tests.conftest import Harness


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_enabled", True)
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("kortex"))
    yield exporter
    provider.shutdown()


def _by_id(found: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in found}


def test_a_turn_with_two_tool_calls_is_one_trace_of_request_steps_llm_calls_and_tools(
        harness: Harness, spans: InMemorySpanExporter) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    key = harness.api_key(tenant)
    auth = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(harness.settings)) as client:  # embedded: a Celery worker in-process
        sid = client.post("/v1/sessions", json={"model": "scripted:two_tools"}, headers=auth).json()["id"]
        posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": "why?"}, headers=auth).json()
        events = client.get(posted["events_url"], headers=auth).text
        assert "event: done" in events
    found = [s for s in spans.get_finished_spans() if s.attributes is not None]
    post = next(s for s in found if s.name == "HTTP POST /v1/sessions/{session_id}/messages")
    turn = [s for s in found if s.context.trace_id == post.context.trace_id]
    names = sorted(s.name for s in turn if not s.name.startswith("HTTP"))
    assert names == ["kortex.step", "kortex.step", "kortex.tool", "kortex.tool", "llm.call", "llm.call"]
    by_id = _by_id(turn)
    steps = sorted((s for s in turn if s.name == "kortex.step"), key=lambda s: s.attributes["kortex.step"])
    tools = [s for s in turn if s.name == "kortex.tool"]
    calls = [s for s in turn if s.name == "llm.call"]
    assert steps[0].parent is not None and steps[0].parent.span_id == post.context.span_id
    assert all(t.parent is not None and t.parent.span_id == steps[0].context.span_id for t in tools)
    assert steps[1].parent is not None and by_id[steps[1].parent.span_id].name == "kortex.tool"  # the last result
    assert sorted(by_id[c.parent.span_id].attributes["kortex.step"] for c in calls if c.parent) == [0, 1]
    assert {t.attributes["kortex.tool"] for t in tools} == {"get_recent_deploys", "get_logs"}
    assert all(c.attributes["llm.provider"] == "scripted" and c.attributes["llm.output_tokens"] > 0 for c in calls)
    # nothing the model or a tool said is in a span
    assert not any("v2.14.0" in str(v) for s in turn for v in (s.attributes or {}).values())


def test_tracing_off_puts_nothing_in_the_task_headers() -> None:
    from workers.dispatch import _headers
    assert _headers(()) is None


def test_a_request_s_span_says_how_it_was_answered_and_a_5xx_fails_it(
        harness: Harness, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors api/errors.py answers (a 503 for a storage outage, a 404) never reach the
    middleware as exceptions: the status sent is what the span goes by."""
    from opentelemetry.trace import StatusCode

    from kortex.errors import StorageError
    from kortex.turns import chat

    tenant = harness.tenant("acme")
    auth = {"Authorization": f"Bearer {harness.api_key(tenant)}"}

    def outage(*_: object, **__: object) -> None:
        raise StorageError("the database is down")

    with TestClient(create_app(harness.settings, dispatch=lambda _: None)) as client:
        assert client.post("/v1/sessions", json={}, headers=auth).status_code == 201
        assert client.get("/v1/sessions/0190a0b0-0000-7000-8000-000000000000", headers=auth).status_code == 404
        monkeypatch.setattr(chat, "list_sessions", outage)
        assert client.get("/v1/sessions", headers=auth).status_code == 503
    served = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("HTTP")}
    created, missing, failed = (served["HTTP POST /v1/sessions"], served["HTTP GET /v1/sessions/{session_id}"],
                                served["HTTP GET /v1/sessions"])
    assert [s.attributes["http.status_code"] for s in (created, missing, failed)] == [201, 404, 503]
    assert all(s.attributes["http.response.status_code"] == s.attributes["http.status_code"]
               for s in (created, missing, failed))
    assert failed.status.status_code is StatusCode.ERROR
    # a caller's mistake is not the server's failure (OpenTelemetry's HTTP server conventions)
    assert created.status.status_code is missing.status.status_code is StatusCode.UNSET
