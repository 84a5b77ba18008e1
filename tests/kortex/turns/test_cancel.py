"""Cancelling a turn: what the stream, the turn, the history and the audit trail say after it,
whatever the turn was doing (queued, streaming, waiting for a tool)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from sqlalchemy import select

from kortex.errors import Conflict, NotFound
from kortex.storage.schema import decisions, tool_invocations
from kortex.testing.inline import drive
from kortex.turns import chat
from kortex.turns.cancel import cancel
from tests.conftest import Harness


def _kinds(h: Harness, turn_id: str) -> list[str]:
    return [e.type for e in h.events(turn_id)]


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_queued_turn_is_cancelled_and_its_step_never_runs(harness: Harness) -> None:
    h = harness
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:slow_text")
    posted = chat.post_message(h.k, tenant, session.id, "hello")
    turn = cancel(h.k, tenant, posted.turn.id, by="key:abc")
    assert turn.status == "cancelled" and turn.finished and turn.error == {"code": "cancelled",
                                                                          "message": "the turn was cancelled"}
    drive(h.k, posted.handoff)  # the step's message arrives late: its claim finds the turn over
    assert _kinds(h, posted.turn.id) == ["done"]
    done = json.loads(h.events(posted.turn.id)[-1].data)
    assert done["status"] == "cancelled" and done["error"] == "cancelled"
    assert chat.get_turn(h.k, tenant, posted.turn.id).status == "cancelled"
    with h.k.db.connect() as conn:
        rows = conn.execute(select(decisions.c.kind, decisions.c.payload).where(
            decisions.c.turn_id == posted.turn.id)).all()
    assert [(r.kind, r.payload["by"], r.payload["status_was"]) for r in rows] == [("turn_cancelled", "key:abc",
                                                                                  "queued")]
    # the session takes a new message at once: the cancelled turn no longer holds it
    assert chat.post_message(h.k, tenant, session.id, "again").turn.status == "queued"


def test_a_streaming_step_stops_at_its_next_chunk_and_its_call_is_audited(harness_factory,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kortex.turns.step")
    h = harness_factory(turn={"text_flush_ms": 0})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:long_text")  # twenty pieces, 200 ms apart
    posted = chat.post_message(h.k, tenant, session.id, "slowly")
    runner = threading.Thread(target=drive, args=(h.k, posted.handoff))
    runner.start()
    _wait(lambda: "text" in _kinds(h, posted.turn.id))
    cancel(h.k, tenant, posted.turn.id, by="key:abc")
    runner.join(10)
    assert not runner.is_alive()
    kinds = _kinds(h, posted.turn.id)
    assert kinds[-1] == "done" and kinds.count("done") == 1
    text = "".join(json.loads(e.data)["delta"] for e in h.events(posted.turn.id) if e.type == "text")
    assert text and "tok20" not in text  # cut short (it had 4 s to go), nothing after done
    with h.k.db.connect() as conn:
        calls = conn.execute(select(decisions.c.ok, decisions.c.input_tokens, decisions.c.output_tokens).where(
            decisions.c.turn_id == posted.turn.id, decisions.c.kind == "llm_call")).all()
    assert len(calls) == 1 and not calls[0].ok  # the cut call is audited (and billed if it cost)
    turn = chat.get_turn(h.k, tenant, posted.turn.id)
    assert turn.status == "cancelled"
    # what the cut call billed is the turn's (and so its session's token cap's) as well
    billed = calls[0]
    assert billed.output_tokens > 0
    assert (turn.input_tokens, turn.output_tokens) == (billed.input_tokens, billed.output_tokens)
    # and what done told the client: the cut call's bill included (the cancel waited for it)
    told = json.loads(h.events(posted.turn.id)[-1].data)["usage"]
    assert (told["input_tokens"], told["output_tokens"]) == (billed.input_tokens, billed.output_tokens)
    assert "error" not in kinds  # billed in time: no usage_pending notice
    # A cancel is no hand-over to another attempt: said as what it is, not as a warning.
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "kortex.turns.step"]
    assert (logging.INFO, f"step 0 of turn {posted.turn.id} stopped: the turn ended (cancelled) while the step ran") \
        in said and not any(level >= logging.WARNING for level, _ in said), said


def test_a_turn_waiting_for_a_tool_is_cancelled_and_the_late_result_is_ignored(harness: Harness) -> None:
    h = harness
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:slow_tool")  # debug_sleep 2.5 s
    posted = chat.post_message(h.k, tenant, session.id, "wait")
    runner = threading.Thread(target=drive, args=(h.k, posted.handoff))
    runner.start()
    _wait(lambda: _invocation_status(h, posted.turn.id) == "running")  # the tool is sleeping
    cancel(h.k, tenant, posted.turn.id, by="key:abc")
    runner.join(15)
    assert not runner.is_alive()
    events = h.events(posted.turn.id)
    # The client is told the call will not finish, before done; the tool's own result, which
    # came after done, is never published.
    assert [e.type for e in events][-2:] == ["tool_result", "done"]
    assert [e.type for e in events].count("tool_result") == 1
    told = json.loads(events[-2].data)
    assert (told["call_id"], told["is_error"], told["error_code"]) == (inv_call_id(h, posted.turn.id), True,
                                                                       "cancelled")
    with h.k.db.connect() as conn:
        inv = conn.execute(select(tool_invocations.c.status, tool_invocations.c.error_code).where(
            tool_invocations.c.turn_id == posted.turn.id)).one()
        audited = conn.execute(select(decisions.c.subject, decisions.c.payload).where(
            decisions.c.turn_id == posted.turn.id, decisions.c.kind == "tool_call")).all()
    assert (inv.status, inv.error_code) == ("done", "cancelled")
    # the call ran to its end all the same: it has its audit row, one
    assert [(a.subject, a.payload["call_id"]) for a in audited] == [("debug_sleep", told["call_id"])]
    history = [m.role for m in chat_history(h, tenant, session.id)]
    assert history == ["user", "assistant", "tool"]  # the call has its (cancelled) result: vendors need one


def _invocation_status(h: Harness, turn_id: str) -> str | None:
    with h.k.db.connect() as conn:
        return conn.scalar(select(tool_invocations.c.status).where(tool_invocations.c.turn_id == turn_id))


def inv_call_id(h: Harness, turn_id: str) -> str:
    with h.k.db.connect() as conn:
        return str(conn.scalar(select(tool_invocations.c.call_id).where(tool_invocations.c.turn_id == turn_id)))


def chat_history(h: Harness, tenant: str, session_id: str) -> list:
    from kortex.storage import chats
    with h.k.db.connect() as conn:
        return chats.list_messages(conn, tenant, session_id, after=None, limit=100)


def test_cancelling_twice_is_the_same_and_a_finished_turn_refuses(harness: Harness) -> None:
    h = harness
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:text_only")
    posted = chat.post_message(h.k, tenant, session.id, "hi")
    first = cancel(h.k, tenant, posted.turn.id, by="key:abc")
    again = cancel(h.k, tenant, posted.turn.id, by="key:abc")
    assert first.status == again.status == "cancelled" and first.finished_at == again.finished_at
    assert _kinds(h, posted.turn.id) == ["done"]  # one done, one audit row
    done = h.ask(tenant, "hi", model="scripted:text_only")
    with pytest.raises(Conflict) as refused:
        cancel(h.k, tenant, done.id, by="key:abc")
    assert refused.value.code == "turn_finished" and refused.value.details == {"status": "done"}
    other = h.tenant("other")
    with pytest.raises(NotFound):
        cancel(h.k, other, posted.turn.id, by="key:abc")  # another tenant's turn does not exist for it


def test_a_turn_whose_worker_died_is_cancelled_at_once_and_its_lost_call_audited(harness: Harness) -> None:
    # Claimed by a worker that is gone (its lease lapsed, no sweep has handed the step on yet):
    # no step is left to bill the call it made, so the cancel neither waits for one nor says a
    # bill is pending; the call gets its worker_lost row, as the sweep would have written.
    from datetime import timedelta

    from sqlalchemy import update

    from kortex.storage.schema import turns
    from kortex.timeparse import utcnow
    from kortex.turns.closing import BILL_WAIT

    tenant = harness.tenant("acme")
    session = chat.create_session(harness.k, tenant, "s", "scripted:text_only")
    posted = chat.post_message(harness.k, tenant, session.id, "hello")
    with harness.k.db.begin() as conn:
        conn.execute(update(turns).where(turns.c.id == posted.turn.id)
                     .values(status="running", attempt=1, lease_until=utcnow() - timedelta(seconds=1)))
    started = time.monotonic()
    cancelled = cancel(harness.k, tenant, posted.turn.id, by="test")
    assert cancelled.status == "cancelled" and time.monotonic() - started < BILL_WAIT
    events = [json.loads(e.data) | {"type": e.type} for e in harness.events(posted.turn.id)]
    assert events[-1]["type"] == "done" and "usage_pending" not in [e.get("code") for e in events]
    with harness.k.db.connect() as conn:
        payloads = conn.execute(select(decisions.c.payload).where(decisions.c.turn_id == posted.turn.id,
                                                                  decisions.c.kind == "llm_call")).scalars().all()
    assert [(p["error_code"], p["settled_by"]) for p in payloads] == [("worker_lost", "cancel")]
