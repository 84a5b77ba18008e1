"""The migrations build exactly the schema the code declares."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from kortex.errors import NotFound
from kortex.storage.migrate import upgrade
from kortex.storage.schema import TENANT_TABLES, metadata, telemetry_metrics
from kortex.telemetry.embedded_metrics import labels_key


def test_migrated_database_matches_the_declared_metadata(sqlite_template: Path) -> None:
    engine = create_engine(f"sqlite:///{sqlite_template}")
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == [], f"schema.py and the migrations disagree; generate a new revision: {diff}"


def test_every_table_but_tenants_is_tenant_scoped() -> None:
    assert {t.name for t in metadata.sorted_tables} - {t.name for t in TENANT_TABLES} == {"tenants"}


def test_0004_backfills_the_series_key_of_existing_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url, "0003")
    engine = create_engine(url)
    labels = [{}, {"route": "/pay", "instance": "a,b"}]
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO tenants (id, name, disabled, settings, created_at) "
                                 "VALUES ('t', 't', 0, '{}', '2026-01-01 00:00:00')")
            for i, lab in enumerate(labels):
                conn.exec_driver_sql("INSERT INTO telemetry_metrics (tenant_id, product, metric, labels, ts, value) "
                                     "VALUES ('t', 'p', 'm', ?, '2026-01-01 00:00:00', ?)", (json.dumps(lab), float(i)))
        upgrade(url)
        with engine.connect() as conn:
            keys = conn.execute(select(telemetry_metrics.c.labels_key).order_by(telemetry_metrics.c.value)).scalars()
            assert list(keys) == [labels_key(lab) for lab in labels] == [",", ",instance=a%2Cb,route=%2Fpay,"]
    finally:
        engine.dispose()


def test_the_logs_of_one_trace_are_found_through_an_index(sqlite_template: Path) -> None:
    """get_traces(include_logs) asks for one trace's lines without a product: without an index
    on (tenant_id, trace_id) that scans every line of the tenant."""
    engine = create_engine(f"sqlite:///{sqlite_template}")
    try:
        with engine.connect() as conn:
            plan = " ".join(str(row[-1]) for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT id FROM telemetry_logs WHERE tenant_id = 't' AND trace_id = 'x' "
                "AND ts >= '2026-01-01' AND ts < '2026-01-02' ORDER BY ts DESC, id DESC LIMIT 101"))
    finally:
        engine.dispose()
    assert "ix_telemetry_logs_tenant_id_trace_id" in plan, plan


def sessions_with_two_active_turns_keep_the_newest_through_0013(url: str) -> None:
    """Shared with the PostgreSQL run (tests/integration/test_storage.py): a session left with two
    active turns (posts checked the rule themselves before 0013) keeps its newest; the older is
    failed, and from then on the database refuses a second active turn."""
    from sqlalchemy import insert

    from kortex.storage.schema import chat_sessions, tenants, turns

    upgrade(url, "0012")
    engine = create_engine(url)
    now = datetime(2026, 11, 1, tzinfo=UTC)
    tenant, session = "00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002"

    def turn(n: int, status: str) -> dict[str, object]:
        return {"id": f"00000000-0000-7000-8000-00000000010{n}", "tenant_id": tenant, "session_id": session,
                "turn_no": n, "status": status, "step": 0, "attempt": 0, "pending_tools": 0, "input_tokens": 0,
                "output_tokens": 0, "cost_usd": 0.0, "deadline_at": now, "created_at": now, "updated_at": now}

    try:
        with engine.begin() as conn:
            conn.execute(insert(tenants).values(id=tenant, name="t", disabled=False, settings={}, created_at=now))
            conn.execute(insert(chat_sessions).values(id=session, tenant_id=tenant, name="s", turn_count=3,
                                                      created_at=now, updated_at=now))
            conn.execute(insert(turns), [turn(1, "done"), turn(2, "running"), turn(3, "queued")])
        upgrade(url)
        with engine.connect() as conn:
            rows = conn.execute(select(turns.c.turn_no, turns.c.status, turns.c.error).order_by(turns.c.turn_no)).all()
        assert [(r.turn_no, r.status) for r in rows] == [(1, "done"), (2, "failed"), (3, "queued")]
        assert rows[1].error["code"] == "superseded" and rows[0].error is None
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(turns).values(turn(4, "queued")))
    finally:
        engine.dispose()


def test_0013_keeps_the_newest_active_turn_of_a_session_and_then_refuses_a_second(tmp_path: Path) -> None:
    sessions_with_two_active_turns_keep_the_newest_through_0013(f"sqlite:///{tmp_path / 'old.db'}")


def _plans(sqlite_template: Path, calls: dict[str, Callable[[Connection], object]]) -> dict[str, str]:
    """The SQLite query plan of each statement each call makes on post-mortem tables, joined."""
    engine = create_engine(f"sqlite:///{sqlite_template}")
    made: list[tuple[str, Any]] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, sql, params, *_: made.append((sql, params)))
    found: dict[str, str] = {}
    try:
        for name, call in calls.items():
            made.clear()
            with engine.connect() as conn:
                with contextlib.suppress(NotFound):
                    call(conn)
                conn.rollback()
                statements = [(sql, params) for sql, params in made if "postmortem" in sql]
                found[name] = " / ".join(str(row[-1]) for sql, params in statements
                                         for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
    finally:
        engine.dispose()
    return found


def test_a_tenants_open_items_and_a_jobs_documents_are_found_through_an_index(sqlite_template: Path) -> None:
    """The tenant's unfinished items (counted under its lock at every submission and every
    dispatch) and a job's documents in incident order (the API's pages) read one index range,
    not every tenant's open items or every document of the tenant (0016); and a job's own item
    queries keep their job's index: SQLite, with no statistics, took an index led by the tenant
    for them when it could."""
    from kortex.storage import postmortems as store

    now = datetime(2026, 11, 1, tzinfo=UTC)
    tenant, job = "00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002"
    plans = _plans(sqlite_template, {
        "open": lambda c: store.tenant_open_count(c, tenant),
        "active": lambda c: store.tenant_active_count(c, tenant),
        "open_refs": lambda c: store.open_refs(c, tenant, ["INC-1", "INC-2"]),
        "documents": lambda c: store.postmortems_of_job(c, tenant, job, after=None, limit=50),
        "documents after": lambda c: store.postmortems_of_job(c, tenant, job, after="INC-1", limit=50),
        "counts": lambda c: store.counts(c, tenant, job),
        "spend": lambda c: store.spend(c, tenant, job),
        "list_items": lambda c: store.list_items(c, tenant, job, after=0, limit=10),
        "end_open_items": lambda c: store.end_open_items(c, tenant, job, "cancelled", now, {}),
        "any_open": lambda c: store.any_open(c, tenant, job),
        "finish_if_complete": lambda c: store.finish_if_complete(c, tenant, job, now),
        "latest": lambda c: store.latest_postmortem(c, tenant, "INC-1"),
    })
    for name in ("open", "active", "open_refs"):
        assert "ix_postmortem_items_status_tenant_id (status=? AND tenant_id=?)" in plans[name], plans[name]
    assert "ix_postmortems_job_id_incident_ref (job_id=?)" in plans["documents"], plans["documents"]
    assert "ix_postmortems_job_id_incident_ref (job_id=? AND incident_ref>?)" in plans["documents after"]
    for name in ("counts", "spend", "list_items", "end_open_items", "any_open", "finish_if_complete"):
        assert "(job_id=?" in plans[name] and "tenant_id=?" not in plans[name], (name, plans[name])
    assert "ix_postmortems_tenant_id_incident_ref_created_at (tenant_id=? AND incident_ref=?)" in plans["latest"]
