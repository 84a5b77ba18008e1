"""Redis down when a tool result is stored: the result is kept in the outbox in the same
transaction and the watchdog publishes it once Redis is back, so the client sees every
structural event, late but in full. Runs on a private redis-server (AOF on, as deployed)
that the test kills and restarts on its own port, and on PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from kortex.storage.schema import stream_outbox
from kortex.turns import chat, watchdog
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN
from tests.integration.redisproc import RedisServer, private_database


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[tuple[Harness, RedisServer]]:
    server = RedisServer(tmp_path / "redis")  # AOF on: its streams survive the kill, as deployed
    server.start()
    # A database of its own: the session's `kortex beat` sweeps the shared one system-wide and
    # would publish this test's kept events to its own Redis (seen once in a full run).
    with private_database(PG_ADMIN) as url:
        h = Harness(make_settings(tmp_path, url, redis_url=server.url, redis_prefix=f"kxob-{uuid.uuid4().hex[:6]}"))
        try:
            yield h, server
        finally:
            h.close()
            server.stop()


def _result_stored_while_redis_is_down(h: Harness, server: RedisServer, name: str) -> tuple[str, Any, Any]:
    """Step 0 parks on a tool that sleeps 2.5 s; Redis dies meanwhile, so its result is stored
    with its events kept in the outbox. Returns (tenant, the posted turn, the tool's hand-off)."""
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, name, "scripted:slow_tool")  # debug_sleep 2.5 s
    posted = chat.post_message(h.k, tenant, session.id, "go")
    (tool,) = run_step(h.k, tenant, posted.turn.id, 0).tools
    handoffs = []
    runner = threading.Thread(target=lambda: handoffs.append(
        run_tool(h.k, tool.tenant_id, tool.invocation_id, tool.tool, tool.hard_limit)))
    runner.start()
    time.sleep(0.5)
    server.kill()  # the tool is sleeping; its result will find Redis gone
    runner.join(30)
    (handoff,) = handoffs
    return tenant, posted, handoff


def test_a_result_stored_while_redis_is_down_reaches_the_client_when_it_is_back(outage) -> None:
    h, server = outage
    tenant, posted, handoff = _result_stored_while_redis_is_down(h, server, "outbox")
    assert [s.step for s in handoff.steps] == [1]  # stored and the turn moved on all the same
    with h.k.db.connect() as conn:
        assert conn.scalar(select(func.count()).where(stream_outbox.c.turn_id == posted.turn.id)) == 1
    server.start()
    time.sleep(2.1)  # the outbox leaves rows of in-flight transactions alone for 2 s
    assert watchdog.sweep(h.k).republished_events == 1
    with h.k.db.connect() as conn:
        assert conn.scalar(select(func.count()).where(stream_outbox.c.turn_id == posted.turn.id)) == 0
    run_step(h.k, tenant, posted.turn.id, 1)
    events = [(e.type, json.loads(e.data)) for e in h.events(posted.turn.id)]
    assert [t for t, _ in events] == ["turn", "text", "tool_call", "tool_result", "turn", "text", "done"]
    (result,) = [b for t, b in events if t == "tool_result"]
    assert not result["is_error"] and result["content"]["slept_s"] == 2.5
    assert [b["seq"] for _, b in events] == list(range(1, len(events) + 1))


def test_the_next_step_publishes_a_kept_result_before_its_own_events(outage) -> None:
    """Redis is back before the watchdog's sweep and the next step starts at once: its claim
    sees the kept result and publishes it first. Kept under the tool's attempt, it would be
    fenced out by the step's higher attempt, or refused once ``done`` closed the stream."""
    h, server = outage
    tenant, posted, handoff = _result_stored_while_redis_is_down(h, server, "outbox-next")
    server.start()
    run_step(h.k, tenant, posted.turn.id, handoff.steps[0].step)  # no sweep in between
    with h.k.db.connect() as conn:
        assert conn.scalar(select(func.count()).where(stream_outbox.c.turn_id == posted.turn.id)) == 0
    assert watchdog.sweep(h.k).republished_events == 0  # nothing left, nothing sent twice
    events = [(e.type, json.loads(e.data)) for e in h.events(posted.turn.id)]
    assert [t for t, _ in events] == ["turn", "text", "tool_call", "tool_result", "turn", "text", "done"]
    attempts = [b["attempt"] for _, b in events]
    assert attempts == sorted(attempts)  # a client dropping superseded attempts keeps them all
    assert [b["seq"] for _, b in events] == list(range(1, len(events) + 1))
    assert chat.get_turn(h.k, tenant, posted.turn.id).status == "done"
