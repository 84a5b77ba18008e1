"""The turn state machine in SQL: idempotency, single active turn, compare-and-set steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kortex.errors import Conflict, NotFound, StorageError
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, Usage
from kortex.storage import chats, invocations, posting, turns
from kortex.storage.audit import AuditEntry, add_spend, write_entries
from kortex.storage.schema import decisions, stream_outbox, tenants
from kortex.storage.schema import turns as turn_table
from kortex.timeparse import utcnow
from tests.conftest import Harness


def _new(h: Harness, tenant: str, session: str, content: str = "hi", key: str | None = None):
    def work():
        with h.k.db.begin() as conn:
            return posting.create_turn(conn, tenant_id=tenant, session_id=session, content=content, model=None,
                                           deadline=timedelta(minutes=5), idempotency_key=key)
    return work()


def _session(h: Harness, tenant: str) -> str:
    def work():
        with h.k.db.begin() as conn:
            return (chats.create_session(conn, tenant, "s")).id
    return work()


def test_idempotency_key_returns_the_same_turn(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    session = _session(harness, tenant)
    first = _new(harness, tenant, session, key="k1")
    again = _new(harness, tenant, session, key="k1")
    assert first.created and not again.created and again.turn.id == first.turn.id
    with pytest.raises(Conflict) as err:
        _new(harness, tenant, session, content="something else", key="k1")
    assert err.value.code == "idempotency_mismatch"
    assert [m.role for m in harness.messages(tenant, session)] == ["user"]


def test_one_active_turn_per_session_and_sessions_are_tenant_scoped(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    other = harness.tenant("other")
    session = _session(harness, tenant)
    _new(harness, tenant, session)
    with pytest.raises(Conflict) as err:
        _new(harness, tenant, session, content="second")
    assert err.value.code == "turn_in_progress"
    with pytest.raises(NotFound):
        _new(harness, other, session)


def test_claims_and_completions_are_compare_and_set(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    session = _session(harness, tenant)
    turn = _new(harness, tenant, session).turn

    def work():
        k = harness.k
        with k.db.begin() as conn:
            claimed = turns.claim_step(conn, tenant, turn.id, 0, lease=60)
            assert claimed is not None
            assert turns.claim_step(conn, tenant, turn.id, 0, lease=60) is None
            assert turns.claim_step(conn, "someone-else", turn.id, 0, lease=60) is None
            calls = (ToolCall(id="a", name="x"), ToolCall(id="b", name="y"))
            invs = turns.park_for_tools(conn, claimed, step=0, message=AssistantMessage(tool_calls=calls),
                                              usage=Usage(input_tokens=3), model_used="p:m")
        nexts = []
        for inv in invs:
            with k.db.begin() as conn:
                assert invocations.claim_invocation(conn, tenant, inv.id, hard_limit=5) is not None
                assert invocations.claim_invocation(conn, tenant, inv.id, hard_limit=5) is None
                done = turns.complete_invocation(conn, tenant, inv.id, ToolResult(call_id=inv.call_id, name=inv.name))
                nexts.append(done.next_step)
                assert turns.complete_invocation(conn, tenant, inv.id, ToolResult(call_id=inv.call_id, name=inv.name)) is None
        assert nexts == [None, 1]  # only the last result advances the turn, once
        with k.db.connect() as conn:
            return turns.get_turn(conn, tenant, turn.id)

    after = work()
    assert after.status == "queued" and after.step == 1 and after.pending_tools == 0 and after.input_tokens == 3


def test_audit_rows_are_append_only(harness: Harness) -> None:
    tenant = harness.tenant("acme")

    def work():
        with harness.k.db.begin() as conn:
            write_entries(conn, [AuditEntry(tenant_id=tenant, kind="tool_call", subject="x", ok=True, payload={})])
        for stmt in (decisions.update().values(ok=False), decisions.delete()):
            # SQLite reports the trigger's RAISE as a constraint failure, PostgreSQL as an error
            with pytest.raises((StorageError, Conflict)):
                with harness.k.db.begin() as conn:
                    conn.execute(stmt)
        with harness.k.db.connect() as conn:
            rows = (conn.execute(decisions.select())).all()
        assert [(r.tenant_id, r.ok) for r in rows] == [(tenant, True)]

    work()


def test_an_idempotent_replay_writes_nothing(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    session = _session(harness, tenant)
    _new(harness, tenant, session, key="k1")
    for _ in range(3):
        _new(harness, tenant, session, key="k1")

    with harness.k.db.connect() as conn:
        assert chats.get_session(conn, tenant, session).turn_count == 1


def claim_reads_its_own_spend_and_kept_events(h: Harness) -> None:
    """The claim's one statement reads the spend of its own tenant and session (and whether
    its own turn has kept events), not a neighbour's: shared with the PostgreSQL test."""
    acme, other = h.tenant("acme"), h.tenant("other")
    spent_session, quiet_session, other_session = _session(h, acme), _session(h, acme), _session(h, other)
    earlier = _new(h, acme, spent_session).turn
    with h.k.db.begin() as conn:
        conn.execute(turn_table.update().where(turn_table.c.id == earlier.id)
                     .values(status="done", input_tokens=300, output_tokens=45))
        add_spend(conn, acme, utcnow().date(), 2.5, 3)
        conn.execute(tenants.update().where(tenants.c.id == acme).values(settings={"daily_usd_limit": 9}))
    mine, quiet, theirs = (_new(h, acme, spent_session).turn, _new(h, acme, quiet_session).turn,
                           _new(h, other, other_session).turn)
    with h.k.db.begin() as conn:
        conn.execute(stream_outbox.insert().values(tenant_id=acme, turn_id=quiet.id, attempt=0, final=False,
                                                   events=[], created_at=datetime.now(UTC)))
    with h.k.db.connect() as conn:
        got = turns.claim(conn, acme, mine.id, 0, lease=60)
        assert got is not None and got.turn.status == "running" and got.turn.attempt == 1
        assert (got.spent.usd_today, got.spent.session_tokens, got.spent.tenant_settings) == (2.5, 345, {"daily_usd_limit": 9})
        assert got.turn.kept_events is False
        fresh = turns.claim(conn, acme, quiet.id, 0, lease=60)
        assert fresh is not None and (fresh.spent.usd_today, fresh.spent.session_tokens) == (2.5, 0) and fresh.turn.kept_events
        stranger = turns.claim(conn, other, theirs.id, 0, lease=60)
        assert stranger is not None and (stranger.spent.usd_today, stranger.spent.session_tokens) == (0.0, 0)
        assert stranger.spent.tenant_settings == {} and not stranger.turn.kept_events
        assert turns.claim(conn, acme, mine.id, 0, lease=60) is None  # claimed once


def test_a_claim_reads_its_own_spend_and_kept_events(harness: Harness) -> None:
    claim_reads_its_own_spend_and_kept_events(harness)


def claim_reads_the_sessions_history_as_load_history_does(h: Harness, *, one_statement: bool) -> None:
    """With ``history``, the claim hands back what ``load_history`` reads (the same window,
    widened back to a user message), of its own session only; on PostgreSQL in its own
    statement (``one_statement``), elsewhere it leaves the read to the caller. Shared with
    the PostgreSQL test."""
    acme = h.tenant("acme")
    session, neighbour = _session(h, acme), _session(h, acme)
    first = _new(h, acme, session, content="q1").turn
    calls = (ToolCall(id="c1", name="get_deploys", arguments={"product": "checkout", "n": 12345678901234567890}),)
    with h.k.db.connect() as conn:
        assert turns.claim(conn, acme, first.id, 0, lease=60) is not None
    with h.k.db.begin() as conn:
        turns.park_for_tools(conn, turns.get_turn(conn, acme, first.id), step=0,
                             message=AssistantMessage(content="looking", tool_calls=calls), usage=Usage(),
                             model_used="scripted:x", refused={})
        conn.execute(turn_table.update().where(turn_table.c.id == first.id).values(status="done"))
        conn.execute(chats.INSERT_MESSAGE, chats.message_row(
            tenant_id=acme, session_id=session, turn_id=first.id, turn_no=first.turn_no, step=0, ord=1,
            message=ToolMessage(result=ToolResult(call_id="c1", name="get_deploys", content={"deploys": ["v2"]},
                                                  is_error=True, error_code="upstream", truncated=True))))
    _new(h, acme, neighbour, content="not mine")
    second = _new(h, acme, session, content="q2").turn
    with h.k.db.connect() as conn:
        expected = {limit: chats.load_history(conn, acme, session, limit=limit) for limit in (2, 4, 50)}
    assert [m.role for m in expected[50]] == ["user", "assistant", "tool", "user"]
    assert [m.role for m in expected[2]] == ["user"]  # the window's leading tool result is dropped
    for limit in (2, 4, 50):
        with h.k.db.connect() as conn:
            conn.execute(turn_table.update().where(turn_table.c.id == second.id).values(status="queued"))
            got = turns.claim(conn, acme, second.id, 0, lease=60, history=limit)
        assert got is not None and got.turn.id == second.id and got.turn.status == "running"
        if one_statement:
            assert got.history == expected[limit]
        else:
            assert got.history is None
    with h.k.db.connect() as conn:
        assert turns.claim(conn, acme, second.id, 0, lease=60, history=50) is None  # claimed: nothing read


def test_a_claim_leaves_the_history_to_its_caller_where_one_statement_cannot_read_it(harness: Harness) -> None:
    claim_reads_the_sessions_history_as_load_history_does(harness, one_statement=False)
