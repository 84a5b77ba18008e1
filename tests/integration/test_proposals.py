"""Proposal decisions on real PostgreSQL: concurrent decisions resolve to exactly one."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from kortex.errors import Conflict
from kortex.proposals import ExecutionOutcome, NewProposal, ProposalRecord
from kortex.storage.schema import decisions
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL

pytestmark = pytest.mark.integration
NEW = NewProposal(action="rollback-deploy", product="checkout", params={"version": "v2.14.0"},
                  rationale="p99 jumped after v2.14.0", blast_radius="one service", reversible=True)


class CountingExecutor:
    name = "counting"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def execute(self, proposal: ProposalRecord) -> ExecutionOutcome:
        with self.lock:
            self.seen.append(proposal.id)
        return ExecutionOutcome(status="done")


@pytest.fixture
def executor(pg: Harness) -> Iterator[CountingExecutor]:
    counting = CountingExecutor()
    previous, pg.k.proposals.executor = pg.k.proposals.executor, counting
    yield counting
    pg.k.proposals.executor = previous


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    barrier = threading.Barrier(len(calls))

    def run(fn: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return fn()
        except Conflict as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _decision_rows(pg: Harness, tenant: str, proposal_id: str) -> list[str]:
    with pg.k.db.connect() as conn:
        # In the order they were written (a table's heap order is not: rolled-back writes leave room)
        rows = conn.execute(select(decisions.c.subject, decisions.c.payload)
                            .where(decisions.c.tenant_id == tenant, decisions.c.kind == "proposal")
                            .order_by(decisions.c.created_at, decisions.c.id)).all()
    return [r.subject for r in rows if r.payload["proposal_id"] == proposal_id]


def test_concurrent_confirms_make_exactly_one_decision(pg: Harness, executor: CountingExecutor) -> None:
    tenant = pg.tenant("race-confirm")
    proposal = pg.k.proposals.propose(tenant, NEW, session_id=None, turn_id=str(uuid.uuid4()), call_id="c")
    outcomes = _race([lambda i=i: pg.k.proposals.confirm(tenant, proposal.id, by=f"op{i}") for i in range(8)])
    assert [o.changed for o in outcomes].count(True) == 1
    winner = next(o for o in outcomes if o.changed).proposal
    assert all(o.proposal.decided_by == winner.decided_by for o in outcomes)
    assert executor.seen == [proposal.id]
    assert _decision_rows(pg, tenant, proposal.id) == ["confirmed:rollback-deploy", "executed:rollback-deploy"]


def test_confirm_racing_reject_has_one_winner(pg: Harness, executor: CountingExecutor) -> None:
    tenant = pg.tenant("race-mixed")
    for _ in range(5):
        proposal = pg.k.proposals.propose(tenant, NEW, session_id=None, turn_id=str(uuid.uuid4()), call_id="c")
        pid = proposal.id
        calls = [lambda pid=pid: pg.k.proposals.confirm(tenant, pid, by="a"),
                 lambda pid=pid: pg.k.proposals.reject(tenant, pid, by="b")] * 4
        outcomes = _race(calls)
        winners = [o for o in outcomes if not isinstance(o, Conflict) and o.changed]
        assert len(winners) == 1
        final = winners[0].proposal.status
        for o in outcomes:  # the same decision repeats harmlessly; the opposite one is refused
            if isinstance(o, Conflict):
                assert o.code == "proposal_decided"
            else:
                assert o.proposal.status == final
        assert pg.k.proposals.get(tenant, proposal.id).status == final
        rows = _decision_rows(pg, tenant, proposal.id)
        assert [r for r in rows if not r.startswith("executed:")] == [f"{final}:rollback-deploy"]
        assert executor.seen.count(proposal.id) == (1 if final == "confirmed" else 0)


def test_decisions_over_http_on_postgres(pg: Harness, api_url: str) -> None:
    tenant, other = pg.tenant("http-owner"), pg.tenant("http-other")
    key, other_key = pg.api_key(tenant), pg.api_key(other)
    proposal = pg.k.proposals.propose(tenant, NEW, session_id=None, turn_id=str(uuid.uuid4()), call_id="c")
    url = f"{api_url}/v1/proposals/{proposal.id}"
    assert httpx.post(f"{url}/confirm", headers={"Authorization": f"Bearer {other_key}"}).status_code == 404
    first = httpx.post(f"{url}/confirm", headers={"Authorization": f"Bearer {key}"})
    assert first.status_code == 200 and first.json()["status"] == "confirmed"
    again = httpx.post(f"{url}/confirm", headers={"Authorization": f"Bearer {key}"})
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert httpx.post(f"{url}/reject", headers={"Authorization": f"Bearer {key}"}).status_code == 409


def test_a_proposal_write_stuck_behind_a_lock_fails_before_the_tool_times_out(pg: Harness) -> None:
    """Another transaction holds the row this call would insert: PostgreSQL's lock_timeout, set
    below the tool's timeout, ends the wait, and the model hears a database error, not a
    timeout after which the proposal might still be stored."""
    from kortex.messages import ToolCall
    from kortex.proposals import store
    from kortex.timeparse import utcnow
    from kortex.tools.policy import ToolPolicy
    from kortex.tools.spec import ToolContext

    tenant = pg.tenant(f"pg-lock-{uuid.uuid4().hex[:6]}")
    turn = str(uuid.uuid4())
    arguments = {"action": "rollback-deploy", "product": "checkout", "params": {}, "rationale": "test"}
    with pg.k.db.engine.connect() as holder:
        holder.begin()
        store.create(holder, tenant, NEW, session_id=None, turn_id=turn, call_id="call_lock", now=utcnow())
        ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=turn, call_id="call_lock", step=0, now=utcnow(),
                          sources=pg.k.sources, services=dict(pg.k.services))
        pg.k.pipeline.timeouts["propose_action"] = 2.0
        try:
            allow = ToolPolicy.build(["propose_action"], pg.k.tools)
            result = pg.k.pipeline.run(ToolCall(id="call_lock", name="propose_action", arguments=arguments), ctx,
                                       policy=allow)
        finally:
            pg.k.pipeline.timeouts.pop("propose_action")
            holder.rollback()
    assert result.is_error and result.error_code == "upstream" and result.content["code"] == "DATABASE_ERROR"
    assert pg.k.proposals.list(tenant) == []


def test_a_proposal_card_is_published_once_on_postgres(pg_url: str, redis_prefix: str, tmp_path: Path) -> None:
    """propose_action on PostgreSQL: the card reaches the stream with the result, and a second
    run of the same tool call (a redelivery) finds the proposal without announcing it again."""
    pg = Harness(make_settings(tmp_path, pg_url, redis_url=REDIS_URL, redis_prefix=redis_prefix))
    try:
        _card_once(pg)
    finally:
        pg.close()


def _card_once(pg: Harness) -> None:
    from kortex.proposals.store import create_once
    from kortex.timeparse import utcnow

    tenant = pg.tenant("cards")
    turn = pg.ask(tenant, "fix it", model="scripted:propose")
    assert turn.status == "done"
    events = [e for e in pg.events(turn.id)]
    cards = [json.loads(e.data) for e in events if e.type == "proposal"]
    assert len(cards) == 1
    proposal = pg.k.proposals.get(tenant, cards[0]["proposal_id"])
    new = NewProposal(action=proposal.action, product=proposal.product, params=proposal.params,
                      rationale=proposal.rationale, blast_radius=proposal.blast_radius, reversible=proposal.reversible)
    with pg.k.db.begin() as conn:
        again, inserted = create_once(conn, tenant, new, session_id=proposal.session_id, turn_id=proposal.turn_id,
                                      call_id=proposal.call_id, now=utcnow())
    assert (again.id, inserted) == (proposal.id, False)
