"""Chat sessions and their messages, always scoped by tenant."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, bindparam, delete, func, literal, select, tuple_, update
from sqlalchemy.engine import Connection

from kortex.errors import Conflict, NotFound
from kortex.ids import uuid7
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.storage.records import ACTIVE, MessageRecord, SessionRecord
from kortex.storage.schema import chat_messages, chat_sessions, stream_outbox, turns
from kortex.timeparse import utcnow

INSERT_MESSAGE = chat_messages.insert()


def _row(columns: Sequence[ColumnElement[Any]], values: Iterable[Any]) -> ColumnElement[Any]:
    """``values`` as a row to compare with the row of ``columns`` (keyset paging), each bound with
    its column's type. Bound by their Python types, an id is a varchar that PostgreSQL will not
    compare with a uuid column, and a datetime skips the column's conversion to UTC."""
    return tuple_(*(literal(v, type_=c.type) for c, v in zip(columns, values, strict=True)))


def create_session(
    conn: Connection, tenant_id: str, name: str, model: str | None = None, *,
    idempotency_key: str | None = None, request_hash: str | None = None,
) -> SessionRecord:
    """A new session; with ``idempotency_key``, a second one under the tenant's key fails the
    insert (the unique index: the caller's transaction raises Conflict ``integrity``)."""
    now = utcnow()
    session = SessionRecord(
        id=uuid7(), tenant_id=tenant_id, name=name, model=model, turn_count=0, created_at=now, updated_at=now,
    )
    conn.execute(chat_sessions.insert().values(**asdict(session), idempotency_key=idempotency_key,
                                               request_hash=request_hash))
    return session


def session_by_key(conn: Connection, tenant_id: str, idempotency_key: str) -> tuple[SessionRecord, str | None] | None:
    """The session the tenant's Idempotency-Key made, with the hash of the request that made it."""
    row = conn.execute(select(chat_sessions).where(chat_sessions.c.tenant_id == tenant_id,
                                                   chat_sessions.c.idempotency_key == idempotency_key)).first()
    return (SessionRecord.from_row(row), row.request_hash) if row else None


def get_session(conn: Connection, tenant_id: str, session_id: str) -> SessionRecord:
    row = (
        conn.execute(
            select(chat_sessions).where(
                chat_sessions.c.id == session_id, chat_sessions.c.tenant_id == tenant_id
            )
        )
    ).first()
    if row is None:
        raise NotFound("session not found")
    return SessionRecord.from_row(row)


def list_sessions(conn: Connection, tenant_id: str, *, before: tuple[datetime, str] | None = None,
                  limit: int = 50) -> list[SessionRecord]:
    """The tenant's sessions, newest first; ``before`` is the (created_at, id) of the last one seen."""
    order = (chat_sessions.c.created_at, chat_sessions.c.id)
    query = select(chat_sessions).where(chat_sessions.c.tenant_id == tenant_id)
    if before is not None:
        query = query.where(tuple_(*order) < _row(order, before))
    rows = conn.execute(query.order_by(*(c.desc() for c in order)).limit(limit)).all()
    return [SessionRecord.from_row(r) for r in rows]


def delete_session(conn: Connection, tenant_id: str, session_id: str) -> list[str]:
    """Delete a session with its turns, messages and tool calls (the foreign keys cascade) and
    any events kept for them; audit rows and proposals stay. Returns the deleted turns' ids
    (their Redis streams are the caller's to drop). A session with a turn still active is a
    Conflict."""
    # Ordered against a post to the session by a write to its row, taken first: a post writes
    # that row too (the session's next turn number), so whichever comes second waits for the
    # other's commit and then sees its turn, or finds the session gone. A SELECT ... FOR UPDATE
    # would do on PostgreSQL, but locks nothing on SQLite, whose driver begins the transaction
    # only at the first write: the check read the turns before a post's commit, and the delete
    # then took the turn the post had just answered 202 for.
    locked = conn.execute(update(chat_sessions).where(
        chat_sessions.c.id == session_id, chat_sessions.c.tenant_id == tenant_id)
        .values(turn_count=chat_sessions.c.turn_count).returning(chat_sessions.c.id)).first()
    if locked is None:
        raise NotFound("session not found")
    rows = conn.execute(select(turns.c.id, turns.c.status).where(
        turns.c.tenant_id == tenant_id, turns.c.session_id == session_id)).all()
    active = [r.id for r in rows if r.status in ACTIVE]
    if active:
        raise Conflict("a turn is still running in this session; cancel it first "
                       f"(POST /v1/turns/{active[0]}/cancel)", code="turn_in_progress", details={"turn_id": active[0]})
    ids = [r.id for r in rows]
    if ids:
        conn.execute(delete(stream_outbox).where(stream_outbox.c.tenant_id == tenant_id,
                                                 stream_outbox.c.turn_id.in_(ids)))
    conn.execute(delete(chat_sessions).where(chat_sessions.c.id == session_id, chat_sessions.c.tenant_id == tenant_id))
    return ids


def list_messages(
    conn: Connection,
    tenant_id: str,
    session_id: str,
    *,
    after: tuple[int, int, int] | None = None,
    limit: int = 100,
) -> list[MessageRecord]:
    """Messages in conversation order; ``after`` is the (turn_no, step, ord) of the last one seen."""
    order = (chat_messages.c.turn_no, chat_messages.c.step, chat_messages.c.ord)
    query = select(chat_messages).where(
        chat_messages.c.tenant_id == tenant_id, chat_messages.c.session_id == session_id
    )
    if after is not None:
        query = query.where(tuple_(*order) > _row(order, after))
    rows = (conn.execute(query.order_by(*order).limit(limit))).all()
    return [MessageRecord.from_row(r) for r in rows]


#: what the model sees of a message; turns.py's claim reads them too
HISTORY_COLUMNS = ("role", "content", "tool_calls", "tool_call_id", "tool_name", "result", "is_error", "error_code",
                   "truncated")
#: newest first: the latest messages are the ones a limit keeps
HISTORY_ORDER = (chat_messages.c.turn_no.desc(), chat_messages.c.step.desc(), chat_messages.c.ord.desc())

_HISTORY = (
    select(*(chat_messages.c[name] for name in HISTORY_COLUMNS))
    .where(chat_messages.c.tenant_id == bindparam("p_tenant"), chat_messages.c.session_id == bindparam("p_session"))
    .order_by(*HISTORY_ORDER)
    .limit(bindparam("p_limit"))
)


def load_history(conn: Connection, tenant_id: str, session_id: str, *, limit: int) -> list[Message]:
    """The conversation as the model sees it: the latest ``limit`` messages, oldest first."""
    return history_of(conn.execute(_HISTORY, {"p_tenant": tenant_id, "p_session": session_id,
                                              "p_limit": limit}).all())


def history_of(newest_first: Sequence[Any]) -> list[Message]:
    """Messages from rows with the ``HISTORY_COLUMNS``, newest first, as the model sees them:
    oldest first. The window never starts with a tool result whose call fell outside it
    (providers reject orphaned results), so it is widened back to the preceding user message."""
    rows = list(reversed(newest_first))
    while rows and rows[0].role != "user":
        rows.pop(0)
    return [_to_message(r) for r in rows]


def _to_message(row: Any) -> Message:
    if row.role == "user":
        return UserMessage(content=row.content)
    if row.role == "assistant":
        calls = tuple(ToolCall.model_validate(c) for c in (row.tool_calls or ()))
        return AssistantMessage(content=row.content, tool_calls=calls)
    return ToolMessage(
        result=ToolResult(
            call_id=row.tool_call_id or "", name=row.tool_name or "", content=row.result,
            is_error=row.is_error, error_code=row.error_code, truncated=row.truncated,
        )
    )


def message_row(
    *,
    tenant_id: str,
    session_id: str,
    turn_id: str,
    turn_no: int,
    step: int,
    ord: int,
    message: Message,
    grounding: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The insert values for one message at its place in the conversation."""
    row: dict[str, Any] = {
        "id": uuid7(), "tenant_id": tenant_id, "session_id": session_id, "turn_id": turn_id,
        "turn_no": turn_no, "step": step, "ord": ord, "role": message.role, "content": "",
        "tool_calls": None, "tool_call_id": None, "tool_name": None, "result": None,
        "is_error": False, "error_code": None, "truncated": False, "created_at": utcnow(),
        "grounding": grounding,
    }
    if isinstance(message, UserMessage):
        row["content"] = message.content
    elif isinstance(message, AssistantMessage):
        row["content"] = message.content
        row["tool_calls"] = [c.model_dump(exclude_none=True) for c in message.tool_calls] or None
    else:
        result = message.result
        row.update(
            tool_call_id=result.call_id, tool_name=result.name, result=result.content,
            is_error=result.is_error, error_code=result.error_code, truncated=result.truncated,
        )
    return row


def count_messages(conn: Connection, tenant_id: str, session_id: str) -> int:
    return int(conn.execute(select(func.count()).where(chat_messages.c.tenant_id == tenant_id,
                                                       chat_messages.c.session_id == session_id)).scalar() or 0)


def copy_conversation(conn: Connection, tenant_id: str, source_id: str, target_id: str,
                      upto: tuple[int, int, int], *, cut_error: dict[str, Any]) -> int:
    """Copy the source session's turns and messages up to and including position ``upto``
    (turn_no, step, ord) into the (new, empty) target session, with new ids. A turn copied only
    in part ends ``cancelled`` with ``cut_error``; whole turns keep their status and usage.
    Returns how many turns were copied."""
    source_turns = conn.execute(select(turns).where(turns.c.tenant_id == tenant_id, turns.c.session_id == source_id,
                                                    turns.c.turn_no <= upto[0]).order_by(turns.c.turn_no)).all()
    order = (chat_messages.c.turn_no, chat_messages.c.step, chat_messages.c.ord)
    messages = conn.execute(select(chat_messages).where(
        chat_messages.c.tenant_id == tenant_id, chat_messages.c.session_id == source_id,
        tuple_(*order) <= _row(order, upto)).order_by(*order)).all()
    copied = {m.turn_no for m in messages}
    whole = {t.turn_no for t in source_turns if t.turn_no < upto[0] or _ends_at(messages, t.turn_no)}
    ids: dict[str, str] = {}
    now = utcnow()
    turn_rows, message_rows = [], []
    for t in source_turns:
        if t.turn_no not in copied:
            continue
        row = dict(t._mapping)
        ids[row["id"]] = row["id"] = uuid7()
        row.update(session_id=target_id, idempotency_key=None, done_event_id=None, lease_until=None,
                   created_at=now, updated_at=now)
        if t.turn_no not in whole or row["status"] in ACTIVE:
            row.update(status="cancelled", error=cut_error, finished_at=now)
        turn_rows.append(row)
    for m in messages:
        row = dict(m._mapping)
        row.update(id=uuid7(), session_id=target_id, turn_id=ids[row["turn_id"]])
        message_rows.append(row)
    if turn_rows:  # a batch each, not a statement a row
        conn.execute(turns.insert(), turn_rows)
    if message_rows:
        conn.execute(chat_messages.insert(), message_rows)
    conn.execute(chat_sessions.update().where(chat_sessions.c.id == target_id)
                 .values(turn_count=len(ids), updated_at=now))
    return len(ids)


def _ends_at(messages: Sequence[Any], turn_no: int) -> bool:
    """Whether the copy of turn ``turn_no`` is the whole turn: it ends with a final answer (an
    assistant message without tool calls) among the messages copied."""
    own = [m for m in messages if m.turn_no == turn_no]
    return bool(own) and own[-1].role == "assistant" and not own[-1].tool_calls
