"""The turn state machine in SQL: every transition is a compare-and-set, so tasks may run twice.

    queued --claim_step--> running --park_for_tools--> waiting_tools
       ^                      |                             |
       +------- complete_invocation (the last one) ---------+
                              |
                              +--finish_turn--> done | failed
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from kortex.errors import Conflict, NotFound
from kortex.ids import uuid7
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, Usage, UserMessage
from kortex.storage.chats import message_row
from kortex.storage.records import InvocationRecord, TurnRecord
from kortex.storage.schema import chat_messages, chat_sessions, tool_invocations, turns
from kortex.timeparse import utcnow

ACTIVE = ("queued", "running", "waiting_tools")


def request_hash(content: str, model: str | None) -> str:
    return hashlib.sha256(json.dumps([content, model]).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewTurn:
    turn: TurnRecord
    created: bool  # False when an Idempotency-Key matched an earlier request


async def get_turn(conn: AsyncConnection, tenant_id: str, turn_id: str) -> TurnRecord:
    row = (
        await conn.execute(select(turns).where(turns.c.id == turn_id, turns.c.tenant_id == tenant_id))
    ).first()
    if row is None:
        raise NotFound("turn not found")
    return TurnRecord.from_row(row)


async def _by_idempotency_key(conn: AsyncConnection, tenant_id: str, key: str) -> TurnRecord | None:
    row = (
        await conn.execute(
            select(turns).where(turns.c.tenant_id == tenant_id, turns.c.idempotency_key == key)
        )
    ).first()
    return TurnRecord.from_row(row) if row else None


async def create_turn(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    session_id: str,
    content: str,
    model: str | None,
    deadline: timedelta,
    idempotency_key: str | None = None,
) -> NewTurn:
    """Store the user message and a queued turn in the caller's transaction."""
    now = utcnow()
    # Taking the session row first serialises concurrent posts to one session (a row lock on
    # PostgreSQL), so the idempotency and one-active-turn checks below cannot race.
    turn_no = await conn.scalar(
        update(chat_sessions)
        .where(chat_sessions.c.id == session_id, chat_sessions.c.tenant_id == tenant_id)
        .values(turn_count=chat_sessions.c.turn_count + 1, updated_at=now)
        .returning(chat_sessions.c.turn_count)
    )
    if turn_no is None:
        raise NotFound("session not found")
    digest = request_hash(content, model)
    if idempotency_key:
        earlier = await _by_idempotency_key(conn, tenant_id, idempotency_key)
        if earlier is not None:
            if earlier.session_id != session_id or (await _hash_of(conn, earlier.id)) != digest:
                raise Conflict(
                    "this Idempotency-Key was used for a different request", code="idempotency_mismatch"
                )
            return NewTurn(earlier, created=False)
    busy = await conn.scalar(
        select(turns.c.id).where(
            turns.c.tenant_id == tenant_id, turns.c.session_id == session_id, turns.c.status.in_(ACTIVE)
        ).limit(1)
    )
    if busy:
        raise Conflict("a turn is already in progress in this session", code="turn_in_progress",
                       details={"turn_id": busy})
    row: dict[str, Any] = {
        "id": uuid7(), "tenant_id": tenant_id, "session_id": session_id, "turn_no": turn_no,
        "status": "queued", "step": 0, "pending_tools": 0, "model": model, "model_used": None,
        "idempotency_key": idempotency_key, "request_hash": digest, "error": None,
        "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "deadline_at": now + deadline,
        "created_at": now, "updated_at": now, "finished_at": None,
    }
    await conn.execute(turns.insert().values(**row))
    await conn.execute(
        chat_messages.insert().values(
            **message_row(tenant_id=tenant_id, session_id=session_id, turn_id=row["id"], turn_no=turn_no,
                          step=-1, ord=0, message=UserMessage(content=content))
        )
    )
    row.pop("idempotency_key")
    row.pop("request_hash")
    return NewTurn(TurnRecord(**row), created=True)


async def _hash_of(conn: AsyncConnection, turn_id: str) -> str | None:
    return await conn.scalar(select(turns.c.request_hash).where(turns.c.id == turn_id))


async def claim_step(conn: AsyncConnection, tenant_id: str, turn_id: str, step: int) -> TurnRecord | None:
    """queued -> running for exactly one delivery of this step; None means someone else has it."""
    row = (
        await conn.execute(
            update(turns)
            .where(turns.c.id == turn_id, turns.c.tenant_id == tenant_id, turns.c.step == step,
                   turns.c.status == "queued")
            .values(status="running", updated_at=utcnow())
            .returning(*turns.c)
        )
    ).first()
    return TurnRecord.from_row(row) if row else None


def _usage_values(usage: Usage, model_used: str | None) -> dict[str, Any]:
    values: dict[str, Any] = {
        "input_tokens": turns.c.input_tokens + usage.input_tokens,
        "output_tokens": turns.c.output_tokens + usage.output_tokens,
        "cost_usd": turns.c.cost_usd + usage.cost_usd,
        "updated_at": utcnow(),
    }
    if model_used:
        values["model_used"] = model_used
    return values


async def park_for_tools(
    conn: AsyncConnection,
    turn: TurnRecord,
    *,
    step: int,
    message: AssistantMessage,
    usage: Usage,
    model_used: str | None,
) -> list[InvocationRecord]:
    """Store the assistant's tool calls and move running -> waiting_tools."""
    now = utcnow()
    moved = await conn.execute(
        update(turns)
        .where(turns.c.id == turn.id, turns.c.tenant_id == turn.tenant_id, turns.c.step == step,
               turns.c.status == "running")
        .values(status="waiting_tools", pending_tools=len(message.tool_calls), **_usage_values(usage, model_used))
    )
    if moved.rowcount != 1:
        raise Conflict("turn moved on while this step ran", code="stale_step")
    await conn.execute(
        chat_messages.insert().values(
            **message_row(tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id,
                          turn_no=turn.turn_no, step=step, ord=0, message=message)
        )
    )
    records = []
    rows = []
    for idx, call in enumerate(message.tool_calls):
        record = InvocationRecord(
            id=uuid7(), tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id,
            turn_no=turn.turn_no, step=step, idx=idx, call_id=call.id, name=call.name,
            arguments=call.arguments, arguments_error=call.arguments_error, status="pending",
            attempts=0, deadline_at=None,
        )
        records.append(record)
        rows.append({
            "id": record.id, "tenant_id": record.tenant_id, "session_id": record.session_id,
            "turn_id": record.turn_id, "turn_no": record.turn_no, "step": step, "idx": idx,
            "call_id": call.id, "name": call.name, "arguments": call.arguments,
            "arguments_error": call.arguments_error, "status": "pending", "is_error": False,
            "error_code": None, "truncated": False, "elapsed_ms": 0, "attempts": 0,
            "created_at": now, "enqueued_at": now, "started_at": None, "deadline_at": None,
            "finished_at": None,
        })
    await conn.execute(tool_invocations.insert(), rows)
    return records


async def finish_turn(
    conn: AsyncConnection,
    turn: TurnRecord,
    *,
    step: int,
    message: AssistantMessage | None,
    usage: Usage,
    model_used: str | None,
    status: str = "done",
    error: dict[str, Any] | None = None,
    from_status: tuple[str, ...] = ("running",),
) -> bool:
    """running -> done | failed, storing the final assistant message. False if already moved on."""
    now = utcnow()
    moved = await conn.execute(
        update(turns)
        .where(turns.c.id == turn.id, turns.c.tenant_id == turn.tenant_id, turns.c.step == step,
               turns.c.status.in_(from_status))
        .values(status=status, error=error, finished_at=now, pending_tools=0,
                **_usage_values(usage, model_used))
    )
    if moved.rowcount != 1:
        return False
    if message is not None and (message.content or message.tool_calls):
        await conn.execute(
            chat_messages.insert().values(
                **message_row(tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id,
                              turn_no=turn.turn_no, step=step, ord=0, message=message)
            )
        )
    await _add_session_usage(conn, turn, usage, now)
    return True


async def _add_session_usage(conn: AsyncConnection, turn: TurnRecord, usage: Usage, now: datetime) -> None:
    # ``turn`` carries the usage of the earlier steps as read when this step was claimed.
    await conn.execute(
        update(chat_sessions)
        .where(chat_sessions.c.id == turn.session_id, chat_sessions.c.tenant_id == turn.tenant_id)
        .values(
            input_tokens=chat_sessions.c.input_tokens + turn.input_tokens + usage.input_tokens,
            output_tokens=chat_sessions.c.output_tokens + turn.output_tokens + usage.output_tokens,
            cost_usd=chat_sessions.c.cost_usd + turn.cost_usd + usage.cost_usd,
            updated_at=now,
        )
    )


async def claim_invocation(
    conn: AsyncConnection, tenant_id: str, invocation_id: str, *, hard_limit: float
) -> InvocationRecord | None:
    """pending -> running for exactly one delivery; None if it already ran or is running."""
    now = utcnow()
    row = (
        await conn.execute(
            update(tool_invocations)
            .where(tool_invocations.c.id == invocation_id, tool_invocations.c.tenant_id == tenant_id,
                   tool_invocations.c.status == "pending")
            .values(status="running", started_at=now, attempts=tool_invocations.c.attempts + 1,
                    deadline_at=now + timedelta(seconds=hard_limit))
            .returning(*tool_invocations.c)
        )
    ).first()
    return InvocationRecord.from_row(row) if row else None


@dataclass(frozen=True, slots=True)
class Completion:
    """What completing one tool call did to its turn."""

    invocation: InvocationRecord
    next_step: int | None  # set when this was the last result of the step


async def complete_invocation(
    conn: AsyncConnection,
    tenant_id: str,
    invocation_id: str,
    result: ToolResult,
    *,
    from_status: tuple[str, ...] = ("running",),
) -> Completion | None:
    """Store a result; the last result of a step re-queues the turn for the next step, once."""
    now = utcnow()
    row = (
        await conn.execute(
            update(tool_invocations)
            .where(tool_invocations.c.id == invocation_id, tool_invocations.c.tenant_id == tenant_id,
                   tool_invocations.c.status.in_(from_status))
            .values(status="done", is_error=result.is_error, error_code=result.error_code,
                    truncated=result.truncated, elapsed_ms=result.elapsed_ms, finished_at=now)
            .returning(*tool_invocations.c)
        )
    ).first()
    if row is None:
        return None
    inv = InvocationRecord.from_row(row)
    await conn.execute(
        chat_messages.insert().values(
            **message_row(tenant_id=tenant_id, session_id=inv.session_id, turn_id=inv.turn_id,
                          turn_no=inv.turn_no, step=inv.step, ord=inv.idx + 1,
                          message=ToolMessage(result=result))
        )
    )
    # One statement decrements the counter and, when it reaches zero, advances the step: the
    # SET clauses all read the old row, and the row lock orders concurrent completions.
    last = turns.c.pending_tools == 1
    advanced = (
        await conn.execute(
            update(turns)
            .where(turns.c.id == inv.turn_id, turns.c.tenant_id == tenant_id, turns.c.step == inv.step,
                   turns.c.status == "waiting_tools")
            .values(
                pending_tools=turns.c.pending_tools - 1,
                status=case((last, "queued"), else_=turns.c.status),
                step=case((last, turns.c.step + 1), else_=turns.c.step),
                updated_at=now,
            )
            .returning(turns.c.pending_tools, turns.c.step)
        )
    ).first()
    next_step = advanced.step if advanced is not None and advanced.pending_tools == 0 else None
    return Completion(inv, next_step)


# ---- watchdog queries (system-wide by design; each update still names the row's tenant) ----


async def expired_turns(conn: AsyncConnection, now: datetime, limit: int = 200) -> list[TurnRecord]:
    rows = (
        await conn.execute(
            select(turns).where(turns.c.status.in_(ACTIVE), turns.c.deadline_at < now).limit(limit)
        )
    ).all()
    return [TurnRecord.from_row(r) for r in rows]


async def fail_turn(conn: AsyncConnection, turn: TurnRecord, error: dict[str, Any]) -> bool:
    """Any active state -> failed (deadline passed, unrecoverable error)."""
    now = utcnow()
    moved = await conn.execute(
        update(turns)
        .where(turns.c.id == turn.id, turns.c.tenant_id == turn.tenant_id, turns.c.status.in_(ACTIVE))
        .values(status="failed", error=error, finished_at=now, updated_at=now)
    )
    if moved.rowcount != 1:
        return False
    await conn.execute(
        update(tool_invocations)
        .where(tool_invocations.c.turn_id == turn.id, tool_invocations.c.tenant_id == turn.tenant_id,
               tool_invocations.c.status.in_(("pending", "running")))
        .values(status="done", is_error=True, error_code="cancelled", finished_at=now)
    )
    await _add_session_usage(conn, turn, Usage(), now)
    return True


async def stale_queued_turns(conn: AsyncConnection, cutoff: datetime, limit: int = 200) -> list[TurnRecord]:
    """Queued turns nobody picked up since ``cutoff`` (a lost hand-off); touched so the next
    sweep waits again before re-enqueueing."""
    rows = (
        await conn.execute(
            update(turns)
            .where(turns.c.id.in_(
                select(turns.c.id).where(turns.c.status == "queued", turns.c.updated_at < cutoff).limit(limit)
            ), turns.c.status == "queued")
            .values(updated_at=utcnow())
            .returning(*turns.c)
        )
    ).all()
    return [TurnRecord.from_row(r) for r in rows]


async def stale_pending_invocations(
    conn: AsyncConnection, cutoff: datetime, limit: int = 500
) -> list[InvocationRecord]:
    rows = (
        await conn.execute(
            update(tool_invocations)
            .where(tool_invocations.c.id.in_(
                select(tool_invocations.c.id)
                .where(tool_invocations.c.status == "pending", tool_invocations.c.enqueued_at < cutoff)
                .limit(limit)
            ), tool_invocations.c.status == "pending")
            .values(enqueued_at=utcnow())
            .returning(*tool_invocations.c)
        )
    ).all()
    return [InvocationRecord.from_row(r) for r in rows]


async def overdue_invocations(conn: AsyncConnection, now: datetime, limit: int = 500) -> list[InvocationRecord]:
    """Running past their hard deadline: the worker died or hung beyond its time limit."""
    rows = (
        await conn.execute(
            select(tool_invocations)
            .where(tool_invocations.c.status == "running", tool_invocations.c.deadline_at < now)
            .limit(limit)
        )
    ).all()
    return [InvocationRecord.from_row(r) for r in rows]


async def step_tool_calls(conn: AsyncConnection, tenant_id: str, turn_id: str) -> list[dict[str, Any]]:
    """All invocations of a turn, for replay and the turn view."""
    rows = (
        await conn.execute(
            select(tool_invocations)
            .where(tool_invocations.c.tenant_id == tenant_id, tool_invocations.c.turn_id == turn_id)
            .order_by(tool_invocations.c.step, tool_invocations.c.idx)
        )
    ).all()
    return [dict(r._mapping) for r in rows]


async def active_turns_for_tenant(conn: AsyncConnection, tenant_id: str) -> int:
    return int(
        await conn.scalar(
            select(func.count()).select_from(turns).where(
                and_(turns.c.tenant_id == tenant_id, turns.c.status.in_(ACTIVE))
            )
        )
        or 0
    )


def tool_call_from_record(inv: InvocationRecord) -> ToolCall:
    return ToolCall(id=inv.call_id, name=inv.name, arguments=inv.arguments, arguments_error=inv.arguments_error)
