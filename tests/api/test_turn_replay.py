"""A finished turn whose Redis stream expired, as a client reads it over SSE: the rebuild from the
database says what the live stream said (kortex/turns/replay.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from api.main import create_app
from kortex.storage.schema import turns as turns_table
from kortex.testing.inline import drive
from kortex.timeparse import utcnow
from kortex.turns.handoff import Handoff
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from kortex.turns.watchdog import sweep
from tests.api.conftest import bearer
from tests.conftest import Harness


class Env:
    def __init__(self, client: TestClient, h: Harness) -> None:
        self.client, self.h = client, h
        self.handoffs: list[Handoff] = []
        self.headers = bearer(h.api_key(h.tenant("acme")))

    def post(self, model: str) -> str:
        sid = self.client.post("/v1/sessions", json={"model": model}, headers=self.headers).json()["id"]
        posted = self.client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=self.headers)
        assert posted.status_code == 202, posted.text
        return str(posted.json()["turn_id"])

    def events(self, turn_id: str, **headers: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, event, data) of each event the client is sent."""
        response = self.client.get(f"/v1/turns/{turn_id}/events", headers={**self.headers, **headers})
        assert response.status_code == 200, response.text
        out = []
        for block in response.text.split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":") and ": " in line)
            if "event" in fields:
                out.append((fields["id"], fields["event"], json.loads(fields["data"])))
        return out

    def live_then_replayed(self, turn_id: str) -> tuple[list[tuple[str, str, dict[str, Any]]],
                                                        list[tuple[str, str, dict[str, Any]]]]:
        live = self.events(turn_id)
        self.h.k.events.delete(turn_id)  # as its TTL would, an hour after done
        return live, self.events(turn_id)


@pytest.fixture
def env(harness: Harness) -> Iterator[Env]:
    box: list[Env] = []
    app = create_app(harness.settings, dispatch=lambda handoff: box[0].handoffs.append(handoff),
                     embedded_worker=False)
    with TestClient(app) as client:
        box.append(Env(client, harness))
        yield box[0]


def _without_stamps(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in ("attempt", "seq")}


def test_a_replay_has_the_proposal_card_after_its_result_as_live(env: Env) -> None:
    turn_id = env.post("scripted:propose")
    drive(env.h.k, env.handoffs[-1])
    live, replayed = env.live_then_replayed(turn_id)
    assert [e for _, e, _ in replayed] == [e for _, e, _ in live] == [
        "turn", "text", "tool_call", "tool_result", "proposal", "turn", "text", "done"]
    live_card = next(d for _, e, d in live if e == "proposal")
    replayed_card = next(d for _, e, d in replayed if e == "proposal")
    assert _without_stamps(replayed_card) == _without_stamps(live_card)


def test_every_replayed_event_is_numbered_from_1_under_the_turns_attempt(env: Env) -> None:
    turn_id = env.post("scripted:two_tools")
    drive(env.h.k, env.handoffs[-1])
    live, replayed = env.live_then_replayed(turn_id)
    # seq 1, 2, 3 ... with no gaps, as the README promises of every event, and the id's second part.
    assert [d["seq"] for _, _, d in replayed] == list(range(1, len(replayed) + 1))
    assert [i for i, _, _ in replayed] == [f"0-{n}" for n in range(1, len(replayed) + 1)]
    last_attempt = live[-1][2]["attempt"]  # the step that finished the turn
    assert last_attempt > 1 and {d["attempt"] for _, _, d in replayed} == {last_attempt}
    # A body reads as the live one does: the stamps last.
    raw = env.client.get(f"/v1/turns/{turn_id}/events", headers=env.headers).text
    assert f',"attempt":{last_attempt},"seq":1}}' in raw
    # Resuming inside the rebuild gets its rest, still numbered as before.
    rest = env.events(turn_id, **{"Last-Event-ID": "0-3"})
    assert [(i, e, d["seq"]) for i, e, d in rest] == [(i, e, d["seq"]) for i, e, d in replayed[3:]]


def test_a_turn_cancelled_mid_stream_replays_no_error_the_live_stream_never_had(env: Env) -> None:
    turn_id = env.post("scripted:slow_text")
    runner = threading.Thread(target=drive, args=(env.h.k, env.handoffs[-1]))
    runner.start()
    try:
        until = time.monotonic() + 10
        while not any(e.type == "text" for e in env.h.k.events.read(turn_id)):
            assert time.monotonic() < until, "the step never streamed"
            time.sleep(0.02)
        cancelled = env.client.post(f"/v1/turns/{turn_id}/cancel", headers=env.headers)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    finally:
        runner.join(10)
    live, replayed = env.live_then_replayed(turn_id)
    assert [e for _, e, _ in live if e in ("error", "done")] == ["done"]
    assert [e for _, e, _ in replayed] == ["done"]  # the cut-off text was never stored
    assert replayed[-1][2]["status"] == "cancelled" and replayed[-1][2]["error"] == "cancelled"
    assert replayed[-1][2]["attempt"] == live[-1][2]["attempt"] == 1


def test_a_turn_failed_by_its_deadline_replays_its_ending_as_live(env: Env) -> None:
    turn_id = env.post("scripted:two_tools")
    posted = env.handoffs[-1]
    parked = run_step(env.h.k, posted.steps[0].tenant_id, turn_id, 0)
    # The second call returns; the first is still open when the deadline passes.
    ran = next(t for t in parked.tools if t.tool == "get_logs")
    run_tool(env.h.k, ran.tenant_id, ran.invocation_id, ran.tool, ran.hard_limit, ran.trace)
    with env.h.k.db.begin() as conn:
        conn.execute(update(turns_table).where(turns_table.c.id == turn_id)
                     .values(deadline_at=utcnow() - timedelta(seconds=1)))
    assert sweep(env.h.k).failed_turns == 1
    live, replayed = env.live_then_replayed(turn_id)

    def told(events: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, Any]]:
        return [(e, d.get("call_id") or d.get("code") or d.get("status")) for _, e, d in events if e != "text"]

    # The ending tells of the call it settled after the result that came in, then fails the turn.
    assert told(replayed) == told(live) == [
        ("turn", "running"), ("tool_call", "call_deploys"), ("tool_call", "call_logs"),
        ("tool_result", "call_logs"), ("tool_result", "call_deploys"), ("error", "deadline_exceeded"),
        ("done", "failed")]
    settled = [_without_stamps(d) for _, e, d in (*live, *replayed) if e == "tool_result"
               and d["call_id"] == "call_deploys"]
    assert settled[0] == settled[1] and settled[0]["error_code"] == "cancelled"


@pytest.mark.parametrize(("script", "retryable"), [("cut_off", True), ("fail", False)])
def test_a_failed_turn_replays_whether_its_error_may_be_tried_again(env: Env, script: str, retryable: bool) -> None:
    turn_id = env.post(f"scripted:{script}")
    drive(env.h.k, env.handoffs[-1])
    live, replayed = env.live_then_replayed(turn_id)
    [said] = [d for _, e, d in live if e == "error"]
    [again] = [d for _, e, d in replayed if e == "error"]
    assert said["retryable"] is again["retryable"] is retryable  # a client offers "try again" on it
    assert _without_stamps(again) == _without_stamps(said)
