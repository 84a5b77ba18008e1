"""What a client is told a turn the watchdog failed past its deadline cost (kortex/turns/watchdog.py):
the step whose LLM call the deadline cut is stopped at once, wherever it runs, and ``done`` counts
that call's bill, as a cancel's does (kortex/turns/closing.py ``bill_cuts``). Many turns failed in
one sweep are stopped together and waited for once, not one wait after another.

The watchdog fails a running turn when the deadline it reads passes before the step's own time
limit ends the step (the hosts' clocks differ, the step's process or loop stalls): these tests
move the turn's deadline into the past while its step streams, so the watchdog, not the step,
ends the turn."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from kortex.storage.schema import decisions, turns
from kortex.testing.fakellm import FakeLLM
from kortex.testing.inline import drive
from kortex.timeparse import utcnow
from kortex.turns import chat, watchdog
from kortex.turns.closing import BILL_WAIT
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config


def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _kinds(h: Harness, turn_id: str) -> list[str]:
    return [e.type for e in h.events(turn_id)]


def _past_deadline(h: Harness, *turn_ids: str) -> None:
    with h.k.db.begin() as conn:
        conn.execute(update(turns).where(turns.c.id.in_(turn_ids)).values(deadline_at=utcnow() - timedelta(seconds=1)))


def _told(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [{"type": e.type, **json.loads(e.data)} for e in h.events(turn_id)]


def _assert_done_counts_the_cut_call(h: Harness, tenant: str, turn_id: str) -> dict[str, Any]:
    events = _told(h, turn_id)
    done = events[-1]
    assert (done["type"], done["status"], done["error"]) == ("done", "failed", "deadline_exceeded"), events[-3:]
    assert "usage_pending" not in [e.get("code") for e in events if e["type"] == "error"]  # billed in time
    billed_in, billed_out, billed_cost, calls = h.billed(turn_id)
    assert calls == 1
    assert (done["usage"]["input_tokens"], done["usage"]["output_tokens"]) == (billed_in, billed_out), (done, billed_in,
                                                                                                   billed_out)
    assert done["usage"]["cost_usd"] == billed_cost
    turn = chat.get_turn(h.k, tenant, turn_id)  # the row counts it too
    assert (turn.status, turn.input_tokens, turn.output_tokens) == ("failed", billed_in, billed_out)
    return done


def test_a_turn_failed_mid_answer_reports_what_the_cut_call_billed(harness_factory: Any) -> None:
    h = harness_factory()
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:long_text")  # twenty pieces, 200 ms apart
    posted = chat.post_message(h.k, tenant, session.id, "slowly")
    runner = threading.Thread(target=drive, args=(h.k, posted.handoff))
    runner.start()
    try:
        _wait(lambda: _kinds(h, posted.turn.id).count("text") >= 2)
        _past_deadline(h, posted.turn.id)
        assert watchdog.sweep(h.k).failed_turns == 1
    finally:
        runner.join(10)
    assert not runner.is_alive()
    done = _assert_done_counts_the_cut_call(h, tenant, posted.turn.id)
    assert done["usage"]["output_tokens"] > 0  # the cut answer's text so far
    text = "".join(e["delta"] for e in _told(h, posted.turn.id) if e["type"] == "text")
    assert "tok20" not in text


def test_a_silent_models_call_is_stopped_at_once_and_done_counts_its_prompt(harness_factory: Any,
                                                                           fake: FakeLLM) -> None:
    # The model bills its prompt at once (message_start) and then says nothing for 5 s: its step
    # writes nothing, so only the stop announced to step engines ends it before done.
    fake.add("claude-sonnet-4-6", {"steps": [{"text": ["late ", "answer"], "first_token_ms": 5000,
                                              "usage": {"input_tokens": 3000, "output_tokens": 400}}]})
    h = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)}})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "anthropic:claude-sonnet-4-6")
    posted = chat.post_message(h.k, tenant, session.id, "why?")
    runner = threading.Thread(target=drive, args=(h.k, posted.handoff))
    runner.start()
    try:
        _wait(lambda: len(fake.requests) == 1 and "turn" in _kinds(h, posted.turn.id))
        time.sleep(0.3)  # the call is open, its prompt billed by message_start, no text yet
        _past_deadline(h, posted.turn.id)
        started = time.monotonic()
        assert watchdog.sweep(h.k).failed_turns == 1
        took = time.monotonic() - started
        runner.join(3)  # long before the model would speak
        assert not runner.is_alive()
    finally:
        runner.join(10)
    done = _assert_done_counts_the_cut_call(h, tenant, posted.turn.id)
    assert done["usage"]["input_tokens"] == 3000
    assert took < BILL_WAIT, f"the sweep waited {took:.2f}s for a step the stop should end at once"


def test_many_turns_failed_at_once_are_waited_for_once_and_an_unbilled_cut_is_said(harness_factory: Any) -> None:
    """Running turns whose step never bills (its process is gone, or deaf to the stop): the sweep
    stops them all, waits once, at most ``BILL_WAIT`` in all, and each ``done`` follows a
    ``usage_pending`` notice."""
    h = harness_factory()
    tenant = h.tenant("acme")
    ids = []
    for n in range(6):
        session = chat.create_session(h.k, tenant, f"t{n}", "scripted:text_only")
        ids.append(chat.post_message(h.k, tenant, session.id, "never run").turn.id)
    with h.k.db.begin() as conn:  # as if claimed by a step that then went quiet
        conn.execute(update(turns).where(turns.c.id.in_(ids)).values(
            status="running", attempt=1, lease_until=utcnow() + timedelta(minutes=5)))
    _past_deadline(h, *ids)
    started = time.monotonic()
    assert watchdog.sweep(h.k).failed_turns == 6
    took = time.monotonic() - started
    assert BILL_WAIT <= took < 2 * BILL_WAIT, f"the sweep took {took:.2f}s for 6 turns"
    for turn_id in ids:
        events = _told(h, turn_id)
        assert [(e["type"], e.get("code")) for e in events] == [
            ("error", "deadline_exceeded"), ("error", "usage_pending"), ("done", None)], events
        assert events[-1]["status"] == "failed" and events[-1]["error"] == "deadline_exceeded"


def test_a_turn_whose_worker_died_before_its_deadline_passed_has_its_lost_call_audited(harness_factory: Any) -> None:
    # The worker died mid-step (its lease lapsed), and the deadline passed before a sweep handed
    # the step on: the deadline fails the turn first. The call that worker made still gets its
    # worker_lost row, as a lapsed step's does, and nothing waits for a bill no step will send.
    h = harness_factory()
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:long_text")
    posted = chat.post_message(h.k, tenant, session.id, "slowly")
    past = utcnow() - timedelta(seconds=1)
    with h.k.db.begin() as conn:  # claimed by a worker that is gone
        conn.execute(update(turns).where(turns.c.id == posted.turn.id)
                     .values(status="running", attempt=1, lease_until=past, deadline_at=past))
    started = time.monotonic()
    report = watchdog.sweep(h.k)
    assert report.failed_turns == 1 and time.monotonic() - started < BILL_WAIT
    events = _told(h, posted.turn.id)
    assert (events[-1]["type"], events[-1]["error"]) == ("done", "deadline_exceeded")
    assert "usage_pending" not in [e.get("code") for e in events if e["type"] == "error"]
    with h.k.db.connect() as conn:
        lost = conn.execute(select(decisions.c.payload).where(decisions.c.turn_id == posted.turn.id,
                                                             decisions.c.kind == "llm_call")).scalars().all()
    assert [p["error_code"] for p in lost] == ["worker_lost"]
    assert not report.handoff.steps  # failed, not run again
