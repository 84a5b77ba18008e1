"""Proposals: recorded by propose_action, decided once by an operator of the tenant, expired
after 10 minutes, every decision audited, confirmed ones handed to the executor."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from kortex.errors import Conflict, NotFound
from kortex.messages import ToolCall
from kortex.proposals import ExecutionOutcome, NewProposal, ProposalRecord, ProposalService, store
from kortex.storage.schema import decisions
from kortex.timeparse import utcnow
from kortex.tools.spec import ToolContext
from kortex.turns.watchdog import sweep
from tests.conftest import Harness

ARGS = {"action": "rollback-deploy", "product": "checkout", "params": {"version": "v2.14.0"},
        "rationale": "p99 jumped after v2.14.0 [call_1]; token=abc123secret", "blast_radius": "one service",
        "reversible": True}


class CountingExecutor:
    name = "counting"

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[str] = []
        self.fail = fail

    def execute(self, proposal: ProposalRecord) -> ExecutionOutcome:
        self.seen.append(proposal.id)
        if self.fail:
            raise RuntimeError("deploy tool is down")
        return ExecutionOutcome(status="done", detail={"ran": proposal.action})


def audit_rows(h: Harness, tenant: str) -> list[dict[str, Any]]:
    with h.k.db.connect() as conn:
        rows = conn.execute(select(decisions).where(decisions.c.tenant_id == tenant, decisions.c.kind == "proposal")
                            .order_by(decisions.c.created_at)).all()
    return [dict(r._mapping) for r in rows]


def propose(h: Harness, tenant: str, **kw: Any) -> str:
    result = h.call(tenant, "propose_action", {**ARGS, **kw}, turn_id=str(uuid.uuid4()))
    assert not result.is_error, result.content
    return str(result.content["proposal_id"])


def test_propose_action_records_a_pending_proposal_once_per_call(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = str(uuid.uuid4())
    first = harness.call(tenant, "propose_action", ARGS, turn_id=turn, call_id="call_9")
    again = harness.call(tenant, "propose_action", ARGS, turn_id=turn, call_id="call_9")  # a re-delivered task
    assert first.content == again.content
    assert first.content["awaits_confirmation"] is True and first.content["posted_to_chat"] is True
    proposal = harness.k.proposals.get(tenant, first.content["proposal_id"])
    assert (proposal.status, proposal.turn_id, proposal.call_id) == ("pending", turn, "call_9")
    assert proposal.expires_at - proposal.created_at == timedelta(minutes=10)
    assert "abc123secret" not in proposal.rationale  # scrubbed before it is stored or shown
    assert harness.k.policy.decide(harness.k.tools.get("propose_action")) == "allow"  # ships enabled: it only records
    for bad in ({"action": "Rollback Deploy"}, {"rationale": ""}, {"params": {"x": "y" * 5000}}):
        assert harness.call(tenant, "propose_action", {**ARGS, **bad}).error_code == "validation"


def test_confirm_hands_the_proposal_to_the_executor_once(harness: Harness) -> None:
    executor = CountingExecutor()
    harness.k.proposals.executor = executor
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    first = harness.k.proposals.confirm(tenant, pid, by="api_key:abc", note="go")
    assert first.changed and first.proposal.status == "confirmed" and first.proposal.decided_by == "api_key:abc"
    assert first.proposal.execution_status == "done" and first.proposal.execution == {"ran": "rollback-deploy"}
    second = harness.k.proposals.confirm(tenant, pid, by="api_key:def")
    assert not second.changed and second.proposal.decided_by == "api_key:abc"
    assert executor.seen == [pid]
    with pytest.raises(Conflict) as err:
        harness.k.proposals.reject(tenant, pid, by="api_key:def")
    assert err.value.code == "proposal_decided"
    subjects = [r["subject"] for r in audit_rows(harness, tenant)]
    assert subjects == ["confirmed:rollback-deploy", "executed:rollback-deploy"]


def test_the_default_executor_only_records(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    confirmed = harness.k.proposals.confirm(tenant, pid, by="op").proposal
    assert confirmed.execution_status == "recorded" and confirmed.execution["executor"] == "record-only"


def test_a_failing_executor_does_not_undo_the_decision(harness: Harness) -> None:
    harness.k.proposals.executor = CountingExecutor(fail=True)
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    confirmed = harness.k.proposals.confirm(tenant, pid, by="op").proposal
    assert confirmed.status == "confirmed" and confirmed.execution_status == "failed"
    rows = audit_rows(harness, tenant)
    assert [(r["subject"], r["ok"]) for r in rows] == [("confirmed:rollback-deploy", True),
                                                      ("executed:rollback-deploy", False)]


def test_reject_is_final_and_idempotent(harness: Harness) -> None:
    executor = CountingExecutor()
    harness.k.proposals.executor = executor
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    rejected = harness.k.proposals.reject(tenant, pid, by="op", note="not during the sale")
    assert rejected.changed and rejected.proposal.status == "rejected" and rejected.proposal.note == "not during the sale"
    assert not harness.k.proposals.reject(tenant, pid, by="op").changed
    with pytest.raises(Conflict) as err:
        harness.k.proposals.confirm(tenant, pid, by="op")
    assert err.value.code == "proposal_decided" and executor.seen == []
    assert [r["subject"] for r in audit_rows(harness, tenant)] == ["rejected:rollback-deploy"]


def test_proposals_expire_after_ten_minutes(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    old = harness.k.proposals.propose(tenant, NewProposal(**{k: v for k, v in ARGS.items()}), session_id=None,
                                      turn_id=None, call_id=None, now=utcnow() - timedelta(minutes=11))
    fresh = propose(harness, tenant)
    assert [p.id for p in harness.k.proposals.list(tenant, status="pending")] == [fresh]
    with pytest.raises(Conflict) as err:
        harness.k.proposals.confirm(tenant, old.id, by="op")
    assert err.value.code == "proposal_expired"
    assert harness.k.proposals.get(tenant, old.id).status == "expired"
    with pytest.raises(Conflict):
        harness.k.proposals.reject(tenant, old.id, by="op")
    # the sweep expires what nobody looked at, once
    later = harness.k.proposals.propose(tenant, NewProposal(**ARGS), session_id=None, turn_id=None, call_id=None,
                                        now=utcnow() - timedelta(minutes=20))
    assert sweep(harness.k).expired_proposals == 1 and sweep(harness.k).expired_proposals == 0
    assert harness.k.proposals.get(tenant, later.id).status == "expired"
    assert harness.k.proposals.get(tenant, fresh).status == "pending"
    rows = audit_rows(harness, tenant)
    assert [r["subject"] for r in rows] == ["expired:rollback-deploy"] * 2
    assert {r["payload"]["by"] for r in rows} == {"system:expiry"}


def test_another_tenant_cannot_see_or_decide(harness: Harness) -> None:
    tenant, other = harness.tenant("acme"), harness.tenant("other")
    pid = propose(harness, tenant)
    for attempt in (lambda: harness.k.proposals.get(other, pid),
                    lambda: harness.k.proposals.confirm(other, pid, by="intruder"),
                    lambda: harness.k.proposals.reject(other, pid, by="intruder")):
        with pytest.raises(NotFound):
            attempt()
    assert harness.k.proposals.list(other) == []
    assert harness.k.proposals.get(tenant, pid).status == "pending" and audit_rows(harness, other) == []


# ---- executions cut off, slow executors, busy databases, one card per proposal -------------


def _confirm_then_die(h: Harness, tenant: str, pid: str, at: Any) -> None:
    """The confirmation commits, then the process dies before the executor answers."""
    with h.k.db.begin() as conn:
        assert store.decide(conn, tenant, pid, "confirmed", by="op", note=None, now=at) is not None


def test_an_execution_cut_off_by_a_dying_process_is_retried_once(harness: Harness) -> None:
    executor = CountingExecutor()
    harness.k.proposals.executor = executor
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    now = utcnow()
    _confirm_then_die(harness, tenant, pid, now)
    assert harness.k.proposals.get(tenant, pid).execution_status == "pending"
    service = harness.k.proposals
    assert service.recover_executions(now + timedelta(seconds=5)) == 0  # within the grace: it may be running
    later = now + service.recovery_grace + timedelta(seconds=1)
    assert service.recover_executions(later) == 1 and service.recover_executions(later) == 0
    recovered = harness.k.proposals.get(tenant, pid)
    assert (recovered.execution_status, recovered.execution_attempts) == ("done", 2) and executor.seen == [pid]
    executed = [r for r in audit_rows(harness, tenant) if r["subject"].startswith("executed")]
    assert [(r["payload"]["by"], r["payload"]["attempt"]) for r in executed] == [("system:recovery", 2)]


def test_a_second_interruption_is_recorded_as_failed_not_retried(harness: Harness) -> None:
    executor = CountingExecutor()
    harness.k.proposals.executor = executor
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    now = utcnow()
    _confirm_then_die(harness, tenant, pid, now)
    with harness.k.db.begin() as conn:  # the retry started, and its process died too
        assert store.claim_retry(conn, tenant, pid, 1, now) is not None
    report = sweep(harness.k)  # within the grace period
    assert report.recovered_executions == 0
    harness.k.proposals.recovery_grace = timedelta(0)
    assert sweep(harness.k).recovered_executions == 1
    closed = harness.k.proposals.get(tenant, pid)
    assert closed.execution_status == "failed" and closed.execution["error"] == "interrupted" and executor.seen == []


def test_a_hanging_executor_is_bounded(harness: Harness) -> None:
    class Hanging:
        name = "hanging"

        def __init__(self) -> None:
            self.release = threading.Event()

        def execute(self, proposal: ProposalRecord) -> ExecutionOutcome:
            self.release.wait(30)
            return ExecutionOutcome(status="done")

    hanging = Hanging()
    service = ProposalService(harness.k.db, hanging, execute_timeout=0.2)
    tenant = harness.tenant("acme")
    pid = propose(harness, tenant)
    try:
        confirmed = service.confirm(tenant, pid, by="op").proposal
    finally:
        hanging.release.set()
    assert confirmed.status == "confirmed" and confirmed.execution_status == "failed"
    assert confirmed.execution["error"] == "timeout"


def test_a_locked_database_fails_the_proposal_before_the_tool_times_out(harness_factory, tmp_path) -> None:
    h = harness_factory(llm={"tools": {"propose_action": {"timeout": "1s"}}})
    tenant = h.tenant("acme")
    database = h.k.db.engine.url.database
    blocker = sqlite3.connect(database, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the write lock
    try:
        result = h.call(tenant, "propose_action", ARGS, turn_id=str(uuid.uuid4()))
    finally:
        blocker.rollback()
        blocker.close()
    assert result.is_error and result.error_code == "upstream", result.content  # not "timeout"
    assert result.content["code"] == "DATABASE_ERROR"
    time.sleep(0.3)  # nothing is left waiting to store it later
    assert h.k.proposals.list(tenant) == []


def test_the_same_call_run_again_gets_its_proposal_back_without_a_second_card(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = str(uuid.uuid4())
    cards = []
    for _ in range(2):
        ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=turn, call_id="call_7", step=0, now=utcnow(),
                          sources=harness.k.sources, services=dict(harness.k.services))
        result = harness.k.pipeline.run(ToolCall(id="call_7", name="propose_action", arguments=ARGS), ctx)
        assert not result.is_error
        cards.append([e.proposal_id for e in ctx.events])
    assert len(cards[0]) == 1 and cards[1] == []
    assert [p.id for p in harness.k.proposals.list(tenant)] == cards[0]
