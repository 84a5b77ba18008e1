"""The append-only audit trail (``decisions``): one row per LLM call, tool call and decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from kortex.ids import uuid7
from kortex.storage.schema import decisions, tenant_spend
from kortex.timeparse import utcnow


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row. ``payload`` must already be redacted: no secrets, no raw prompts."""

    tenant_id: str
    kind: str
    subject: str
    ok: bool
    payload: dict[str, Any]
    session_id: str | None = None
    turn_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: int = 0
    created_at: datetime = field(default_factory=utcnow)


_INSERT = decisions.insert()
#: a decisions row's columns, in the order ``row`` fills them
COLUMNS = tuple(c.name for c in decisions.c)


def row(e: AuditEntry) -> dict[str, Any]:
    """The decisions row of one entry."""
    return {
        "id": uuid7(), "tenant_id": e.tenant_id, "kind": e.kind, "subject": e.subject[:200],
        "ok": e.ok, "payload": e.payload, "session_id": e.session_id, "turn_id": e.turn_id,
        "input_tokens": e.input_tokens, "output_tokens": e.output_tokens, "cost_usd": e.cost_usd,
        "latency_ms": e.latency_ms, "created_at": e.created_at,
    }


def write_entries(conn: Connection, entries: Sequence[AuditEntry]) -> None:
    """Append audit rows; LLM calls that cost money also add to their tenant's day of spend, in
    the same transaction, so the budget check and the audit trail never disagree."""
    if not entries:
        return
    conn.execute(_INSERT, [row(e) for e in entries])
    add_spends(conn, entries)


def add_spends(conn: Connection, entries: Sequence[AuditEntry]) -> None:
    """What the priced LLM calls among ``entries`` cost, added to their tenants' days (their
    audit rows written in the same transaction, by ``write_entries`` or a state change's own
    statement: kortex/storage/turns.py)."""
    spent: dict[tuple[str, date], tuple[float, int]] = {}
    for e in entries:
        if e.kind == "llm_call" and e.cost_usd > 0:
            key = (e.tenant_id, e.created_at.date())
            cost, calls = spent.get(key, (0.0, 0))
            spent[key] = (cost + e.cost_usd, calls + 1)
    for (tenant_id, day), (cost, calls) in spent.items():
        add_spend(conn, tenant_id, day, cost, calls)


def add_spend(conn: Connection, tenant_id: str, day: date, cost: float, calls: int) -> None:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(tenant_spend).values(tenant_id=tenant_id, day=day, cost_usd=cost, llm_calls=calls)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=["tenant_id", "day"],
        set_={"cost_usd": tenant_spend.c.cost_usd + stmt.excluded.cost_usd,
              "llm_calls": tenant_spend.c.llm_calls + stmt.excluded.llm_calls},
    ))


def list_for_turn(conn: Connection, tenant_id: str, turn_id: str) -> list[dict[str, Any]]:
    rows = (
        conn.execute(
            select(decisions)
            .where(decisions.c.tenant_id == tenant_id, decisions.c.turn_id == turn_id)
            .order_by(decisions.c.created_at, decisions.c.id)
        )
    ).all()
    return [dict(r._mapping) for r in rows]


def recent_llm_calls(conn: Connection, tenant_id: str, since: datetime, *, limit: int = 2000) -> list[Any]:
    """The tenant's successful LLM calls since ``since``, newest first: (subject, latency_ms,
    output_tokens, payload), what the router's latency figures are measured from."""
    return list(conn.execute(
        select(decisions.c.subject, decisions.c.latency_ms, decisions.c.output_tokens, decisions.c.payload)
        .where(decisions.c.tenant_id == tenant_id, decisions.c.kind == "llm_call", decisions.c.ok.is_(True),
               decisions.c.created_at >= since)
        .order_by(decisions.c.created_at.desc()).limit(limit)
    ).all())


def count_for_turn(conn: Connection, tenant_id: str, turn_id: str, kind: str, subject: str | None = None) -> int:
    where = [decisions.c.tenant_id == tenant_id, decisions.c.turn_id == turn_id, decisions.c.kind == kind]
    if subject is not None:
        where.append(decisions.c.subject == subject)
    return int(conn.execute(select(func.count()).where(*where)).scalar() or 0)


def models_by_step(conn: Connection, tenant_id: str, turn_id: str) -> list[tuple[int, str, bool]]:
    """(step, provider:model, routed) of each step's answering LLM call, in step order."""
    rows = conn.execute(select(decisions.c.subject, decisions.c.payload, decisions.c.kind)
                        .where(decisions.c.tenant_id == tenant_id, decisions.c.turn_id == turn_id,
                               decisions.c.kind.in_(("llm_call", "route")))
                        .order_by(decisions.c.created_at)).all()
    routed = {int(r.payload.get("step", -1)) for r in rows if r.kind == "route"}
    answered: dict[int, str] = {}
    for r in rows:
        if r.kind == "llm_call" and r.payload.get("stop_reason") not in (None, "error"):
            answered[int(r.payload.get("step", -1))] = r.subject
    return [(step, model, step in routed) for step, model in sorted(answered.items())]
