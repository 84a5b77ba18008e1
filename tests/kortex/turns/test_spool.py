"""A tool result the database refused waits in the spool; storing it later announces it once."""

from __future__ import annotations

import pytest

from kortex.messages import ToolResult
from kortex.storage import invocations
from kortex.turns import chat, spool
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool
from tests.conftest import Harness


@pytest.mark.parametrize("published", [False, True])
def test_a_spooled_result_is_stored_and_published_exactly_once(harness: Harness, published: bool) -> None:
    h = harness
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "spool", "scripted:slow_tool")
    posted = chat.post_message(h.k, tenant, session.id, "go")
    (tool,) = run_step(h.k, tenant, posted.turn.id, 0).tools
    with h.k.db.begin() as conn:  # the first run claimed it, computed it, and could not store it
        inv = invocations.claim_invocation(conn, tenant, tool.invocation_id, hard_limit=60)
    assert inv is not None
    result = ToolResult(call_id=inv.call_id, name=inv.name, content={"slept_s": 0.0})
    # published: its events went out inside the transaction whose commit failed
    assert spool.put(h.k, inv.id, result, [], [], published=published)
    handoff = run_tool(h.k, tenant, tool.invocation_id, tool.tool, tool.hard_limit)  # the task's retry
    assert [s.step for s in handoff.steps] == [1]  # stored: the turn moves on
    assert spool.get(h.k, inv.id) is None
    results = [e for e in h.events(posted.turn.id) if e.type == "tool_result"]
    assert len(results) == (0 if published else 1)  # the client hears of it once in all
