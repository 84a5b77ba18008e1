"""A whole turn, driven in-process over SQLite: the state machine, events and audit."""

from __future__ import annotations

import json

from sqlalchemy import select, update

from kortex.storage import audit, invocations
from kortex.storage.schema import tool_invocations
from kortex.testing.inline import drive
from kortex.turns import chat, watchdog
from tests.conftest import Harness


def _types(entries: list) -> list[str]:
    return [e.type for e in entries]


def test_two_tool_turn_streams_events_in_order_and_stores_the_conversation(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    turn = harness.ask(tenant, "why?", model="scripted:two_tools")
    assert turn.status == "done" and turn.step == 1
    entries = harness.events(turn.id)
    types = _types(entries)
    assert types[0] == "turn" and types[-1] == "done"
    # text_flush_ms=0 in tests: one text event per streamed piece (three per step in the script)
    assert types == ["turn", "text", "text", "text", "tool_call", "tool_call", "tool_result", "tool_result",
                     "turn", "text", "text", "text", "done"]
    data = [json.loads(e.data) for e in entries]
    calls = [d["call_id"] for d in data if d["type"] == "tool_call"]
    results = {d["call_id"]: d for d in data if d["type"] == "tool_result"}
    assert calls == ["call_deploys", "call_logs"] and set(results) == set(calls)
    assert results["call_deploys"]["content"]["deploys"][0]["version"] == "v2.14.0"
    assert len(results["call_logs"]["content"]["lines"]) == 5
    text = "".join(d["delta"] for d in data if d["type"] == "text")
    assert text == "Checking deploys and errors.Deploy v2.14.0 exhausted the pool."
    roles = [(m.role, m.step, m.ord) for m in harness.messages(tenant, turn.session_id)]
    assert roles == [("user", -1, 0), ("assistant", 0, 0), ("tool", 0, 1), ("tool", 0, 2), ("assistant", 1, 0)]
    rows = _audit(harness, tenant, turn.id)
    assert sorted(r["kind"] for r in rows) == ["llm_call", "llm_call", "tool_call", "tool_call"]
    assert all(r["tenant_id"] == tenant for r in rows)
    usage = data[-1]["usage"]
    assert usage["input_tokens"] == turn.input_tokens > 0


def _audit(h: Harness, tenant: str, turn_id: str) -> list[dict]:
    with h.k.db.connect() as conn:
        return audit.list_for_turn(conn, tenant, turn_id)


def test_tool_errors_are_fed_back_to_the_model_and_the_turn_finishes(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = harness.ask(tenant, "try", model="scripted:bad_calls")
    assert turn.status == "done"
    results = {json.loads(e.data)["call_id"]: json.loads(e.data) for e in harness.events(turn.id)
               if e.type == "tool_result"}
    assert results["call_badargs"]["error_code"] == "validation"
    assert "limit" in results["call_badargs"]["content"]["message"]
    assert "time_range" in results["call_badargs"]["content"]["message"]
    assert results["call_unknown"]["error_code"] == "policy_denied"
    assert results["call_badjson"]["error_code"] == "invalid_json"
    assert all(r["is_error"] for r in results.values())
    tool_messages = [m for m in harness.messages(tenant, turn.session_id) if m.role == "tool"]
    assert {m.error_code for m in tool_messages} == {"validation", "policy_denied", "invalid_json"}


def test_max_tool_depth_ends_the_turn_with_a_clear_message(harness_factory) -> None:
    h = harness_factory(llm={"max_tool_depth": 2})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "loop", model="scripted:loop")
    assert turn.status == "done"
    assert turn.error["code"] == "tool_depth_exceeded"
    entries = h.events(turn.id)
    assert _types(entries)[-2:] == ["error", "done"]
    assistant = [m for m in h.messages(tenant, turn.session_id) if m.role == "assistant"]
    assert len(assistant) == 3  # steps 0 and 1 called tools; step 2 hit the limit
    assert "max_tool_depth" in assistant[-1].content and assistant[-1].step == 2


def test_provider_failure_mid_stream_fails_the_turn_without_duplicating_text(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = harness.ask(tenant, "boom", model="scripted:fail")
    assert turn.status == "failed"
    data = [json.loads(e.data) for e in harness.events(turn.id)]
    assert [d["type"] for d in data] == ["turn", "text", "error", "done"]
    assert data[1]["delta"] == "Starting, "
    assert data[2]["code"] == "provider" and "upstream exploded" in data[2]["message"]
    assert data[3]["status"] == "failed"
    assert [m.role for m in harness.messages(tenant, turn.session_id)] == ["user"]


def test_unknown_model_is_rejected_before_a_turn_exists(harness: Harness) -> None:
    import pytest

    from kortex.errors import KortexError

    tenant = harness.tenant("acme")
    with pytest.raises(KortexError):
        harness.ask(tenant, "hi", model="scripted:no_such_script")
    with pytest.raises(KortexError):
        harness.ask(tenant, "hi", model="nope:model")


def test_watchdog_settles_a_tool_that_outlived_its_worker_and_resumes_the_turn(harness: Harness) -> None:
    tenant = harness.tenant("acme")

    def scenario():
        k = harness.k
        session = chat.create_session(k, tenant, "t", "scripted:two_tools")
        posted = chat.post_message(k, tenant, session.id, "go")
        from kortex.turns.step import run_step

        handoff = run_step(k, tenant, posted.turn.id, 0)
        assert len(handoff.tools) == 2
        # One tool was claimed by a worker that then died: mark it running, past its deadline.
        dead = handoff.tools[0]
        with k.db.begin() as conn:
            conn.execute(update(tool_invocations).where(tool_invocations.c.id == dead.invocation_id)
                               .values(status="running", deadline_at=posted.turn.created_at))
        from kortex.turns.toolrun import run_tool

        other = handoff.tools[1]
        assert not run_tool(k, tenant, other.invocation_id, other.tool, other.hard_limit)
        report = watchdog.sweep(k)
        assert report.timed_out_tools == 1
        assert [s.step for s in report.handoff.steps] == [1]
        drive(k, report.handoff)
        with k.db.connect() as conn:
            row = (conn.execute(select(tool_invocations).where(
                tool_invocations.c.id == dead.invocation_id))).one()
        assert row.is_error and row.error_code == "timeout"
        return chat.get_turn(k, tenant, posted.turn.id)

    turn = scenario()
    assert turn.status == "done"


def test_a_late_result_of_a_call_the_watchdog_answered_is_neither_stored_nor_published(harness: Harness) -> None:
    from kortex.messages import ToolResult
    from kortex.storage.records import InvocationRecord
    from kortex.turns.step import run_step
    from kortex.turns.toolrun import settle

    k = harness.k
    tenant = harness.tenant("acme")
    session = chat.create_session(k, tenant, "t", "scripted:two_tools")
    posted = chat.post_message(k, tenant, session.id, "go")
    handoff = run_step(k, tenant, posted.turn.id, 0)
    dead = handoff.tools[0]
    with k.db.begin() as conn:
        row = conn.execute(update(tool_invocations).where(tool_invocations.c.id == dead.invocation_id)
                           .values(status="running", deadline_at=posted.turn.created_at)
                           .returning(*tool_invocations.c)).one()
    stale = InvocationRecord.from_row(row)
    assert watchdog.sweep(k).timed_out_tools == 1
    # The worker was only slow: its result arrives after the watchdog's timeout answered it.
    late = ToolResult(call_id=stale.call_id, name=stale.name, content={"deploys": []})
    assert not settle(k, stale, late, [])
    results = [json.loads(e.data) for e in k.events.read(posted.turn.id) if e.type == "tool_result"]
    mine = [r for r in results if r["call_id"] == stale.call_id]
    assert len(mine) == 1 and mine[0]["is_error"] and mine[0]["error_code"] == "timeout"
    with k.db.connect() as conn:
        stored = conn.execute(select(tool_invocations).where(tool_invocations.c.id == dead.invocation_id)).one()
    assert stored.error_code == "timeout"


def test_watchdog_fails_turns_past_their_deadline_and_requeues_lost_handoffs(harness_factory) -> None:
    h = harness_factory(turn={"deadline": 600, "requeue_after": 0})
    tenant = h.tenant("acme")

    def scenario():
        k = h.k
        session = chat.create_session(k, tenant, "t", "scripted:text_only")
        lost = chat.post_message(k, tenant, session.id, "never enqueued")
        report = watchdog.sweep(k)  # requeue_after=0: the queued turn counts as lost
        assert [s.turn_id for s in report.handoff.steps] == [lost.turn.id]
        drive(k, report.handoff)
        assert (chat.get_turn(k, tenant, lost.turn.id)).status == "done"

        tooling = chat.create_session(k, tenant, "t2", "scripted:two_tools")
        stuck = chat.post_message(k, tenant, tooling.id, "stuck")
        from kortex.storage.schema import turns as turns_table
        from kortex.turns.step import run_step

        assert len(run_step(k, tenant, stuck.turn.id, 0).tools) == 2  # waiting on two tools forever
        with k.db.begin() as conn:
            conn.execute(update(turns_table).where(turns_table.c.id == stuck.turn.id)
                               .values(deadline_at=stuck.turn.created_at))
        report = watchdog.sweep(k)
        assert report.failed_turns == 1
        turn = chat.get_turn(k, tenant, stuck.turn.id)
        assert turn.status == "failed" and turn.error["code"] == "deadline_exceeded"
        events = k.events.read(stuck.turn.id)
        assert [e.type for e in events][-2:] == ["error", "done"]
        # the open calls were settled as cancelled, so the history stays valid for a vendor
        from kortex.storage import chats as chats_store

        with k.db.connect() as conn:
            history = chats_store.load_history(conn, tenant, tooling.id, limit=50)
        results = [m.result for m in history if m.role == "tool"]
        assert [(r.call_id, r.error_code) for r in results] == [("call_deploys", "cancelled"),
                                                                 ("call_logs", "cancelled")]

    scenario()


def test_a_step_delivered_twice_runs_once(harness: Harness) -> None:
    tenant = harness.tenant("acme")

    def scenario():
        from concurrent.futures import ThreadPoolExecutor

        from kortex.turns.step import run_step

        k = harness.k
        session = chat.create_session(k, tenant, "t", "scripted:two_tools")
        posted = chat.post_message(k, tenant, session.id, "go")
        with ThreadPoolExecutor(2) as pool:
            first, second = pool.map(lambda _: run_step(k, tenant, posted.turn.id, 0), range(2))
        assert len(first.tools) + len(second.tools) == 2  # exactly one of them ran the step
        drive(k, first + second)
        # late duplicates of every task change nothing
        again = run_step(k, tenant, posted.turn.id, 0)
        assert not again
        return posted.turn.id, session.id

    turn_id, session_id = scenario()
    messages = harness.messages(tenant, session_id)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]


def test_call_ids_a_model_repeats_across_steps_are_made_unique(harness_factory) -> None:
    h = harness_factory(llm={"max_tool_depth": 3})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "again and again", model="scripted:repeat_id")
    assert turn.status == "done" and turn.error["code"] == "tool_depth_exceeded"
    ids = [json.loads(e.data)["call_id"] for e in h.events(turn.id) if e.type == "tool_call"]
    assert len(ids) == 3 and len(set(ids)) == 3 and ids[0] == "call_same"
    results = [json.loads(e.data)["call_id"] for e in h.events(turn.id) if e.type == "tool_result"]
    assert results == ids


def test_a_step_whose_worker_died_runs_again_and_the_old_attempt_cannot_write(harness_factory) -> None:
    import pytest

    from kortex.errors import Conflict
    from kortex.messages import AssistantMessage, ToolCall, Usage
    from kortex.storage import turns as turn_store

    h = harness_factory(turn={"step_lease": 60})
    tenant = h.tenant("acme")
    k = h.k
    session = chat.create_session(k, tenant, "t", "scripted:two_tools")
    posted = chat.post_message(k, tenant, session.id, "go")
    with k.db.connect() as conn:  # a worker claims the step with a lease that lapses at once, then dies
        dead = turn_store.claim_step(conn, tenant, posted.turn.id, 0, lease=-1)
    assert dead is not None and dead.attempt == 1
    report = watchdog.sweep(k)
    assert [s.turn_id for s in report.handoff.steps] == [posted.turn.id]
    drive(k, report.handoff)
    turn = chat.get_turn(k, tenant, posted.turn.id)
    assert turn.status == "done" and turn.attempt >= 2
    starts = [json.loads(e.data) for e in h.events(posted.turn.id) if e.type == "turn"]
    assert starts[0]["step"] == 0 and starts[0]["attempt"] == 2
    with pytest.raises(Conflict), k.db.begin() as conn:  # the dead attempt's late write is refused
        turn_store.park_for_tools(conn, dead, step=0, usage=Usage(), model_used=None,
                                  message=AssistantMessage(tool_calls=(ToolCall(id="late", name="x"),)))


def test_a_streaming_step_renews_its_lease(harness_factory) -> None:
    import threading
    import time

    h = harness_factory(turn={"step_lease": 0.3, "text_flush_ms": 0})
    tenant = h.tenant("acme")
    k = h.k
    session = chat.create_session(k, tenant, "t", "scripted:slow_text")
    posted = chat.post_message(k, tenant, session.id, "slowly")
    runner = threading.Thread(target=drive, args=(k, posted.handoff))
    runner.start()
    requeued = []
    while runner.is_alive():  # a watchdog sweeping far more often than the lease lasts
        requeued += [s.turn_id for s in watchdog.sweep(k).handoff.steps]
        time.sleep(0.05)
    runner.join()
    turn = chat.get_turn(k, tenant, posted.turn.id)
    assert turn.status == "done" and turn.attempt == 1 and requeued == []
    assert "".join(json.loads(e.data)["delta"] for e in h.events(posted.turn.id) if e.type == "text") == \
        "one two three four five six"


def test_tool_calls_past_the_per_step_cap_get_an_error_result(harness_factory) -> None:
    h = harness_factory(llm={"max_tool_calls_per_step": 2})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "try", model="scripted:bad_calls")  # three calls in one answer
    assert turn.status == "done"
    results = {json.loads(e.data)["call_id"]: json.loads(e.data) for e in h.events(turn.id)
               if e.type == "tool_result"}
    assert results["call_badjson"]["error_code"] == "too_many_calls"
    assert {results["call_badargs"]["error_code"], results["call_unknown"]["error_code"]} == {"validation",
                                                                                               "policy_denied"}
    tool_messages = [m for m in h.messages(tenant, turn.session_id) if m.role == "tool"]
    assert len(tool_messages) == 3  # every call has its result in the history
    rows = {r["payload"]["call_id"]: r for r in _audit(h, tenant, turn.id) if r["kind"] == "tool_call"}
    assert set(rows) == set(results)  # and its audit row, refused or not
    assert rows["call_badjson"]["ok"] is False and rows["call_badjson"]["payload"]["error_code"] == "too_many_calls"


def test_a_proposal_whose_result_was_lost_is_the_answer_not_a_timeout(harness: Harness) -> None:
    from kortex.timeparse import utcnow
    from kortex.tools.spec import ToolContext
    from kortex.turns.step import run_step

    tenant = harness.tenant("acme")
    k = harness.k
    session = chat.create_session(k, tenant, "t", "scripted:propose")
    posted = chat.post_message(k, tenant, session.id, "fix it")
    (dispatch,) = run_step(k, tenant, posted.turn.id, 0).tools
    with k.db.connect() as conn:  # a worker takes the call, stores the proposal, and dies
        inv = invocations.claim_invocation(conn, tenant, dispatch.invocation_id, hard_limit=-10)
    ctx = ToolContext(tenant_id=tenant, session_id=inv.session_id, turn_id=inv.turn_id, call_id=inv.call_id,
                      step=0, now=utcnow(), sources=k.sources, services=dict(k.services))
    k.tools.get("propose_action").run(k.tools.get("propose_action").input_model.model_validate(inv.arguments), ctx)
    report = watchdog.sweep(k)
    assert report.timed_out_tools == 1 and [s.step for s in report.handoff.steps] == [1]
    drive(k, report.handoff)
    events = [json.loads(e.data) for e in harness.events(posted.turn.id)]
    result = next(e for e in events if e["type"] == "tool_result")
    assert not result["is_error"] and result["content"]["awaits_confirmation"] is True
    cards = [e for e in events if e["type"] == "proposal"]
    assert len(cards) == 1 and cards[0]["proposal_id"] == result["content"]["proposal_id"]
    assert len(k.proposals.list(tenant)) == 1  # the one the dead worker stored, nothing new
    assert chat.get_turn(k, tenant, posted.turn.id).status == "done"


def test_a_step_that_loses_its_lease_stops_reading_at_once_even_from_a_stalled_provider(harness_factory) -> None:
    import threading
    import time
    from datetime import timedelta

    from sqlalchemy import update

    from kortex.storage.schema import turns as turns_table
    from kortex.timeparse import utcnow
    from kortex.turns.step import run_step

    h = harness_factory(turn={"step_lease": 0.3, "text_flush_ms": 0})
    tenant = h.tenant("acme")
    k = h.k
    session = chat.create_session(k, tenant, "t", "scripted:stall")  # 10 s between its two chunks
    posted = chat.post_message(k, tenant, session.id, "go")
    (step,) = posted.handoff.steps
    runner = threading.Thread(target=run_step, args=(k, tenant, step.turn_id, step.step))
    runner.start()
    deadline = time.monotonic() + 5
    while not any(e.type == "turn" for e in h.events(posted.turn.id)):  # the step waits on the model
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.02)
    with k.db.begin() as conn:  # the lease lapses (a long GC pause, say) and the watchdog hands the step on
        conn.execute(update(turns_table).where(turns_table.c.id == posted.turn.id)
                     .values(lease_until=utcnow() - timedelta(seconds=1)))
    assert [s.turn_id for s in watchdog.sweep(k).handoff.steps] == [posted.turn.id]
    lost_at = time.monotonic()
    runner.join(5)
    assert not runner.is_alive() and time.monotonic() - lost_at < 2  # not the provider's 10 s stall
    rows = [r for r in _audit(h, tenant, posted.turn.id) if r["kind"] == "llm_call"]
    # The watchdog's row for the attempt it took away, and the attempt's own, with what it knew.
    assert sorted(r["payload"]["error_code"] for r in rows) == ["cancelled", "worker_lost"]
