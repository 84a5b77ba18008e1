"""Work the watchdog hands on again stays in its turn's trace: the turn row keeps the traceparent
of the span that posted it, a tool call's row that of the step that made it, and every re-run
(a lapsed lease, a lost hand-off, a lost tool call, the step after a call the watchdog settled)
carries it. With tracing off nothing is stored and nothing is sent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import create_engine, inspect, select, update

from kortex import tracing
from kortex.storage import turns as turn_store
from kortex.storage.migrate import upgrade
from kortex.storage.schema import tool_invocations, turns
from kortex.turns import chat, watchdog
from kortex.turns.handoff import stored_trace
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from tests.conftest import Harness


@contextlib.contextmanager
def captured_spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process, its spans kept in memory (tests/integration/test_tracing.py too)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tracing, "_enabled", True)
        patch.setattr(tracing, "tracer", provider.get_tracer("kortex"))
        yield exporter
    provider.shutdown()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with captured_spans() as exporter:
        yield exporter


def _post(h: Harness, model: str) -> tuple[str, Any, str]:
    """A turn posted inside a span standing for the API's request: (tenant, posted, its traceparent)."""
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", model)
    with tracing.span("HTTP POST"):
        parent = tracing.traceparent()
        posted = chat.post_message(h.k, tenant, session.id, "why?")
    assert parent is not None
    return tenant, posted, parent


def _steps(spans: InMemorySpanExporter, turn_id: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans()
            if s.name == "kortex.step" and (s.attributes or {}).get("kortex.turn_id") == turn_id]


def _is_child_of(span: ReadableSpan, traceparent: str) -> bool:
    _version, trace_id, span_id, _flags = traceparent.split("-")
    return (span.parent is not None and f"{span.context.trace_id:032x}" == trace_id
            and f"{span.parent.span_id:016x}" == span_id)


def a_dead_worker_s_step_runs_again_in_its_turn_s_trace(harness: Harness, spans: InMemorySpanExporter) -> None:
    """Shared with the PostgreSQL run (tests/integration/test_tracing.py), where the turn is
    written by one statement of its own."""
    tenant, posted, parent = _post(harness, "scripted:text_only")
    assert posted.turn.traceparent == parent  # stored by the POST's own insert of the turn
    with harness.k.db.connect() as conn:  # a worker claims the step, its lease lapses at once, it dies
        assert turn_store.claim_step(conn, tenant, posted.turn.id, 0, lease=-1) is not None
    (again,) = watchdog.sweep(harness.k).handoff.steps
    assert again.trace == (("traceparent", parent),)
    run_step(harness.k, again.tenant_id, again.turn_id, again.step, again.trace)
    (step,) = _steps(spans, posted.turn.id)
    assert _is_child_of(step, parent)


def test_a_step_whose_worker_died_runs_again_in_its_turn_s_trace(harness: Harness,
                                                                  spans: InMemorySpanExporter) -> None:
    a_dead_worker_s_step_runs_again_in_its_turn_s_trace(harness, spans)


def test_a_turn_whose_hand_off_was_lost_is_re_enqueued_in_its_trace(harness_factory: Any,
                                                                     spans: InMemorySpanExporter) -> None:
    h = harness_factory(turn={"requeue_after": 0})
    _tenant, posted, parent = _post(h, "scripted:text_only")  # its hand-off never sent
    (again,) = watchdog.sweep(h.k).handoff.steps
    assert again.turn_id == posted.turn.id and again.trace == stored_trace(parent)


def calls_handed_on_again_stay_in_the_trace(h: Harness, spans: InMemorySpanExporter) -> None:
    """Shared with the PostgreSQL run; ``h`` re-enqueues at once (``turn.requeue_after`` 0)."""
    tenant, posted, parent = _post(h, "scripted:two_tools")
    k = h.k
    parked = run_step(k, tenant, posted.turn.id, 0, stored_trace(parent))
    (step0,) = _steps(spans, posted.turn.id)
    with k.db.connect() as conn:  # each call's row names the step that made it (the park's insert)
        kept = conn.execute(select(tool_invocations.c.traceparent)
                            .where(tool_invocations.c.turn_id == posted.turn.id)).scalars().all()
    made_by = kept[0]
    assert kept == [made_by, made_by]
    assert made_by.split("-")[1:3] == [f"{step0.context.trace_id:032x}", f"{step0.context.span_id:016x}"]
    # Both calls' hand-offs were lost (requeue_after 0): sent again, each in the step's trace.
    requeued = watchdog.sweep(k).handoff.tools
    assert sorted(t.invocation_id for t in requeued) == sorted(t.invocation_id for t in parked.tools)
    assert all(t.trace == stored_trace(made_by) for t in requeued)
    # One call runs; the other's worker died past its hard limit: the watchdog answers it, and
    # the step that answer hands on is in the trace too.
    done, dead = parked.tools
    assert not run_tool(k, tenant, done.invocation_id, done.tool, done.hard_limit, done.trace)
    with k.db.begin() as conn:
        conn.execute(update(tool_invocations).where(tool_invocations.c.id == dead.invocation_id)
                     .values(status="running", deadline_at=posted.turn.created_at))
    report = watchdog.sweep(k)
    assert report.timed_out_tools == 1
    (next_step,) = report.handoff.steps
    assert next_step.step == 1 and next_step.trace == stored_trace(made_by)
    run_step(k, tenant, posted.turn.id, 1, next_step.trace)
    step1 = next(s for s in _steps(spans, posted.turn.id) if (s.attributes or {}).get("kortex.step") == 1)
    assert step1.context.trace_id == step0.context.trace_id and step1.parent is not None
    assert step1.parent.span_id == step0.context.span_id


def test_tool_calls_the_watchdog_hands_on_again_and_the_step_after_them_stay_in_the_trace(
        harness_factory: Any, spans: InMemorySpanExporter) -> None:
    calls_handed_on_again_stay_in_the_trace(harness_factory(turn={"requeue_after": 0}), spans)


def test_with_tracing_off_nothing_is_stored_and_the_watchdog_sends_no_trace(harness_factory: Any) -> None:
    h = harness_factory(turn={"requeue_after": 0})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:two_tools")
    posted = chat.post_message(h.k, tenant, session.id, "why?")
    assert posted.turn.traceparent is None
    parked = run_step(h.k, tenant, posted.turn.id, 0)
    report = watchdog.sweep(h.k)
    assert len(report.handoff.tools) == len(parked.tools) == 2
    assert all(t.trace == () for t in report.handoff.tools)
    with h.k.db.connect() as conn:
        assert conn.execute(select(turns.c.traceparent)).scalars().all() == [None]
        assert conn.execute(select(tool_invocations.c.traceparent)).scalars().all() == [None, None]


def traceparent_columns_through_0014(url: str) -> None:
    """Shared with the PostgreSQL run (tests/integration/test_tracing.py): 0014 adds the two
    nullable columns under rows already there, and migrating again changes nothing."""
    upgrade(url, "0013")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO tenants (id, name, disabled, settings, created_at) "
                                 "VALUES ('00000000-0000-7000-8000-000000000001', 't', false, '{}', "
                                 "'2026-01-01 00:00:00')")
        upgrade(url, "0014")
        upgrade(url, "0014")  # kortex migrate again: nothing to do
        columns = inspect(engine)
        for table in ("turns", "tool_invocations"):
            found = {c["name"]: c for c in columns.get_columns(table)}
            assert found["traceparent"]["nullable"], table
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "0014"
            assert conn.exec_driver_sql("SELECT count(*) FROM tenants").scalar() == 1
    finally:
        engine.dispose()


def test_0014_adds_the_traceparent_columns_and_migrating_again_is_harmless(tmp_path: Path) -> None:
    traceparent_columns_through_0014(f"sqlite:///{tmp_path / 'old.db'}")


def test_beat_sets_tracing_up_under_its_own_name_before_its_container(tmp_path: Path, sqlite_url: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tests.conftest import make_settings
    from workers import beat, runtime

    class Built(Exception):
        """The container is where the test stops beat."""

    order: list[str] = []
    monkeypatch.setattr(tracing, "setup_from", lambda settings, service: order.append(f"tracing:{service}"))

    def container(settings: Any) -> None:
        order.append("container")
        raise Built

    monkeypatch.setattr(runtime, "kortex", container)
    raised: list[BaseException] = []

    def run() -> None:  # off the main thread: beat would install its signal handlers in pytest's
        try:
            beat.run(make_settings(tmp_path, sqlite_url), stop=threading.Event())
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert len(raised) == 1 and isinstance(raised[0], Built), raised
    assert order == ["tracing:beat", "container"]
