"""One turn on the real stack is one trace, though its spans come from several processes: the
API (the request), the prefork worker's children (steps, LLM calls, tool calls), joined through
the trace context the hand-offs carry in their Celery message headers. The services export
OTLP over HTTP to a receiver in this test process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kortex.testing.scratch import throwaway_prefix
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL, OTLPReceiver
from tests.integration.redisproc import private_database
from tests.integration.sse import read_events
from tests.kortex.test_tracing import (
    a_dead_worker_s_step_runs_again_in_its_turn_s_trace,
    calls_handed_on_again_stay_in_the_trace,
    captured_spans,
    traceparent_columns_through_0014,
)


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


@pytest.fixture
def here() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this test process too (the spans of what the test itself runs)."""
    with captured_spans() as exporter:
        yield exporter


@pytest.fixture
def private_pg(tmp_path: Path) -> Iterator[Harness]:
    """A database of its own: the watchdog's sweep is system-wide and must not move other tests' turns."""
    with private_database(PG_ADMIN) as url, throwaway_prefix(REDIS_URL, "kxtr") as prefix:
        h = Harness(make_settings(tmp_path, url, redis_url=REDIS_URL, redis_prefix=prefix, turn={"requeue_after": 0}))
        try:
            yield h
        finally:
            h.close()


def test_on_postgresql_a_step_the_watchdog_runs_again_joins_its_turn_s_trace(
        private_pg: Harness, here: InMemorySpanExporter) -> None:
    a_dead_worker_s_step_runs_again_in_its_turn_s_trace(private_pg, here)


def test_on_postgresql_calls_the_watchdog_hands_on_again_stay_in_the_trace(
        private_pg: Harness, here: InMemorySpanExporter) -> None:
    calls_handed_on_again_stay_in_the_trace(private_pg, here)


def test_0014_on_postgresql_adds_the_traceparent_columns_and_migrating_again_is_harmless() -> None:
    with private_database(PG_ADMIN, migrated=False) as url:
        traceparent_columns_through_0014(url)


def test_a_step_whose_worker_died_is_run_again_by_beat_in_its_turn_s_trace(
        worker: Any, pg: Harness, otlp: OTLPReceiver, here: InMemorySpanExporter) -> None:
    """The deployed watchdog (``kortex beat``, which the worker fixture runs) sends the step
    again with the trace context the turn's row kept; the worker's span of it joins that trace."""
    from kortex import tracing
    from kortex.storage import turns as turn_store
    from kortex.turns import chat

    tenant = pg.tenant("tracing-rerun")
    session = chat.create_session(pg.k, tenant, "t", "scripted:text_only")
    with tracing.span("HTTP POST") as post:  # the API's request, in this process
        posted = chat.post_message(pg.k, tenant, session.id, "why?")  # its hand-off never sent
    assert post is not None
    with pg.k.db.connect() as conn:  # a worker claims the step, its lease lapses at once, it dies
        assert turn_store.claim_step(conn, tenant, posted.turn.id, 0, lease=-1) is not None
    deadline = time.monotonic() + 30
    rerun: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not rerun:
        rerun = [s for s in otlp.snapshot()
                 if s["name"] == "kortex.step" and s["attributes"].get("kortex.turn_id") == posted.turn.id]
        time.sleep(0.2)
    assert rerun, "the watchdog did not run the step again"
    assert rerun[0]["process"] == "worker"
    assert rerun[0]["trace_id"] == f"{post.get_span_context().trace_id:032x}"
    assert rerun[0]["parent_id"] == f"{post.get_span_context().span_id:016x}"
