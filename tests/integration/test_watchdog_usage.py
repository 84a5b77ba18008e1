"""What a client is told a turn the watchdog failed past its deadline cost, on the real stack (the
API under uvicorn, a Celery worker streaming from the fake LLM server over the Anthropic wire
format, ``kortex beat`` sweeping every second, PostgreSQL, Redis): the ``done`` it reads and
GET /v1/turns/{id} say what the turn's audit rows billed, the LLM call the deadline cut short
included.

The watchdog ends a running turn when the deadline it reads passes before the step's own time
limit does (their hosts' clocks differ, the step's process or loop stalls). The tests make that
so by moving the turn's deadline into the past while its step streams: the step's own limit,
set from the deadline it read at its claim, is minutes away, so the watchdog ends the turn."""

from __future__ import annotations

import concurrent.futures
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from kortex.storage.schema import turns
from kortex.testing.fakellm import FakeLLM
from kortex.timeparse import utcnow
from tests.conftest import Harness
from tests.integration.sse import read_events
from tests.integration.test_cancel_usage import _settled, _streamed
from tests.integration.test_turns import auth, start_turn

pytestmark = pytest.mark.integration

DEPLOYS = {"product": "checkout", "time_range": "last 2h"}


@pytest.fixture(scope="module")
def tenant(pg: Harness) -> tuple[str, str]:
    tenant_id = pg.tenant("watchdog-usage")
    pg.seed(tenant_id)
    return tenant_id, pg.api_key(tenant_id)


def _past_deadline(pg: Harness, turn_id: str) -> None:
    with pg.k.db.begin() as conn:
        conn.execute(update(turns).where(turns.c.id == turn_id).values(deadline_at=utcnow() - timedelta(seconds=1)))


def _script(call_id: str, answer: dict[str, Any]) -> dict[str, Any]:
    """Step 0 calls a tool at once (billed 2000/50); step 1 is ``answer``, billed 3000/400 if it ends."""
    return {"steps": [
        {"text": ["Checking deploys."], "usage": {"input_tokens": 2000, "output_tokens": 50},
         "tool_calls": [{"id": call_id, "name": "get_recent_deploys", "arguments": DEPLOYS}]},
        {**answer, "usage": {"input_tokens": 3000, "output_tokens": 400}}]}


def _assert_told_what_was_billed(api_url: str, key: str, turn_id: str, seen: list[Any], pg: Harness) -> None:
    done = seen[-1]
    assert done.event == "done" and (done.data["status"], done.data["error"]) == ("failed", "deadline_exceeded")
    assert "deadline_exceeded" in [e.data.get("code") for e in seen if e.event == "error"]
    assert "usage_pending" not in [e.data.get("code") for e in seen if e.event == "error"]  # billed in time
    billed_in, billed_out, billed_cost, _ = _settled(pg, turn_id, calls=2)  # once the cut call is billed
    assert billed_in == 5000 and billed_out >= 50  # both prompts
    told = done.data["usage"]
    assert (told["input_tokens"], told["output_tokens"]) == (billed_in, billed_out), (told, billed_in, billed_out)
    assert told["cost_usd"] == pytest.approx(billed_cost)
    stored = httpx.get(f"{api_url}/v1/turns/{turn_id}", headers=auth(key)).json()
    assert stored["status"] == "failed"
    assert (stored["usage"]["input_tokens"], stored["usage"]["output_tokens"]) == (billed_in, billed_out)
    assert stored["usage"]["cost_usd"] == pytest.approx(billed_cost)


def test_a_turn_failed_mid_answer_reports_what_the_cut_call_billed(api_url: str, pg: Harness, tenant,
                                                                   fake_llm: FakeLLM) -> None:
    _, key = tenant
    # Step 1 answers slowly (60 pieces at 10 a second): the deadline passes mid-stream, its prompt
    # billed by message_start, its end not.
    fake_llm.add("claude-sonnet-4-6", _script("call_wd_usage", {"text": [f"w{i} " for i in range(60)],
                                                                 "tokens_per_s": 10}))
    started = start_turn(api_url, key, "why is checkout slow? (watchdog usage)", model="anthropic:claude-sonnet-4-6")
    turn_id = started["turn_id"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(read_events, api_url + started["events_url"], key)  # a client following live
        deadline = time.monotonic() + 20
        while sum(1 for e in _streamed(pg, turn_id) if e["type"] == "text" and e["step"] == 1) < 2:
            assert time.monotonic() < deadline, _streamed(pg, turn_id)
            time.sleep(0.02)
        _past_deadline(pg, turn_id)
        seen = live.result(timeout=20)
    assert "w59" not in "".join(e.data["delta"] for e in seen if e.event == "text")  # cut short
    _assert_told_what_was_billed(api_url, key, turn_id, seen, pg)


def test_a_silent_models_call_is_stopped_at_once_and_done_counts_it(api_url: str, pg: Harness, tenant,
                                                                    fake_llm: FakeLLM) -> None:
    _, key = tenant
    # Step 1's model bills its prompt at once (message_start), then says nothing for 6 s: its step
    # writes nothing, so only the stop announced to the step engines ends it before done.
    fake_llm.add("claude-sonnet-4-6", _script("call_wd_silent", {"text": ["late ", "answer"], "first_token_ms": 6000}))
    started = start_turn(api_url, key, "why is checkout slow? (watchdog silent)", model="anthropic:claude-sonnet-4-6")
    turn_id = started["turn_id"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(read_events, api_url + started["events_url"], key)
        deadline = time.monotonic() + 20
        while not any(e["type"] == "turn" and e["step"] == 1 for e in _streamed(pg, turn_id)):
            assert time.monotonic() < deadline, _streamed(pg, turn_id)
            time.sleep(0.02)
        time.sleep(0.5)  # the call is open, its prompt billed, no text yet
        _past_deadline(pg, turn_id)
        asked = time.monotonic()
        seen = live.result(timeout=20)
        ended = time.monotonic() - asked
    assert ended < 4, f"the stream took {ended:.2f}s to end after the deadline passed"  # a sweep (1 s) and a stop
    _assert_told_what_was_billed(api_url, key, turn_id, seen, pg)
    time.sleep(6)  # past when the model would have spoken: its call was closed, so nothing came of it
    assert "late" not in "".join(e["delta"] for e in _streamed(pg, turn_id) if e["type"] == "text")
    assert pg.billed(turn_id)[3] == 2
