"""Storing a posted message and its queued turn: the start of the turn state machine
(kortex/storage/turns.py has the transitions after it), in the caller's transaction, with the
reads admission decides on and an Idempotency-Key's replay."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import and_, bindparam, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from kortex import tracing
from kortex.errors import Conflict, NotFound
from kortex.ids import uuid7
from kortex.messages import UserMessage
from kortex.storage import turns as transitions
from kortex.storage.chats import INSERT_MESSAGE, message_row
from kortex.storage.records import ACTIVE, Spent, TurnRecord
from kortex.storage.schema import (
    ONE_ACTIVE_TURN,
    chat_messages,
    chat_sessions,
    tenant_spend,
    tenants,
    turns,
)
from kortex.timeparse import utcnow

_t = turns.c


R = TypeVar("R")


def key_mismatch() -> Conflict:
    """An Idempotency-Key sent again with another request."""
    return Conflict("this Idempotency-Key was used for a different request", code="idempotency_mismatch")


def replayed(earlier: tuple[R, str | None] | None, digest: str) -> R | None:
    """What an Idempotency-Key made before (a record, with the hash of the request that made it),
    if anything; the key sent with another request (another ``digest``) is a Conflict."""
    if earlier is None:
        return None
    if earlier[1] != digest:
        raise key_mismatch()
    return earlier[0]


def request_hash(content: str, model: str | None) -> str:
    return hashlib.sha256(json.dumps([content, model]).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewTurn:
    turn: TurnRecord
    created: bool  # False when an Idempotency-Key matched an earlier request


# Admission reads everything it decides on in one unlocked statement (the session, a turn
# still active in it, an earlier request with the same Idempotency-Key, and what the budget
# checks), then writes the turn; how many turns the tenant runs at once is counted in Redis
# (kortex/turns/admission.py), not here. Posts to one session queue on the session row's update.
_ADMIT_READ = (
    select(
        tenants.c.settings, chat_sessions.c.id.label("session_id"), chat_sessions.c.model,
        select(_t.id).where(_t.tenant_id == bindparam("p_tenant"), _t.session_id == bindparam("p_session"),
                            _t.status.in_(ACTIVE)).limit(1).scalar_subquery().label("busy"),
        select(_t.id).where(_t.tenant_id == bindparam("p_tenant"), _t.idempotency_key == bindparam("p_key"))
        .scalar_subquery().label("earlier"),
        # What the budget checks need (kortex/budget.py), read in the same round trip.
        select(tenant_spend.c.cost_usd)
        .where(tenant_spend.c.tenant_id == bindparam("p_tenant"), tenant_spend.c.day == bindparam("p_day"))
        .scalar_subquery().label("usd"),
        select(func.coalesce(func.sum(_t.input_tokens + _t.output_tokens), 0))
        .where(_t.tenant_id == bindparam("p_tenant"), _t.session_id == bindparam("p_session"))
        .scalar_subquery().label("tokens"),
    )
    .select_from(tenants.outerjoin(chat_sessions, and_(chat_sessions.c.id == bindparam("p_session"),
                                                       chat_sessions.c.tenant_id == tenants.c.id)))
    .where(tenants.c.id == bindparam("p_tenant"))
)
# Two posts to one session that both read it idle: the unique index on a session's active
# turn (schema.ONE_ACTIVE_TURN) fails the insert of the one that commits second, so the write
# needs no count read after it and no transaction around it. That post is then told which
# turn is active. How many turns a tenant runs at once is counted in Redis
# (kortex/turns/admission.py), not here: no lock spans a tenant's posts.
_ACTIVE_TURN = select(_t.id).where(_t.tenant_id == bindparam("p_tenant"), _t.session_id == bindparam("p_session"),
                                   _t.status.in_(ACTIVE)).limit(1)


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission read, handed to ``create_turn``'s ``admit``, and the new turn's id."""

    turn_id: str
    spent: Spent


_EARLIER = select(turns).where(_t.id == bindparam("p_id"))
_NEXT_TURN_NO = (
    update(chat_sessions)
    .where(chat_sessions.c.id == bindparam("p_session"), chat_sessions.c.tenant_id == bindparam("p_tenant"))
    .values(turn_count=chat_sessions.c.turn_count + 1, updated_at=bindparam("p_now"))
    .returning(chat_sessions.c.turn_count)
)
_INSERT_TURN = turns.insert()
# PostgreSQL writes a new turn in one statement: the session's next turn number, the turn, its
# user message, which are three round trips one by one (SQLite, which
# has no data-modifying WITH, still takes them). The inserts get their turn number from the
# update; a session that vanished since the read leaves them nothing to insert (turn_no NULL).
# Each column is bound with its own type, so values are stored exactly as by the plain inserts.
_TURN_COLUMNS = ("id", "tenant_id", "session_id", "status", "step", "attempt", "lease_until", "pending_tools",
                 "model", "model_used", "idempotency_key", "request_hash", "error", "input_tokens", "output_tokens",
                 "cost_usd", "deadline_at", "created_at", "updated_at", "finished_at", "profile",
                 "traceparent")
_MESSAGE_COLUMNS = tuple(c.name for c in chat_messages.c if c.name != "turn_no")
_next_turn = _NEXT_TURN_NO.cte("next_turn")
_new_turn = (
    insert(turns)
    .from_select([*_TURN_COLUMNS, "turn_no"],
                 select(*[bindparam(f"t_{c}", type_=turns.c[c].type) for c in _TURN_COLUMNS], _next_turn.c.turn_count))
    .returning(_t.turn_no)
    .cte("new_turn")
)
_new_message = (
    insert(chat_messages)
    .from_select([*_MESSAGE_COLUMNS, "turn_no"],
                 select(*[bindparam(f"m_{c}", type_=chat_messages.c[c].type) for c in _MESSAGE_COLUMNS],
                        _new_turn.c.turn_no))
    .returning(chat_messages.c.id)
    .cte("new_message")
)
_WRITE_TURN_PG = select(
    select(_new_turn.c.turn_no).scalar_subquery().label("turn_no"),
    select(func.count()).select_from(_new_message).scalar_subquery().label("messages"),
)


def _write_turn(conn: Connection, row: dict[str, Any], content: str) -> int | None:
    """Store the turn ``row`` (all but its turn_no) and its user message; returns the turn's
    number, None when the session is gone."""
    message = message_row(tenant_id=row["tenant_id"], session_id=row["session_id"], turn_id=row["id"], turn_no=0,
                          step=-1, ord=0, message=UserMessage(content=content))
    if conn.dialect.name in transitions.ONE_STATEMENT_WRITE:
        params = {f"t_{c}": row[c] for c in _TURN_COLUMNS}
        params.update({f"m_{c}": message[c] for c in _MESSAGE_COLUMNS})
        params.update(p_session=row["session_id"], p_tenant=row["tenant_id"], p_now=row["updated_at"])
        written = conn.execute(_WRITE_TURN_PG, params).one()
        return int(written.turn_no) if written.turn_no is not None else None
    turn_no = conn.scalar(_NEXT_TURN_NO, {"p_session": row["session_id"], "p_tenant": row["tenant_id"],
                                          "p_now": row["updated_at"]})
    if turn_no is None:
        return None
    conn.execute(_INSERT_TURN, {**row, "turn_no": turn_no})
    conn.execute(INSERT_MESSAGE, {**message, "turn_no": turn_no})
    return int(turn_no)


def _busy(turn_id: str | None) -> Conflict:
    return Conflict("a turn is already in progress in this session", code="turn_in_progress",
                    details={"turn_id": turn_id} if turn_id else None)


def _names(exc: IntegrityError, index: str) -> bool:
    """Whether the violated constraint is ``index``: PostgreSQL names it; SQLite names the
    columns (the session's active turn is its only unique index on ``turns.session_id`` alone)."""
    diag = getattr(exc.orig, "diag", None)
    name = getattr(diag, "constraint_name", None)
    if name is not None:
        return bool(name == index)
    return "UNIQUE constraint failed: turns.session_id" in str(exc.orig)


def _active_turn(conn: Connection, tenant_id: str, session_id: str) -> str | None:
    """The session's active turn, read after a write that lost to it; None where the failed
    write left the transaction unusable (PostgreSQL inside one: posts write in autocommit)."""
    try:
        found = conn.scalar(_ACTIVE_TURN, {"p_tenant": tenant_id, "p_session": session_id})
    except DBAPIError:
        return None
    return str(found) if found is not None else None


def create_turn(
    conn: Connection,
    *,
    tenant_id: str,
    session_id: str,
    content: str,
    model: str | None,
    deadline: timedelta,
    idempotency_key: str | None = None,
    admit: Callable[[Connection, Admission], None] | None = None,
    profile: str = "chat",
) -> NewTurn:
    """Store the user message and a queued turn in the caller's transaction. ``model`` None
    means the session's model. ``admit`` runs only when a new turn is about to be created (not
    for a replay), after the checks that need no lock, and may refuse it."""
    now = utcnow()
    state = conn.execute(_ADMIT_READ, {"p_tenant": tenant_id, "p_session": session_id, "p_key": idempotency_key,
                                       "p_day": now.date()}).first()
    if state is None or state.session_id is None:
        raise NotFound("session not found")
    model = model or state.model
    digest = request_hash(content, model)
    if idempotency_key and state.earlier is not None:
        earlier = conn.execute(_EARLIER, {"p_id": state.earlier}).one()
        if earlier.session_id != session_id or earlier.request_hash != digest:
            raise key_mismatch()
        return NewTurn(TurnRecord.from_row(earlier), created=False)  # a replay changes nothing
    if state.busy:
        raise _busy(state.busy)
    turn_id = uuid7()
    if admit is not None:
        spent = Spent(usd_today=float(state.usd or 0.0), session_tokens=int(state.tokens or 0),
                      tenant_settings=state.settings)
        admit(conn, Admission(turn_id=turn_id, spent=spent))
    row: dict[str, Any] = {
        "id": turn_id, "tenant_id": tenant_id, "session_id": session_id,
        "status": "queued", "step": 0, "attempt": 0, "lease_until": None, "pending_tools": 0, "model": model,
        "model_used": None,
        "idempotency_key": idempotency_key, "request_hash": digest, "error": None,
        "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "deadline_at": now + deadline,
        "created_at": now, "updated_at": now, "finished_at": None, "profile": profile,
        # the posting span's: the watchdog re-runs a step in the turn's trace (kortex/turns/watchdog.py)
        "traceparent": tracing.traceparent(),
    }
    try:
        turn_no = _write_turn(conn, row, content)
    except IntegrityError as exc:
        # With an Idempotency-Key the post that came first may be this same request sent twice,
        # whichever of the two unique indexes the database checked first: the caller reads
        # again and replays that turn, or finds the session busy with another.
        if idempotency_key is not None or not _names(exc, ONE_ACTIVE_TURN):
            raise
        raise _busy(_active_turn(conn, tenant_id, session_id)) from None  # another post to it came first
    if turn_no is None:  # deleted since the read
        raise NotFound("session not found")
    row["turn_no"] = turn_no
    row.pop("idempotency_key")
    row.pop("request_hash")
    return NewTurn(TurnRecord(**row), created=True)
