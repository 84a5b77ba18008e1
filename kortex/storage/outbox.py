"""The stream outbox in SQL: structural events kept until Redis takes them (see kortex/turns/outbox.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from kortex.storage.schema import stream_outbox
from kortex.timeparse import utcnow

_o = stream_outbox.c


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    tenant_id: str
    turn_id: str
    attempt: int
    final: bool
    events: list[dict[str, Any]]


def keep(conn: Connection, *, tenant_id: str, turn_id: str, attempt: int, final: bool,
         events: list[dict[str, Any]]) -> None:
    conn.execute(stream_outbox.insert().values(tenant_id=tenant_id, turn_id=turn_id, attempt=attempt, final=final,
                                               events=events, created_at=utcnow()))


def due(conn: Connection, before: datetime, limit: int = 500) -> list[OutboxRow]:
    """Rows kept before ``before``, oldest first (system-wide: the watchdog publishes them),
    locked for the caller's transaction; rows another transaction holds are skipped."""
    rows = conn.execute(select(stream_outbox).where(_o.created_at < before).order_by(_o.id).limit(limit)
                        .with_for_update(skip_locked=True)).all()
    return [OutboxRow(r.id, r.tenant_id, r.turn_id, r.attempt, r.final, r.events) for r in rows]


def take_turn(conn: Connection, tenant_id: str, turn_id: str) -> list[OutboxRow]:
    """Remove and return the rows of one turn, oldest first (its next step publishes them);
    a rollback keeps them."""
    rows = conn.execute(delete(stream_outbox).where(_o.turn_id == turn_id, _o.tenant_id == tenant_id)
                        .returning(*stream_outbox.c)).all()
    return sorted((OutboxRow(r.id, r.tenant_id, r.turn_id, r.attempt, r.final, r.events) for r in rows),
                  key=lambda r: r.id)


def forget(conn: Connection, ids: list[int]) -> None:
    if ids:
        conn.execute(delete(stream_outbox).where(_o.id.in_(ids)))
