"""Proposal rows. Every state change is a compare-and-set on ``status`` in one statement, so
concurrent decisions resolve to exactly one winner."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from kortex.errors import NotFound
from kortex.ids import uuid7
from kortex.storage.records import _Record
from kortex.storage.schema import proposals

EXPIRES_AFTER = timedelta(minutes=10)
STATUSES = ("pending", "confirmed", "rejected", "expired")
_p = proposals.c


@dataclass(frozen=True, slots=True)
class NewProposal:
    action: str
    product: str
    params: dict[str, Any]
    rationale: str
    blast_radius: str | None = None
    reversible: bool | None = None


@dataclass(frozen=True, slots=True)
class ProposalRecord(_Record):
    id: str
    tenant_id: str
    session_id: str | None
    turn_id: str | None
    call_id: str | None
    action: str
    product: str
    params: dict[str, Any]
    rationale: str
    blast_radius: str | None
    reversible: bool | None
    status: str
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    execution_status: str | None
    execution: dict[str, Any] | None
    executed_at: datetime | None
    execution_attempts: int = 0
    execution_started_at: datetime | None = None


def create(conn: Connection, tenant_id: str, new: NewProposal, *, session_id: str | None, turn_id: str | None,
           call_id: str | None, now: datetime, ttl: timedelta = EXPIRES_AFTER) -> ProposalRecord:
    """Insert a pending proposal; the same tool call (turn, call id) always gets the same one."""
    return create_once(conn, tenant_id, new, session_id=session_id, turn_id=turn_id, call_id=call_id, now=now,
                       ttl=ttl)[0]


def create_once(conn: Connection, tenant_id: str, new: NewProposal, *, session_id: str | None,
                turn_id: str | None, call_id: str | None, now: datetime,
                ttl: timedelta = EXPIRES_AFTER) -> tuple[ProposalRecord, bool]:
    """``create``, and whether this call inserted the row (False: an earlier run of the same
    tool call did, and announced it)."""
    proposal_id = uuid7()
    row = {"id": proposal_id, "tenant_id": tenant_id, "session_id": session_id, "turn_id": turn_id, "call_id": call_id,
           "action": new.action, "product": new.product, "params": new.params, "rationale": new.rationale,
           "blast_radius": new.blast_radius, "reversible": new.reversible, "status": "pending", "created_at": now,
           "expires_at": now + ttl}
    if turn_id is None or call_id is None:
        conn.execute(proposals.insert().values(**row))
        return get(conn, tenant_id, proposal_id), True
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    # RETURNING, not rowcount: what a driver reports as the rowcount of INSERT ... ON CONFLICT
    # DO NOTHING is not to be trusted (issue 10: every card was taken for a repeat on PostgreSQL).
    inserted = conn.execute(dialect.insert(proposals).values(**row)
                            .on_conflict_do_nothing(index_elements=["tenant_id", "turn_id", "call_id"])
                            .returning(_p.id)).first() is not None
    found = conn.execute(select(proposals).where(_p.tenant_id == tenant_id, _p.turn_id == turn_id,
                                                 _p.call_id == call_id)).first()
    assert found is not None  # inserted now, or by an earlier run of the same call
    return ProposalRecord.from_row(found), inserted


def for_call(conn: Connection, tenant_id: str, turn_id: str, call_id: str) -> ProposalRecord | None:
    """The proposal a tool call made, if it made one."""
    row = conn.execute(select(proposals).where(_p.tenant_id == tenant_id, _p.turn_id == turn_id,
                                               _p.call_id == call_id)).first()
    return ProposalRecord.from_row(row) if row else None


def get(conn: Connection, tenant_id: str, proposal_id: str) -> ProposalRecord:
    row = conn.execute(select(proposals).where(_p.tenant_id == tenant_id, _p.id == proposal_id)).first()
    if row is None:
        raise NotFound("proposal not found")
    return ProposalRecord.from_row(row)


def list_for_tenant(conn: Connection, tenant_id: str, *, status: str | None = None, session_id: str | None = None,
                    now: datetime, limit: int = 50) -> list[ProposalRecord]:
    where: list[Any] = [_p.tenant_id == tenant_id]
    if status == "pending":
        where += [_p.status == "pending", _p.expires_at > now]
    elif status == "expired":  # includes pending ones nobody has marked yet
        where.append((_p.status == "expired") | ((_p.status == "pending") & (_p.expires_at <= now)))
    elif status is not None:
        where.append(_p.status == status)
    if session_id is not None:
        where.append(_p.session_id == session_id)
    rows = conn.execute(select(proposals).where(*where).order_by(_p.created_at.desc(), _p.id.desc())
                        .limit(max(1, min(limit, 200)))).all()
    return [ProposalRecord.from_row(r) for r in rows]


def decide(conn: Connection, tenant_id: str, proposal_id: str, status: str, *, by: str, note: str | None,
           now: datetime) -> ProposalRecord | None:
    """pending (and not expired) -> ``status``; None when another decision got there first."""
    row = conn.execute(
        update(proposals)
        .where(_p.tenant_id == tenant_id, _p.id == proposal_id, _p.status == "pending", _p.expires_at > now)
        .values(status=status, decided_at=now, decided_by=by, note=note,
                # a confirmation is the first execution attempt, started now
                execution_status="pending" if status == "confirmed" else None,
                execution_attempts=1 if status == "confirmed" else 0,
                execution_started_at=now if status == "confirmed" else None)
        .returning(*proposals.c)
    ).first()
    return ProposalRecord.from_row(row) if row else None


def expire(conn: Connection, tenant_id: str, proposal_id: str, now: datetime) -> ProposalRecord | None:
    """pending and past its expiry -> expired; None if it was decided or already expired."""
    row = conn.execute(
        update(proposals)
        .where(_p.tenant_id == tenant_id, _p.id == proposal_id, _p.status == "pending", _p.expires_at <= now)
        .values(status="expired", decided_at=now, decided_by="system:expiry")
        .returning(*proposals.c)
    ).first()
    return ProposalRecord.from_row(row) if row else None


def due_for_expiry(conn: Connection, now: datetime, limit: int = 500) -> list[tuple[str, str]]:
    """(tenant id, proposal id) of pending proposals past their expiry, across tenants (the sweep)."""
    rows = conn.execute(select(_p.tenant_id, _p.id).where(_p.status == "pending", _p.expires_at <= now)
                        .order_by(_p.expires_at).limit(limit)).all()
    return [(r[0], r[1]) for r in rows]


def record_execution(conn: Connection, tenant_id: str, proposal_id: str, status: str, detail: dict[str, Any],
                     now: datetime) -> bool:
    recorded = conn.execute(
        update(proposals)
        .where(_p.tenant_id == tenant_id, _p.id == proposal_id, _p.execution_status == "pending")
        .values(execution_status=status, execution=detail, executed_at=now)
        .returning(_p.id)
    ).first()
    return recorded is not None


def stuck_executions(conn: Connection, cutoff: datetime, limit: int = 100) -> list[tuple[str, str, int]]:
    """(tenant id, proposal id, attempts) of executions still pending that started before
    ``cutoff``: the process running them died (the executor call itself is bounded)."""
    started = func.coalesce(_p.execution_started_at, _p.decided_at)
    rows = conn.execute(select(_p.tenant_id, _p.id, _p.execution_attempts)
                        .where(_p.execution_status == "pending", started < cutoff)
                        .order_by(started).limit(limit)).all()
    return [(r[0], r[1], int(r[2] or 0)) for r in rows]


def claim_retry(conn: Connection, tenant_id: str, proposal_id: str, attempts: int,
                now: datetime) -> ProposalRecord | None:
    """Start the next execution attempt of a stuck proposal; None if another sweep took it."""
    row = conn.execute(
        update(proposals)
        .where(_p.tenant_id == tenant_id, _p.id == proposal_id, _p.execution_status == "pending",
               _p.execution_attempts == attempts)
        .values(execution_attempts=attempts + 1, execution_started_at=now)
        .returning(*proposals.c)
    ).first()
    return ProposalRecord.from_row(row) if row else None
