"""What a client is told a cancelled turn cost, on the real stack (the API under uvicorn, a Celery
worker streaming from the fake LLM server over the Anthropic wire format, PostgreSQL, Redis):
the ``done`` it reads, the answer to its cancel and GET /v1/turns/{id} all say what the turn's
audit rows billed, the LLM call the cancel cut short included."""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import httpx
import pytest

from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.integration.sse import read_events
from tests.integration.test_turns import auth, start_turn

pytestmark = pytest.mark.integration

DEPLOYS = {"product": "checkout", "time_range": "last 2h"}


@pytest.fixture(scope="module")
def tenant(pg: Harness) -> tuple[str, str]:
    tenant_id = pg.tenant("cancel-usage")
    pg.seed(tenant_id)
    return tenant_id, pg.api_key(tenant_id)


def _streamed(pg: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [{"type": e.type, **json.loads(e.data)} for e in pg.k.events.read(turn_id)]


def _settled(pg: Harness, turn_id: str, calls: int) -> tuple[int, int, float, int]:
    """The audit rows once the stopped step has billed its cut call (it does so as it winds down)."""
    deadline = time.monotonic() + 30
    while (billed := pg.billed(turn_id))[3] < calls:
        assert time.monotonic() < deadline, f"the turn's {calls} LLM calls were not all audited: {billed}"
        time.sleep(0.1)
    return billed


def test_a_cancel_mid_answer_reports_what_the_cut_call_billed(api_url: str, pg: Harness, tenant,
                                                              fake_llm: FakeLLM) -> None:
    _, key = tenant
    # Step 0 calls a tool at once; step 1 answers slowly (60 pieces at 10 a second): the cancel
    # lands while its call is mid-stream, its prompt already billed (message_start), its end not.
    fake_llm.add("claude-sonnet-4-6", {"steps": [
        {"text": ["Checking deploys."], "usage": {"input_tokens": 2000, "output_tokens": 50},
         "tool_calls": [{"id": "call_cancel_usage", "name": "get_recent_deploys", "arguments": DEPLOYS}]},
        {"text": [f"w{i} " for i in range(60)], "tokens_per_s": 10,
         "usage": {"input_tokens": 3000, "output_tokens": 400}}]})
    started = start_turn(api_url, key, "why is checkout slow? (cancel usage)", model="anthropic:claude-sonnet-4-6")
    turn_id = started["turn_id"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(read_events, api_url + started["events_url"], key)  # a client following live
        deadline = time.monotonic() + 20
        while sum(1 for e in _streamed(pg, turn_id) if e["type"] == "text" and e["step"] == 1) < 2:
            assert time.monotonic() < deadline, _streamed(pg, turn_id)
            time.sleep(0.02)
        asked = time.monotonic()
        cancelled = httpx.post(f"{api_url}/v1/turns/{turn_id}/cancel", headers=auth(key), timeout=10)
        seen = live.result(timeout=20)
        ended = time.monotonic() - asked
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert seen[-1].event == "done" and seen[-1].data["status"] == "cancelled"
    assert ended < 1.5, f"the stream took {ended:.2f}s to end after the cancel"  # still prompt
    text = "".join(e.data["delta"] for e in seen if e.event == "text")
    assert "w59" not in text  # the answer was cut short

    billed_in, billed_out, billed_cost, _ = _settled(pg, turn_id, calls=2)
    assert billed_in == 5000 and billed_out > 50  # both prompts, and the cut answer's output so far
    told = seen[-1].data["usage"]
    assert (told["input_tokens"], told["output_tokens"]) == (billed_in, billed_out), (told, billed_in, billed_out)
    assert told["cost_usd"] == pytest.approx(billed_cost)
    # What the cancel answered and what GET says later are the same figure.
    answered = cancelled.json()["usage"]
    assert (answered["input_tokens"], answered["output_tokens"]) == (billed_in, billed_out)
    stored = httpx.get(f"{api_url}/v1/turns/{turn_id}", headers=auth(key)).json()["usage"]
    assert (stored["input_tokens"], stored["output_tokens"]) == (billed_in, billed_out)
    assert stored["cost_usd"] == pytest.approx(billed_cost)
    # A client arriving later reads the same done.
    again = read_events(api_url + started["events_url"], key)
    assert again[-1].data == seen[-1].data


def test_a_cancel_while_the_model_is_silent_stops_its_call_at_once_and_done_counts_it(api_url: str, pg: Harness, tenant,
                                                                             fake_llm: FakeLLM) -> None:
    _, key = tenant
    # Step 1's model bills its prompt at once (message_start) and then says nothing for 4 s: its
    # step writes nothing, so the fence alone would stop it only at its first piece (or its
    # lease's renewal, 20 s on), after done. The stop announced on Redis reaches it at once.
    fake_llm.add("claude-sonnet-4-6", {"steps": [
        {"text": ["Checking deploys."], "usage": {"input_tokens": 2000, "output_tokens": 50},
         "tool_calls": [{"id": "call_cancel_silent", "name": "get_recent_deploys", "arguments": DEPLOYS}]},
        {"text": ["late ", "answer"], "first_token_ms": 4000, "usage": {"input_tokens": 3000, "output_tokens": 400}}]})
    started = start_turn(api_url, key, "why is checkout slow? (cancel silent)", model="anthropic:claude-sonnet-4-6")
    turn_id = started["turn_id"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(read_events, api_url + started["events_url"], key)
        deadline = time.monotonic() + 20
        while not any(e["type"] == "turn" and e["step"] == 1 for e in _streamed(pg, turn_id)):
            assert time.monotonic() < deadline, _streamed(pg, turn_id)
            time.sleep(0.02)
        time.sleep(0.5)  # the call is open, its prompt billed, no text yet
        asked = time.monotonic()
        cancelled = httpx.post(f"{api_url}/v1/turns/{turn_id}/cancel", headers=auth(key), timeout=10)
        seen = live.result(timeout=20)
        ended = time.monotonic() - asked
    assert cancelled.status_code == 200 and seen[-1].event == "done" and seen[-1].data["status"] == "cancelled"
    assert ended < 1.5, f"the stream took {ended:.2f}s to end after the cancel"
    assert "usage_pending" not in [e.data.get("code") for e in seen if e.event == "error"]
    billed_in, billed_out, billed_cost, calls = pg.billed(turn_id)
    assert (calls, billed_in) == (2, 5000)  # both calls billed by the time done was sent: the cut one stopped at once
    told, answered = seen[-1].data["usage"], cancelled.json()["usage"]
    stored = httpx.get(f"{api_url}/v1/turns/{turn_id}", headers=auth(key)).json()["usage"]
    for usage in (told, answered, stored):
        assert (usage["input_tokens"], usage["output_tokens"]) == (billed_in, billed_out)
        assert usage["cost_usd"] == pytest.approx(billed_cost)
    time.sleep(4.5)  # past when the model would have spoken: its call was closed, so nothing came of it
    assert "late" not in "".join(e["delta"] for e in _streamed(pg, turn_id) if e["type"] == "text")
    assert pg.billed(turn_id) == (billed_in, billed_out, billed_cost, calls)
