"""Storage behaviour that only PostgreSQL shows."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

import pytest
from sqlalchemy import text

from kortex.errors import Conflict, StorageError
from kortex.messages import ToolCall
from kortex.storage.audit import AuditEntry, write_entries
from kortex.storage.db import Database
from kortex.storage.schema import decisions
from kortex.timeparse import utcnow
from kortex.tools.pipeline import ToolPipeline
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec
from kortex.turns import chat
from kortex.turns.handoff import Handoff, ToolDispatch
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from tests.conftest import Harness
from tests.integration.conftest import PG_ADMIN
from tests.integration.redisproc import private_database
from tests.kortex.storage.test_schema import sessions_with_two_active_turns_keep_the_newest_through_0013
from tests.kortex.storage.test_turns import (
    claim_reads_its_own_spend_and_kept_events,
    claim_reads_the_sessions_history_as_load_history_does,
)

pytestmark = pytest.mark.integration


def test_tool_queries_are_stopped_by_the_database_at_their_timeout(pg_url: str) -> None:
    db = Database(pg_url, pool_size=1, statement_timeout=0.3)
    try:
        with pytest.raises(StorageError), db.connect() as conn:
            conn.execute(text("SELECT pg_sleep(5)"))
        with db.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        db.dispose()


def test_simultaneous_last_results_advance_the_turn_exactly_once(pg: Harness) -> None:
    """Twelve tool results of one step committed at the same moment on PostgreSQL: the
    countdown lets exactly one of them hand the turn to its next step, every round."""
    tenant_id = pg.tenant("fan-out")
    for _ in range(5):
        sid = chat.create_session(pg.k, tenant_id, "fan", "scripted:fan_out").id
        posted = chat.post_message(pg.k, tenant_id, sid, "go")
        (first,) = posted.handoff.steps
        fanned = run_step(pg.k, first.tenant_id, first.turn_id, first.step)
        assert len(fanned.tools) == 12 and not fanned.steps
        gate = threading.Barrier(len(fanned.tools))

        def settle_together(t: ToolDispatch, gate: threading.Barrier = gate) -> Handoff:
            gate.wait(10)
            return run_tool(pg.k, t.tenant_id, t.invocation_id, t.tool, t.hard_limit)

        with concurrent.futures.ThreadPoolExecutor(len(fanned.tools)) as pool:
            handoffs = list(pool.map(settle_together, fanned.tools))
        steps = [s for h in handoffs for s in h.steps]
        assert len(steps) == 1 and steps[0].step == first.step + 1
        turn = chat.get_turn(pg.k, tenant_id, posted.turn.id)
        assert turn.status == "queued" and turn.step == first.step + 1


def test_audit_rows_cannot_be_changed_or_deleted_on_postgresql(pg: Harness) -> None:
    tenant_id = pg.tenant("audit-pg")
    with pg.k.db.begin() as conn:
        write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="tool_call", subject="x", ok=True, payload={})])
    mine = decisions.c.tenant_id == tenant_id
    for stmt in (decisions.update().where(mine).values(ok=False), decisions.delete().where(mine)):
        with pytest.raises((StorageError, Conflict)) as caught, pg.k.db.begin() as conn:
            conn.execute(stmt)
        assert "append-only" in str(caught.value.__cause__ or caught.value)
    with pg.k.db.connect() as conn:
        assert [(r.subject, r.ok) for r in conn.execute(decisions.select().where(mine))] == [("x", True)]


def test_a_tool_call_the_pipeline_gave_up_on_frees_its_connection_at_its_own_deadline(pg_url: str) -> None:
    """The telemetry database's default statement timeout is the longest tool's; a query of a
    call with a nearer deadline is stopped at that deadline, so an abandoned call does not keep
    its connection (or its thread) for the longest tool's timeout."""
    db = Database(pg_url, pool_size=1, statement_timeout=20)

    class _Args(ToolInput):
        pass

    def slow_query(args: _Args, ctx: ToolContext) -> dict[str, Any]:
        with db.connect() as conn:
            conn.execute(text("SELECT pg_sleep(60)"))
        return {"ok": True}

    spec = ToolSpec(name="slow_query", description="sleeps in the database", input_model=_Args, run=slow_query,
                    redact=("ok",))
    registry = ToolRegistry([spec])
    pipeline = ToolPipeline(registry, ToolPolicy.build(None, registry), timeouts={"slow_query": 0.5})
    ctx = ToolContext(tenant_id="t", session_id=None, turn_id=None, call_id="c", step=0, now=utcnow(), sources=None)
    try:
        started = time.monotonic()
        result = pipeline.run(ToolCall(id="c", name="slow_query", arguments={}), ctx)
        assert result.error_code == "timeout"
        while pipeline.stuck_calls and time.monotonic() - started < 15:
            time.sleep(0.02)
        # Stopped near its 0.5 s deadline, not after the 20 s default or the 60 s it asked for; the
        # margin is wide so a loaded machine cannot fail it (a timing goal is not this test's).
        assert pipeline.stuck_calls == 0 and time.monotonic() - started < 15
        with db.connect() as conn:  # the pooled connection is back at the default
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "20s"
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        db.dispose()


def test_a_busy_process_keeps_its_connections_instead_of_reconnecting(pg_url: str) -> None:
    """Bursts past the pool's base size used to open overflow connections and close them on
    return, a new PostgreSQL backend each time: now each connection opened is kept."""
    import threading

    from sqlalchemy import event, text

    from kortex.storage.db import Database

    db = Database(pg_url, pool_size=2, max_overflow=2)
    opened: list[object] = []
    event.listen(db.engine, "connect", lambda *args: opened.append(args))
    try:
        def burst() -> None:
            barrier = threading.Barrier(4)

            def work() -> None:
                with db.connect() as conn:
                    barrier.wait(5)  # four at once: two past the base size
                    conn.execute(text("select 1"))

            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)

        burst()
        assert len(opened) == 4 and db.max_connections == 4
        for _ in range(3):
            burst()
        assert len(opened) == 4  # the same four, reused
    finally:
        db.dispose()


def test_the_connection_used_last_is_the_next_one_out(pg_url: str) -> None:
    """Its backend is the warm one: a lone request does not go to the backend idle longest."""
    from sqlalchemy import text

    from kortex.storage.db import Database

    db = Database(pg_url, pool_size=2, max_overflow=1)

    def backend(conn: Any) -> int:
        return int(conn.execute(text("select pg_backend_pid()")).scalar_one())

    try:
        with db.connect() as a, db.connect() as b, db.connect() as c:  # three backends open
            pids = [backend(a), backend(b), backend(c)]
        # Returned c, b, then a (a with statement closes in reverse): a is the warm one, every time.
        for _ in range(3):
            with db.connect() as conn:
                assert backend(conn) == pids[0]
        with db.begin() as conn:
            assert backend(conn) == pids[0]
    finally:
        db.dispose()


@pytest.mark.parametrize("how", ["connect", "begin"])
def test_a_connection_closed_while_it_sat_idle_in_the_pool_is_replaced_before_use(pg_url: str, how: str) -> None:
    """An idle timeout somewhere (the server's, a proxy's) closed it: the statement never sees it."""
    import psycopg
    from sqlalchemy import text

    from kortex.storage.db import Database

    db = Database(pg_url, pool_size=1, max_overflow=0, idle_ping_after=0.2)
    try:
        with db.connect() as conn:
            gone = int(conn.execute(text("select pg_backend_pid()")).scalar_one())
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("select pg_terminate_backend(%s)", (gone,))
        time.sleep(0.3)
        with getattr(db, how)() as conn:
            assert int(conn.execute(text("select pg_backend_pid()")).scalar_one()) != gone
        # Used a moment ago: handed out as it is, no ping.
        with db.connect() as conn:
            conn.execute(text("select 1"))
    finally:
        db.dispose()


def test_a_claim_reads_its_own_spend_and_kept_events_on_postgresql(pg: Harness) -> None:
    claim_reads_its_own_spend_and_kept_events(pg)


def test_a_claim_reads_the_sessions_history_in_its_own_statement_on_postgresql(pg: Harness) -> None:
    claim_reads_the_sessions_history_as_load_history_does(pg, one_statement=True)


def test_a_timeout_set_inside_a_rolled_back_transaction_is_not_taken_for_the_connections(pg_url: str) -> None:
    """A connection left at a call's short timeout, then used in a transaction that rolls back:
    PostgreSQL undoes a SET made in it, so the next statement must not trust a record of it
    (it would skip its SET and be cancelled at the old call's deadline)."""
    from kortex.storage.db import statements_until

    db = Database(pg_url, pool_size=1, statement_timeout=20)
    try:
        with statements_until(time.monotonic() + 0.5), db.connect() as conn:
            conn.execute(text("SELECT 1"))  # the connection's timeout is now the call's ~500 ms
        with pytest.raises(RuntimeError), db.begin() as conn:
            conn.execute(text("SELECT 1"))  # no deadline here: the default, for this transaction
            raise RuntimeError("rolled back")
        with db.connect() as conn:
            conn.execute(text("SELECT pg_sleep(1)"))  # past the old call's 500 ms, within the default
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "20s"
    finally:
        db.dispose()


def test_0013_keeps_the_newest_active_turn_of_a_session_and_then_refuses_a_second_on_postgresql() -> None:
    with private_database(PG_ADMIN, migrated=False) as url:
        sessions_with_two_active_turns_keep_the_newest_through_0013(url)
