"""Proposing, confirming, rejecting and expiring remediations, with one audit row per decision.

    pending --confirm--> confirmed --(executor)--> execution recorded | done | failed
       |----reject----> rejected
       `----10 min----> expired

A decision is a compare-and-set in SQL: of concurrent confirms exactly one changes the row
(and writes the audit row, and reaches the executor); the others see the decision already
made. Repeating the decision that was made is idempotent; the opposite one is a conflict;
any decision on an expired proposal is refused as expired.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kortex.errors import Conflict
from kortex.proposals import store
from kortex.proposals.executor import ActionExecutor, ExecutionOutcome, RecordingExecutor
from kortex.proposals.store import EXPIRES_AFTER, NewProposal, ProposalRecord
from kortex.redaction import scrub, scrub_text
from kortex.storage.audit import AuditEntry, write_entries
from kortex.storage.db import Database
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
                 ttl: timedelta = EXPIRES_AFTER) -> None:
        self.db = db
        self.executor: ActionExecutor = executor or RecordingExecutor()
        self.ttl = ttl

    def propose(self, tenant_id: str, new: NewProposal, *, session_id: str | None, turn_id: str | None,
                call_id: str | None, now: datetime | None = None) -> ProposalRecord:
        new = NewProposal(action=new.action, product=new.product, params=scrub(new.params),
                          rationale=scrub_text(new.rationale), blast_radius=new.blast_radius, reversible=new.reversible)
        with self.db.begin() as conn:
            return store.create(conn, tenant_id, new, session_id=session_id, turn_id=turn_id, call_id=call_id,
                                now=now or utcnow(), ttl=self.ttl)

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

    def _execute(self, proposal: ProposalRecord, now: datetime) -> ProposalRecord:
        """Hand a just-confirmed proposal to the executor, once, and record what came back."""
        try:
            outcome = self.executor.execute(proposal)
        except Exception as exc:  # an executor bug must not undo the operator's decision
            log.exception("executor %s failed on proposal %s", self.executor.name, proposal.id)
            outcome = ExecutionOutcome(status="failed", detail={"executor": self.executor.name,
                                                                "error": exc.__class__.__name__})
        with self.db.begin() as conn:
            if store.record_execution(conn, proposal.tenant_id, proposal.id, outcome.status, scrub(outcome.detail),
                                      now):
                write_entries(conn, [_entry(proposal, "executed", by=self.executor.name,
                                            ok=outcome.status != "failed", execution=outcome.status)])
            return store.get(conn, proposal.tenant_id, proposal.id)
