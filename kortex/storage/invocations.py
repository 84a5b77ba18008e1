"""A turn's tool calls as rows: claiming one for its tool task, reading it, and which of a
turn's calls answered (what an answer or a document may cite). Storing a call's result lives
with the turn (kortex/storage/turns.py ``complete_invocation``): it counts the turn's step down."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from kortex.messages import ToolCall
from kortex.storage.records import InvocationRecord
from kortex.storage.schema import tool_invocations
from kortex.timeparse import utcnow

_i = tool_invocations.c


_CLAIM_INVOCATION = (
    update(tool_invocations)
    .where(_i.id == bindparam("p_id"), _i.tenant_id == bindparam("p_tenant"), _i.status == "pending")
    .values(status="running", started_at=bindparam("p_now"), attempts=_i.attempts + 1,
            deadline_at=bindparam("p_deadline"))
    .returning(*tool_invocations.c)
)


def claim_invocation(conn: Connection, tenant_id: str, invocation_id: str, *, hard_limit: float) -> InvocationRecord | None:
    """pending -> running for exactly one delivery; None if it already ran or is running."""
    now = utcnow()
    row = conn.execute(_CLAIM_INVOCATION, {"p_id": invocation_id, "p_tenant": tenant_id, "p_now": now,
                                           "p_deadline": now + timedelta(seconds=hard_limit)}).first()
    return InvocationRecord.from_row(row) if row else None


def get_invocation(conn: Connection, tenant_id: str, invocation_id: str, status: str) -> InvocationRecord | None:
    row = conn.execute(select(tool_invocations).where(_i.id == invocation_id, _i.tenant_id == tenant_id,
                                                      _i.status == status)).first()
    return InvocationRecord.from_row(row) if row else None


def succeeded_calls(conn: Connection, tenant_id: str, turn_id: str) -> set[str]:
    """Call ids of the turn whose tool ran and answered without an error: what may be cited."""
    rows = conn.execute(select(_i.call_id).where(_i.turn_id == turn_id, _i.tenant_id == tenant_id,
                                                 _i.status == "done", _i.is_error.is_(False))).scalars()
    return set(rows)


class TurnCalls:
    """The ``calls`` service tools receive (ToolContext.services): which calls of a turn
    succeeded, so a structured-output tool can refuse citations of anything else."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def succeeded(self, tenant_id: str, turn_id: str) -> set[str]:
        with self.db.connect() as conn:
            return succeeded_calls(conn, tenant_id, turn_id)


def tool_call_from_record(inv: InvocationRecord) -> ToolCall:
    return ToolCall(id=inv.call_id, name=inv.name, arguments=inv.arguments, arguments_error=inv.arguments_error)


__all__ = ["TurnCalls", "claim_invocation", "get_invocation", "succeeded_calls", "tool_call_from_record"]
