"""Proposing, confirming, rejecting and expiring remediations, with one audit row per decision.

    pending --confirm--> confirmed --(executor)--> execution recorded | done | failed
       |----reject----> rejected
       `----10 min----> expired

A decision is a compare-and-set in SQL: of concurrent confirms exactly one changes the row
(and writes the audit row, and reaches the executor); the others see the decision already
made. Repeating the decision that was made is idempotent; the opposite one is a conflict;
any decision on an expired proposal is refused as expired.

The executor call is bounded (``execute_timeout``). If the process dies between the committed
confirmation and the recorded outcome, the execution stays ``pending``: the watchdog's
``recover_executions`` retries it once after a grace period, and records a second
interruption as ``failed``. Executors should therefore treat the proposal id as an
idempotency key.

Writing a proposal is bounded too (``write_timeout``): below the tool's own timeout, so a
locked database fails the call instead of storing a proposal after the model was told
"timeout".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kortex.errors import Conflict
from kortex.proposals import store
from kortex.proposals.executor import ActionExecutor, ExecutionOutcome, RecordingExecutor
from kortex.proposals.store import EXPIRES_AFTER, NewProposal, ProposalRecord
from kortex.redaction import scrub, scrub_text
from kortex.storage.audit import AuditEntry, write_entries
from kortex.storage.db import Database, bounded_writes
from kortex.timeparse import isoformat, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DecisionOutcome:
    proposal: ProposalRecord
    changed: bool  # False: the same decision had already been made (an idempotent repeat)


def _entry(p: ProposalRecord, decision: str, *, by: str, ok: bool = True, **extra: Any) -> AuditEntry:
    return AuditEntry(
        tenant_id=p.tenant_id, kind="proposal", subject=f"{decision}:{p.action}"[:200], ok=ok,
        session_id=p.session_id, turn_id=p.turn_id,
        payload=scrub({"proposal_id": p.id, "decision": decision, "action": p.action, "product": p.product,
                       "params": p.params, "by": by, "call_id": p.call_id, **extra}),
    )


class ProposalService:
    def __init__(self, db: Database, executor: ActionExecutor | None = None,
                 ttl: timedelta = EXPIRES_AFTER, *, execute_timeout: float = 30.0,
                 recovery_grace: float | None = None) -> None:
        self.db = db
        self.executor: ActionExecutor = executor or RecordingExecutor()
        self.ttl = ttl
        self.execute_timeout = execute_timeout
        # Past this, a pending execution cannot still be running: its executor call timed out.
        self.recovery_grace = timedelta(seconds=recovery_grace if recovery_grace is not None
                                        else execute_timeout + 60)

    def propose(self, tenant_id: str, new: NewProposal, *, session_id: str | None, turn_id: str | None,
                call_id: str | None, now: datetime | None = None) -> ProposalRecord:
        return self.propose_once(tenant_id, new, session_id=session_id, turn_id=turn_id, call_id=call_id,
                                 now=now)[0]

    def propose_once(self, tenant_id: str, new: NewProposal, *, session_id: str | None, turn_id: str | None,
                     call_id: str | None, now: datetime | None = None,
                     write_timeout: float | None = None) -> tuple[ProposalRecord, bool]:
        """Store a proposal once per tool call; also says whether this call created it (only
        the creator announces it). ``write_timeout`` bounds waiting for the database's locks."""
        new = NewProposal(action=new.action, product=new.product, params=scrub(new.params),
                          rationale=scrub_text(new.rationale), blast_radius=new.blast_radius, reversible=new.reversible)
        with self.db.begin() as conn, bounded_writes(conn, write_timeout):
            return store.create_once(conn, tenant_id, new, session_id=session_id, turn_id=turn_id,
                                     call_id=call_id, now=now or utcnow(), ttl=self.ttl)

    def for_call(self, tenant_id: str, turn_id: str, call_id: str) -> ProposalRecord | None:
        with self.db.connect() as conn:
            return store.for_call(conn, tenant_id, turn_id, call_id)

    def get(self, tenant_id: str, proposal_id: str, *, now: datetime | None = None) -> ProposalRecord:
        with self.db.connect() as conn:
            proposal = store.get(conn, tenant_id, proposal_id)
        if proposal.status == "pending" and proposal.expires_at <= (now or utcnow()):
            return self._expire(proposal, now or utcnow()) or self.get(tenant_id, proposal_id, now=now)
        return proposal

    def list(self, tenant_id: str, *, status: str | None = None, session_id: str | None = None,
             limit: int = 50, now: datetime | None = None) -> list[ProposalRecord]:
        with self.db.connect() as conn:
            return store.list_for_tenant(conn, tenant_id, status=status, session_id=session_id,
                                         now=now or utcnow(), limit=limit)

    def confirm(self, tenant_id: str, proposal_id: str, *, by: str, note: str | None = None,
                now: datetime | None = None) -> DecisionOutcome:
        return self._decide(tenant_id, proposal_id, "confirmed", by=by, note=note, now=now or utcnow())

    def reject(self, tenant_id: str, proposal_id: str, *, by: str, note: str | None = None,
               now: datetime | None = None) -> DecisionOutcome:
        return self._decide(tenant_id, proposal_id, "rejected", by=by, note=note, now=now or utcnow())

    def _decide(self, tenant_id: str, proposal_id: str, status: str, *, by: str, note: str | None,
                now: datetime) -> DecisionOutcome:
        note = scrub_text(note) if note else None
        with self.db.begin() as conn:
            won = store.decide(conn, tenant_id, proposal_id, status, by=by, note=note, now=now)
            if won is not None:
                write_entries(conn, [_entry(won, status, by=by, note=note)])
        if won is not None:
            if status == "confirmed":
                won = self._execute(won, now)
            return DecisionOutcome(won, changed=True)
        with self.db.connect() as conn:
            current = store.get(conn, tenant_id, proposal_id)  # NotFound: not this tenant's
        if current.status == status:
            return DecisionOutcome(current, changed=False)
        if current.status == "pending" and current.expires_at <= now:
            self._expire(current, now)
        if current.status in ("pending", "expired"):
            raise Conflict(f"proposal expired at {isoformat(current.expires_at)}; ask the model to propose again",
                           code="proposal_expired")
        raise Conflict(f"proposal was already {current.status} by {current.decided_by or 'someone'}",
                       code="proposal_decided", details={"status": current.status})

    def _expire(self, proposal: ProposalRecord, now: datetime) -> ProposalRecord | None:
        with self.db.begin() as conn:
            expired = store.expire(conn, proposal.tenant_id, proposal.id, now)
            if expired is not None:
                write_entries(conn, [_entry(expired, "expired", by="system:expiry",
                                            expires_at=isoformat(expired.expires_at))])
        return expired

    def expire_due(self, now: datetime | None = None, limit: int = 500) -> int:
        """Expire every pending proposal past its time (the watchdog's sweep); returns how many."""
        now = now or utcnow()
        with self.db.connect() as conn:
            due = store.due_for_expiry(conn, now, limit)
        count = 0
        for tenant_id, proposal_id in due:
            with self.db.connect() as conn:
                proposal = store.get(conn, tenant_id, proposal_id)
            count += self._expire(proposal, now) is not None
        return count

    def _execute(self, proposal: ProposalRecord, now: datetime, *, by: str | None = None) -> ProposalRecord:
        """Hand a confirmed proposal to the executor and record what came back."""
        outcome = self._call_executor(proposal)
        return self._record(proposal, outcome, now, by=by or self.executor.name)

    def _call_executor(self, proposal: ProposalRecord) -> ExecutionOutcome:
        """The executor's answer within ``execute_timeout``. A thread cannot be stopped: one
        that overruns is abandoned, and its late answer cannot overwrite the recorded one."""
        box: list[ExecutionOutcome] = []

        def work() -> None:
            try:
                box.append(self.executor.execute(proposal))
            except Exception as exc:  # an executor bug must not undo the operator's decision
                log.exception("executor %s failed on proposal %s", self.executor.name, proposal.id)
                box.append(ExecutionOutcome(status="failed", detail={"executor": self.executor.name,
                                                                     "error": exc.__class__.__name__}))

        thread = threading.Thread(target=work, name=f"kortex-executor-{proposal.id[:8]}", daemon=True)
        thread.start()
        thread.join(self.execute_timeout)
        if box:
            return box[0]
        log.error("executor %s did not answer within %.0fs on proposal %s", self.executor.name,
                  self.execute_timeout, proposal.id)
        return ExecutionOutcome(status="failed", detail={
            "executor": self.executor.name, "error": "timeout",
            "note": f"the executor did not answer within {self.execute_timeout:g}s; check the action's real state"})

    def _record(self, proposal: ProposalRecord, outcome: ExecutionOutcome, now: datetime, *,
                by: str) -> ProposalRecord:
        with self.db.begin() as conn:
            if store.record_execution(conn, proposal.tenant_id, proposal.id, outcome.status, scrub(outcome.detail),
                                      now):
                write_entries(conn, [_entry(proposal, "executed", by=by, ok=outcome.status != "failed",
                                            execution=outcome.status, attempt=proposal.execution_attempts)])
            return store.get(conn, proposal.tenant_id, proposal.id)

    def recover_executions(self, now: datetime | None = None, limit: int = 100) -> int:
        """The watchdog's sweep: executions left ``pending`` past the grace period were cut off
        by a dying process. The first is retried once; a second interruption is recorded as
        failed. Returns how many were retried or closed."""
        now = now or utcnow()
        with self.db.connect() as conn:
            stuck = store.stuck_executions(conn, now - self.recovery_grace, limit)
        count = 0
        for tenant_id, proposal_id, attempts in stuck:
            if attempts >= 2:
                with self.db.connect() as conn:
                    proposal = store.get(conn, tenant_id, proposal_id)
                self._record(proposal, ExecutionOutcome(status="failed", detail={
                    "executor": self.executor.name, "error": "interrupted",
                    "note": "the execution was interrupted twice; it was not retried again"}), now,
                    by="system:recovery")
                count += 1
                continue
            with self.db.begin() as conn:
                claimed = store.claim_retry(conn, tenant_id, proposal_id, attempts, now)
            if claimed is None:  # another sweep got there first
                continue
            log.warning("retrying the execution of proposal %s: the first attempt was interrupted", proposal_id)
            self._execute(claimed, now, by="system:recovery")
            count += 1
        return count
