"""PostgreSQL writes a new turn (session counter, turn, user message, tenant lock) in one
statement: the rows are those the statement-by-statement way writes, and the rules that depend
on the lock and the counter still hold under concurrent posts."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import select

from kortex.errors import Conflict
from kortex.messages import AssistantMessage, Usage
from kortex.storage import invocations
from kortex.storage import turns as turn_store
from kortex.storage.audit import AuditEntry
from kortex.storage.schema import chat_messages, chat_sessions, decisions, tenant_spend, turns
from kortex.turns import chat
from tests.conftest import Harness

pytestmark = pytest.mark.integration

_VOLATILE = {"id", "turn_id", "session_id", "idempotency_key", "created_at", "updated_at", "deadline_at"}


def _strip(row: Any) -> dict[str, Any]:
    return {k: v for k, v in row._mapping.items() if k not in _VOLATILE}


def _rows(h: Harness, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    with h.k.db.connect() as conn:
        ts = conn.execute(select(turns).where(turns.c.session_id == session_id).order_by(turns.c.turn_no)).all()
        # In the conversation's order: by turn alone, rows of one turn came back in whatever
        # order the heap held them, and the two sessions compared could differ.
        ms = conn.execute(select(chat_messages).where(chat_messages.c.session_id == session_id)
                          .order_by(chat_messages.c.turn_no, chat_messages.c.step, chat_messages.c.ord)).all()
        count = conn.scalar(select(chat_sessions.c.turn_count).where(chat_sessions.c.id == session_id))
    return [_strip(r) for r in ts], [_strip(r) for r in ms], int(count or 0)


def _decisions(h: Harness, session_id: str) -> list[tuple[Any, ...]]:
    """The audit rows of a session's turns, without what differs from run to run."""
    with h.k.db.connect() as conn:
        rows = conn.execute(select(decisions).where(decisions.c.session_id == session_id)).all()
    return sorted((r.kind, r.subject, r.ok, r.input_tokens, r.output_tokens, r.cost_usd,
                   sorted(k for k in r.payload)) for r in rows)


def _json_storage(h: Harness, session_id: str) -> list[tuple[Any, ...]]:
    """How the JSON columns are stored: JSON null and SQL NULL read back alike."""
    with h.k.db.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(
            "SELECT t.turn_no, t.error IS NULL, jsonb_typeof(t.error), m.tool_calls IS NULL, m.result IS NULL "
            "FROM turns t JOIN chat_messages m ON m.turn_id = t.id WHERE t.session_id = %(s)s ORDER BY t.turn_no",
            {"s": session_id}).all()]


def _two_turns(h: Harness, tenant: str, session_id: str) -> None:
    for content in ("first", "second"):
        posted = chat.post_message(h.k, tenant, session_id, content, idempotency_key=f"{session_id}-{content}")
        with h.k.db.begin() as conn:  # finish it, so the session takes the next one
            conn.execute(turns.update().where(turns.c.id == posted.turn.id).values(status="done"))


def test_one_statement_writes_the_rows_the_separate_statements_write(pg: Harness, monkeypatch: Any) -> None:
    tenant = pg.tenant("one-statement")
    one = chat.create_session(pg.k, tenant, "one").id
    _two_turns(pg, tenant, one)
    monkeypatch.setattr(turn_store, "ONE_STATEMENT_WRITE", frozenset())
    separate = chat.create_session(pg.k, tenant, "separate").id
    _two_turns(pg, tenant, separate)

    assert _rows(pg, one) == _rows(pg, separate)
    assert [r["turn_no"] for r in _rows(pg, one)[0]] == [1, 2]
    assert _rows(pg, one)[2] == 2
    assert _json_storage(pg, one) == _json_storage(pg, separate)
    # An idempotent replay still finds the turn the one statement wrote.
    again = chat.post_message(pg.k, tenant, one, "second", idempotency_key=f"{one}-second")
    assert not again.created and again.turn.turn_no == 2


def test_concurrent_posts_to_one_session_admit_exactly_one(pg: Harness) -> None:
    tenant = pg.tenant("one-session-crowd")
    session_id = chat.create_session(pg.k, tenant, "crowd").id
    n = 12
    start = threading.Barrier(n)
    outcomes: list[Any] = []
    lock = threading.Lock()

    def post(i: int) -> None:
        start.wait()
        try:
            result: Any = chat.post_message(pg.k, tenant, session_id, f"hello {i}")
        except Exception as exc:
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    admitted = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(admitted) == 1, outcomes
    assert all(isinstance(e, Conflict) and e.code == "turn_in_progress" for e in refused), refused
    # Each is told which turn holds the session, whether it lost at the read or at the write.
    assert all(e.details == {"turn_id": admitted[0].turn.id} for e in refused), [e.details for e in refused]
    ts, ms, count = _rows(pg, session_id)
    assert len(ts) == 1 and len(ms) == 1 and ts[0]["turn_no"] == admitted[0].turn.turn_no
    assert count >= 1  # refused posts roll back their increment


def test_a_post_to_another_tenants_session_writes_nothing(pg: Harness) -> None:
    owner = pg.tenant("session-owner")
    other = pg.tenant("session-stranger")
    session_id = chat.create_session(pg.k, owner, "mine").id
    with pytest.raises(Exception) as caught:
        chat.post_message(pg.k, other, session_id, "hello")
    assert getattr(caught.value, "code", None) == "not_found"
    assert _rows(pg, session_id) == ([], [], 0)


def _fan_out(h: Harness, tenant: str, name: str) -> tuple[str, list[Any]]:
    """A turn parked on several tool calls, every result stored; returns the session and what
    each store said (the last one hands the turn to the next step)."""
    from kortex.messages import ToolResult
    from kortex.turns.step import run_step

    session = chat.create_session(h.k, tenant, name, "scripted:fan_out")
    posted = chat.post_message(h.k, tenant, session.id, "go")
    tools = run_step(h.k, tenant, posted.turn.id, 0).tools
    said = []
    for n, tool in enumerate(tools):
        with h.k.db.begin() as conn:
            inv = invocations.claim_invocation(conn, tenant, tool.invocation_id, hard_limit=60)
            assert inv is not None
            result = ToolResult(call_id=inv.call_id, name=inv.name, content={"n": n}, is_error=n == 1,
                                error_code="boom" if n == 1 else None)
            entry = AuditEntry(tenant_id=tenant, kind="tool_call", subject=inv.name, ok=n != 1, payload={"n": n},
                               session_id=session.id, turn_id=posted.turn.id, latency_ms=n)
            done = turn_store.complete_invocation(conn, tenant, inv.id, result, audit_entries=[entry])
            # A second delivery: refused, and its audit row is not written either.
            again = turn_store.complete_invocation(conn, tenant, inv.id, result, audit_entries=[entry])
        said.append((done.next_step if done else "lost", done.invocation.idx if done else None, again))
    return session.id, said


def test_one_statement_stores_a_tool_result_as_the_separate_statements_do(pg: Harness, monkeypatch: Any) -> None:
    tenant = pg.tenant("one-statement-results")
    one, said_one = _fan_out(pg, tenant, "one")
    monkeypatch.setattr(turn_store, "ONE_STATEMENT_WRITE", frozenset())
    separate, said_separate = _fan_out(pg, tenant, "separate")
    assert len(said_one) >= 2
    assert said_one == said_separate
    assert [s[0] for s in said_one] == [None] * (len(said_one) - 1) + [1]  # only the last hands on
    assert all(s[2] is None for s in said_one)  # a second store of a settled call is refused
    assert _rows(pg, one) == _rows(pg, separate)
    # One audit row per stored result, written by the store's own statement on PostgreSQL.
    tool_rows = [d for d in _decisions(pg, one) if d[0] == "tool_call"]
    assert len(tool_rows) == len(said_one) and _decisions(pg, one) == _decisions(pg, separate)


def test_one_statement_parks_and_finishes_as_the_separate_statements_do(pg: Harness, monkeypatch: Any) -> None:
    """A whole turn (park on tool calls, results, the answer) through both ways: the turns and
    messages stored are the same, and a step whose turn moved on stores nothing."""
    from kortex.storage.records import TurnRecord
    from kortex.turns.step import run_step

    def whole_turn(name: str) -> str:
        session_id, _ = _fan_out(pg, tenant, name)
        with pg.k.db.connect() as conn:
            turn_id = conn.scalar(select(turns.c.id).where(turns.c.session_id == session_id))
        run_step(pg.k, tenant, turn_id, 1)
        late = AuditEntry(tenant_id=tenant, kind="llm_call", subject="late:attempt", ok=True, payload={},
                          session_id=session_id, turn_id=turn_id)
        with pg.k.db.begin() as conn:  # a late attempt of the finished step: its CAS loses, nothing is written
            record = TurnRecord.from_row(conn.execute(select(turns).where(turns.c.id == turn_id)).one())
            assert not turn_store.finish_turn(conn, record, step=1, message=None, usage=Usage(), model_used=None,
                                              audit_entries=[late])
            assert not turn_store.finish_turn(conn, record, step=1, message=AssistantMessage(content="late"),
                                              usage=Usage(), model_used=None, audit_entries=[late])
        return session_id

    tenant = pg.tenant("one-statement-finish")
    one = whole_turn("one")
    monkeypatch.setattr(turn_store, "ONE_STATEMENT_WRITE", frozenset())
    separate = whole_turn("separate")
    turns_one, messages_one, _ = _rows(pg, one)
    assert turns_one[0]["status"] == "done" and [m["role"] for m in messages_one][:2] == ["user", "assistant"]
    assert messages_one[-1]["role"] == "assistant" and messages_one[-1]["step"] == 1

    def stable(rows: tuple[list[dict[str, Any]], list[dict[str, Any]], int]) -> Any:
        later = {"finished_at", "done_event_id", "request_hash"}  # when it ended, where its done is
        return [{k: v for k, v in r.items() if k not in later} for r in rows[0]], rows[1], rows[2]

    assert stable(_rows(pg, one)) == stable(_rows(pg, separate))
    # The step's LLM calls (park, then finish) and the tool calls: audited alike both ways, and
    # the late attempt's row nowhere.
    audited = _decisions(pg, one)
    assert audited == _decisions(pg, separate)
    assert [d[0] for d in audited].count("llm_call") == 2 and not [d for d in audited if d[1] == "late:attempt"]


@pytest.mark.parametrize("entries", [1, 4, 7])
def test_a_finish_writes_every_audit_row_and_the_spend_of_priced_calls(pg: Harness, entries: int) -> None:
    """Up to FOLDED_AUDIT rows go in the finish's own statement, more in one of their own: all
    are written, and the priced calls add to the tenant's day of spend in the same transaction."""
    from kortex.storage.records import TurnRecord

    tenant = pg.tenant(f"audit-{entries}")
    session_id, _ = _fan_out(pg, tenant, "audited")
    with pg.k.db.begin() as conn:
        turn_id = conn.scalar(select(turns.c.id).where(turns.c.session_id == session_id))
        claimed = turn_store.claim(conn, tenant, turn_id, 1, lease=60)
        assert claimed is not None
        record: TurnRecord = claimed.turn
        spent_before = conn.scalar(select(tenant_spend.c.cost_usd).where(tenant_spend.c.tenant_id == tenant)) or 0.0
    rows = [AuditEntry(tenant_id=tenant, kind="llm_call", subject=f"vendor:model-{i}", ok=i % 2 == 0,
                       payload={"i": i, "nested": {"q": "it's \"quoted\""}}, session_id=session_id, turn_id=turn_id,
                       input_tokens=10 * i, output_tokens=i, cost_usd=0.25 * i, latency_ms=i) for i in range(entries)]
    from sqlalchemy import event

    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(pg.k.db.engine, "before_cursor_execute", seen)
    try:
        with pg.k.db.begin() as conn:
            assert turn_store.finish_turn(conn, record, step=1, message=AssistantMessage(content="done"),
                                          usage=Usage(), model_used="vendor:model-0", audit_entries=rows)
    finally:
        event.remove(pg.k.db.engine, "before_cursor_execute", seen)
    separate = [s for s in statements if s.lstrip().startswith("INSERT INTO decisions")]
    assert len(separate) == (0 if entries <= turn_store.FOLDED_AUDIT else 1)  # folded into the finish, or one more
    with pg.k.db.connect() as conn:
        written = conn.execute(select(decisions).where(decisions.c.turn_id == turn_id,
                                                       decisions.c.subject.like("vendor:%"))).all()
        spent_after = conn.scalar(select(tenant_spend.c.cost_usd).where(tenant_spend.c.tenant_id == tenant)) or 0.0
    assert sorted((r.subject, r.ok, r.payload, r.input_tokens, r.output_tokens, r.cost_usd, r.latency_ms)
                  for r in written) == sorted((e.subject[:200], e.ok, e.payload, e.input_tokens, e.output_tokens,
                                               e.cost_usd, e.latency_ms) for e in rows)
    assert len({r.id for r in written}) == entries
    assert spent_after == pytest.approx(spent_before + sum(e.cost_usd for e in rows))
