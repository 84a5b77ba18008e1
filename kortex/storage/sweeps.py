"""The watchdog's sweep queries over turns and tool calls: system-wide by design (one leader
sweeps for every tenant), while each update still names the row's tenant. The transitions they
find work for live in kortex/storage/turns.py."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from kortex.storage.records import ACTIVE, InvocationRecord, TurnRecord
from kortex.storage.schema import tool_invocations, turns
from kortex.timeparse import utcnow

_t = turns.c
_i = tool_invocations.c


def expired_turns(conn: Connection, now: datetime, limit: int = 200) -> list[TurnRecord]:
    rows = conn.execute(select(turns).where(_t.status.in_(ACTIVE), _t.deadline_at < now).limit(limit)).all()
    return [TurnRecord.from_row(r) for r in rows]


def lapsed_steps(conn: Connection, now: datetime, limit: int = 200) -> list[TurnRecord]:
    """running -> queued for steps whose lease lapsed: their worker died mid-step. The caller
    hands each to the queue; the old attempt's late writes are refused, as they name a step
    that is no longer running under it."""
    rows = conn.execute(
        update(turns)
        .where(_t.id.in_(select(_t.id).where(_t.status == "running", _t.lease_until < now).limit(limit)),
               _t.status == "running", _t.lease_until < now)
        .values(status="queued", lease_until=None, updated_at=now)
        .returning(*turns.c)
    ).all()
    return [TurnRecord.from_row(r) for r in rows]


def stale_queued_turns(conn: Connection, cutoff: datetime, limit: int = 200) -> list[TurnRecord]:
    """Queued turns nobody picked up since ``cutoff`` (a lost hand-off); touched so the next
    sweep waits again before re-enqueueing."""
    rows = conn.execute(
        update(turns)
        .where(_t.id.in_(select(_t.id).where(_t.status == "queued", _t.updated_at < cutoff).limit(limit)),
               _t.status == "queued")
        .values(updated_at=utcnow())
        .returning(*turns.c)
    ).all()
    return [TurnRecord.from_row(r) for r in rows]


def stale_pending_invocations(conn: Connection, cutoff: datetime, limit: int = 500) -> list[InvocationRecord]:
    rows = conn.execute(
        update(tool_invocations)
        .where(_i.id.in_(select(_i.id).where(_i.status == "pending", _i.enqueued_at < cutoff).limit(limit)),
               _i.status == "pending")
        .values(enqueued_at=utcnow())
        .returning(*tool_invocations.c)
    ).all()
    return [InvocationRecord.from_row(r) for r in rows]


def overdue_invocations(conn: Connection, now: datetime, limit: int = 500) -> list[InvocationRecord]:
    """Running past their hard deadline: the worker died or hung beyond its time limit."""
    rows = conn.execute(
        select(tool_invocations).where(_i.status == "running", _i.deadline_at < now).limit(limit)
    ).all()
    return [InvocationRecord.from_row(r) for r in rows]


def live_chat_turns(conn: Connection) -> dict[str, dict[str, datetime]]:
    """Every chat turn not yet ended, by tenant: turn id -> when it was created (what the
    admission slots are reconciled with, kortex/turns/admission.py)."""
    rows = conn.execute(select(_t.tenant_id, _t.id, _t.created_at)
                        .where(_t.status.in_(ACTIVE), _t.profile == "chat")).all()
    live: dict[str, dict[str, datetime]] = {}
    for row in rows:
        live.setdefault(row.tenant_id, {})[row.id] = row.created_at
    return live
