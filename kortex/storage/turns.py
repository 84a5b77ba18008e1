"""The turn state machine in SQL: every transition is a compare-and-set, so tasks may run twice.
A turn is created ``queued`` by kortex/storage/posting.py.

    queued --claim_step--> running --park_for_tools--> waiting_tools
       ^                      |                             |
       +------- complete_invocation (the last one) ---------+
                              |
                              +--finish_turn--> done | failed

The statements of the hot path are built once at import (parameters bound per call): building
a SQLAlchemy statement costs more CPU than running it on a local database.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, case, exists, func, insert, literal_column, select, true, tuple_, union_all, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from kortex import tracing
from kortex.errors import Conflict, NotFound
from kortex.ids import uuid7
from kortex.messages import AssistantMessage, Message, ToolMessage, ToolResult, Usage
from kortex.storage import audit
from kortex.storage.audit import AuditEntry
from kortex.storage.chats import HISTORY_COLUMNS, HISTORY_ORDER, INSERT_MESSAGE, history_of, message_row
from kortex.storage.records import ACTIVE, TERMINAL, InvocationRecord, Spent, TurnRecord
from kortex.storage.schema import (
    chat_messages,
    decisions,
    stream_outbox,
    tenant_spend,
    tenants,
    tool_invocations,
    turns,
)
from kortex.timeparse import utcnow

_t, _i = turns.c, tool_invocations.c

#: dialects that write a turn, a step's end or a tool result in one statement (posting.py too;
#: a test turns it off to compare the two ways)
ONE_STATEMENT_WRITE = frozenset({"postgresql"})
_s = turns.alias("session_turn").c  # the session's other turns, inside a statement on one turn


_GET_TURN = select(turns).where(_t.id == bindparam("p_id"), _t.tenant_id == bindparam("p_tenant"))


def get_turn(conn: Connection, tenant_id: str, turn_id: str) -> TurnRecord:
    row = conn.execute(_GET_TURN, {"p_id": turn_id, "p_tenant": tenant_id}).first()
    if row is None:
        raise NotFound("turn not found")
    return TurnRecord.from_row(row)


# The claimed row's own columns, for the subqueries of its RETURNING: written out whole, as
# SQLAlchemy leaves them unqualified on SQLite, where ``tenant_id = tenant_id`` then compares
# the subquery's table with itself.
_claimed_turn: dict[str, ColumnElement[Any]] = {name: literal_column(f"turns.{name}")
                                                for name in ("id", "tenant_id", "session_id")}
_CLAIM_STEP = (
    update(turns)
    .where(_t.id == bindparam("p_id"), _t.tenant_id == bindparam("p_tenant"), _t.step == bindparam("p_step"),
           _t.status == "queued")
    .values(status="running", attempt=_t.attempt + 1, lease_until=bindparam("p_lease"), updated_at=bindparam("p_now"))
    .returning(
        *turns.c,
        # Kept events of the turn (an outage) go out before the step's own, in the same round trip.
        exists().where(stream_outbox.c.turn_id == _claimed_turn["id"]).label("kept_events"),
        # And what the budget checks before the call need (kortex/budget.py): the same round trip.
        select(tenant_spend.c.cost_usd)
        .where(tenant_spend.c.tenant_id == _claimed_turn["tenant_id"], tenant_spend.c.day == bindparam("p_day"))
        .scalar_subquery().label("spend_usd"),
        select(func.coalesce(func.sum(_s.input_tokens + _s.output_tokens), 0))
        .where(_s.tenant_id == _claimed_turn["tenant_id"], _s.session_id == _claimed_turn["session_id"])
        .scalar_subquery().label("spend_tokens"),
        select(tenants.c.settings).where(tenants.c.id == _claimed_turn["tenant_id"])
        .scalar_subquery().label("spend_settings"),
    )
)


# The claim and the session's latest messages in one statement (PostgreSQL: a data-modifying
# CTE and a lateral read of the claimed turn's session). Every step read them in two round
# trips; under load each round trip of an I/O thread waits for the GIL again behind the event
# loop, so the trips, not the statements, are what a claim costs. A lost claim returns no row
# and reads nothing.
_claimed = _CLAIM_STEP.cte("claimed")
_h = chat_messages.c
# The message columns keep their names (no column of the claim's RETURNING has one of them),
# so ``history_of`` reads the joined rows as they are; the order columns are renamed.
_latest = (
    select(*(_h[name] for name in HISTORY_COLUMNS),
           _h.turn_no.label("h_turn_no"), _h.step.label("h_step"), _h.ord.label("h_ord"))
    .where(_h.tenant_id == _claimed.c.tenant_id, _h.session_id == _claimed.c.session_id)
    .order_by(*HISTORY_ORDER)
    .limit(bindparam("p_limit"))
    .lateral("latest")
)
_CLAIM_WITH_HISTORY = (
    select(_claimed, _latest)
    .select_from(_claimed.outerjoin(_latest, true()))
    .order_by(_latest.c.h_turn_no.desc(), _latest.c.h_step.desc(), _latest.c.h_ord.desc())
)


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """A claimed step's turn, and what its tenant and session have spent (read with the claim)."""

    turn: TurnRecord
    spent: Spent
    #: the session's latest messages, when the claim read them too (``history``); else None
    history: list[Message] | None = None


def claim(conn: Connection, tenant_id: str, turn_id: str, step: int, *, lease: float,
          history: int | None = None) -> ClaimedStep | None:
    """queued -> running for exactly one delivery of this step, holding a lease of ``lease``
    seconds that the running attempt renews, in one statement that also reads the spend the
    budget checks. None means someone else has it.

    ``history``: also read the session's latest ``history`` messages as ``load_history`` does,
    in the same statement where the database allows (PostgreSQL); elsewhere the caller reads
    them itself (``ClaimedStep.history`` is None)."""
    now = utcnow()
    params = {"p_id": turn_id, "p_tenant": tenant_id, "p_step": step, "p_now": now,
              "p_lease": now + timedelta(seconds=lease), "p_day": now.date()}
    messages: list[Message] | None = None
    if history is not None and conn.dialect.name in ONE_STATEMENT_WRITE:
        rows = conn.execute(_CLAIM_WITH_HISTORY, {**params, "p_limit": history}).all()
        if not rows:
            return None
        row = rows[0]
        messages = history_of([r for r in rows if r.role is not None])  # no message: one row, no role
    else:
        found = conn.execute(_CLAIM_STEP, params).first()
        if found is None:
            return None
        row = found
    return ClaimedStep(TurnRecord.from_row(row), Spent(usd_today=float(row.spend_usd or 0.0),
                                                       session_tokens=int(row.spend_tokens or 0),
                                                       tenant_settings=row.spend_settings), messages)



def claim_step(conn: Connection, tenant_id: str, turn_id: str, step: int, *, lease: float) -> TurnRecord | None:
    """``claim``, for a caller that needs only the turn."""
    claimed = claim(conn, tenant_id, turn_id, step, lease=lease)
    return claimed.turn if claimed is not None else None


def renew_leases(conn: Connection, held: list[tuple[str, str, int]], *, lease: float) -> set[str]:
    """Extend, in one statement, the leases of the step attempts (turn id, tenant id, attempt)
    that one process runs; returns the turn ids still held (a missing one was handed on)."""
    if not held:
        return set()
    rows = conn.execute(
        update(turns)
        .where(tuple_(_t.id, _t.tenant_id, _t.attempt).in_(held), _t.status == "running")
        .values(lease_until=utcnow() + timedelta(seconds=lease))
        .returning(_t.id)
    ).all()
    return {r.id for r in rows}


def touch_queued(conn: Connection, turn_ids: list[str]) -> None:
    """Mark queued turns as held by a live process (waiting for a slot in its step engine),
    so the watchdog does not take them for lost hand-offs."""
    if turn_ids:
        conn.execute(update(turns).where(_t.id.in_(turn_ids), _t.status == "queued").values(updated_at=utcnow()))


def unclaim_step(conn: Connection, turn: TurnRecord, step: int) -> bool:
    """Undo a claim that nothing followed (the reads after it failed): running -> queued with
    the attempt it had before, as if the claim had rolled back."""
    moved = conn.execute(
        update(turns)
        .where(_t.id == turn.id, _t.tenant_id == turn.tenant_id, _t.step == step, _t.attempt == turn.attempt,
               _t.status == "running")
        .values(status="queued", attempt=_t.attempt - 1, lease_until=None, updated_at=utcnow())
        .returning(_t.id)
    ).first()
    return moved is not None


def release_step(conn: Connection, turn: TurnRecord, step: int) -> bool:
    """running -> queued for an attempt that gives its step back (its process is stopping),
    so another worker can run it at once instead of after the lease lapses."""
    moved = conn.execute(
        update(turns)
        .where(_t.id == turn.id, _t.tenant_id == turn.tenant_id, _t.step == step, _t.attempt == turn.attempt,
               _t.status == "running")
        .values(status="queued", lease_until=None, updated_at=utcnow())
        .returning(_t.id)
    ).first()
    return moved is not None


def _usage_params(usage: Usage, model_used: str | None) -> dict[str, Any]:
    return {"p_in": usage.input_tokens, "p_out": usage.output_tokens, "p_cost": usage.cost_usd,
            "p_model_used": model_used, "p_now": utcnow()}


_USAGE = {
    "input_tokens": _t.input_tokens + bindparam("p_in"),
    "output_tokens": _t.output_tokens + bindparam("p_out"),
    "cost_usd": _t.cost_usd + bindparam("p_cost"),
    "model_used": func.coalesce(bindparam("p_model_used"), _t.model_used),
    "updated_at": bindparam("p_now"),
}
_PARK = (
    update(turns)
    .where(_t.id == bindparam("p_id"), _t.tenant_id == bindparam("p_tenant"), _t.step == bindparam("p_step"),
           _t.attempt == bindparam("p_attempt"), _t.status == "running")
    .values(status="waiting_tools", pending_tools=bindparam("p_pending"), lease_until=None, **_USAGE)
)
_INSERT_INVOCATIONS = tool_invocations.insert()


def park_for_tools(
    conn: Connection,
    turn: TurnRecord,
    *,
    step: int,
    message: AssistantMessage,
    usage: Usage,
    model_used: str | None,
    refused: dict[str, ToolResult] | None = None,
    audit_entries: Sequence[AuditEntry] = (),
) -> list[InvocationRecord]:
    """Store the assistant's tool calls and move running -> waiting_tools. Calls in ``refused``
    (by call id) are settled at once with the given error result; the others are returned, to
    be run. ``audit_entries`` are written if the move won."""
    refused = refused or {}
    now = utcnow()
    runnable = [c for c in message.tool_calls if c.id not in refused]
    trace = tracing.traceparent()
    parked = _cas_and_message(conn, "park", {
        "p_id": turn.id, "p_tenant": turn.tenant_id, "p_step": step, "p_attempt": turn.attempt,
        "p_pending": len(runnable), **_usage_params(usage, model_used)},
        message_row(tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id, turn_no=turn.turn_no,
                    step=step, ord=0, message=message), audit_entries)
    if not parked:
        raise Conflict("turn moved on while this step ran", code="stale_step")
    records = []
    rows = []
    for idx, call in enumerate(message.tool_calls):
        result = refused.get(call.id)
        record = InvocationRecord(
            id=uuid7(), tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id,
            turn_no=turn.turn_no, step=step, idx=idx, call_id=call.id, name=call.name,
            arguments=call.arguments, arguments_error=call.arguments_error,
            status="pending" if result is None else "done", attempts=0, deadline_at=None, profile=turn.profile,
            traceparent=trace,
        )
        rows.append({
            "id": record.id, "tenant_id": record.tenant_id, "session_id": record.session_id,
            "turn_id": record.turn_id, "turn_no": record.turn_no, "step": step, "idx": idx,
            "call_id": call.id, "name": call.name, "arguments": call.arguments,
            "arguments_error": call.arguments_error, "status": record.status, "is_error": result is not None,
            "error_code": result.error_code if result else None, "truncated": False, "elapsed_ms": 0,
            "attempts": 0, "created_at": now, "enqueued_at": now, "started_at": None, "deadline_at": None,
            "finished_at": now if result else None, "profile": turn.profile,
            "traceparent": trace,  # the step's span: a call the watchdog hands on stays in its trace
        })
        if result is None:
            records.append(record)
        else:
            conn.execute(INSERT_MESSAGE, message_row(tenant_id=turn.tenant_id, session_id=turn.session_id,
                                                     turn_id=turn.id, turn_no=turn.turn_no, step=step, ord=idx + 1,
                                                     message=ToolMessage(result=result)))
    conn.execute(_INSERT_INVOCATIONS, rows)
    return records


_FINISH = (
    update(turns)
    .where(_t.id == bindparam("p_id"), _t.tenant_id == bindparam("p_tenant"), _t.step == bindparam("p_step"),
           _t.attempt == bindparam("p_attempt"), _t.status == "running")
    .values(status=bindparam("p_status"), error=bindparam("p_error", type_=turns.c.error.type),
            finished_at=bindparam("p_now"), pending_tools=0, lease_until=None, **_USAGE)
)


_ALL_MESSAGE_COLUMNS = tuple(c.name for c in chat_messages.c)
#: audit rows a state change writes in its own statement on PostgreSQL (each was a statement of
#: its own in the same transaction: +100 us of Python, +130 us of PostgreSQL CPU and +310 us of
#: wall time a row, measured); a step with more (a failover's several calls) writes them apart
FOLDED_AUDIT = 4


def _audit_rows(guard: Any, n: int, name: str) -> Any:
    """``n`` decisions rows (bound as ``a<i>_<column>``), written once for each row of ``guard``,
    the state change's CTE: one row when it won, none when it lost."""
    rows = [select(*[bindparam(f"a{i}_{c}", type_=decisions.c[c].type) for c in audit.COLUMNS]).select_from(guard)
            for i in range(n)]
    return (insert(decisions).from_select(list(audit.COLUMNS), rows[0] if n == 1 else union_all(*rows))
            .returning(decisions.c.id).cte(f"{name}_audit"))


def _fold(entries: Sequence[AuditEntry]) -> tuple[int, dict[str, Any]]:
    """How many of ``entries`` ride in the state change's own statement (all, up to
    FOLDED_AUDIT; else none), and their parameters."""
    n = len(entries) if len(entries) <= FOLDED_AUDIT else 0
    return n, {f"a{i}_{c}": value for i, e in enumerate(entries[:n]) for c, value in audit.row(e).items()}


def _audit_rest(conn: Connection, entries: Sequence[AuditEntry], folded: int) -> None:
    """Once the state change won, in its transaction: the spend of folded rows, or the rows."""
    if folded:
        audit.add_spends(conn, entries)
    else:
        audit.write_entries(conn, entries)


def _with_message(cas: Any, name: str, audited: int = 0) -> Any:
    """For PostgreSQL, the step's compare-and-set on its turn with the assistant message it
    stores (and ``audited`` audit rows) in one statement, where they were round trips one by
    one; those are written only if the CAS won."""
    moved = cas.returning(_t.id).cte(f"{name}_moved")
    message = (
        insert(chat_messages)
        .from_select(list(_ALL_MESSAGE_COLUMNS),
                     select(*[bindparam(f"m_{c}", type_=chat_messages.c[c].type) for c in _ALL_MESSAGE_COLUMNS])
                     .select_from(moved))
        .returning(chat_messages.c.id)
        .cte(f"{name}_message")
    )
    counts = [select(func.count()).select_from(moved).scalar_subquery().label("moved"),
              select(func.count()).select_from(message).scalar_subquery().label("messages")]
    if audited:
        counts.append(select(func.count()).select_from(_audit_rows(moved, audited, name))
                      .scalar_subquery().label("audited"))
    return select(*counts)


_STATE_CHANGES = {"finish": _FINISH, "park": _PARK}
#: each alone, returning the row it moved (SQLite; a step with no message to store)
_ALONE = {name: cas.returning(_t.id) for name, cas in _STATE_CHANGES.items()}


@functools.cache
def _with_audit(name: str, audited: int) -> Any:
    """The one-statement form of ``name`` with room for ``audited`` audit rows, made once."""
    return _with_message(_STATE_CHANGES[name], name, audited)


def _cas_and_message(conn: Connection, name: str, params: dict[str, Any], message: dict[str, Any] | None,
                     entries: Sequence[AuditEntry] = ()) -> bool:
    """Run the step's compare-and-set ``name`` (it returns the row it moved) and, if it won,
    insert ``message`` and the audit rows of ``entries``; True when it won. Never ``rowcount``:
    what drivers report for it is not the same everywhere."""
    if message is not None and conn.dialect.name in ONE_STATEMENT_WRITE:
        folded, audited = _fold(entries)
        params = {**params, **{f"m_{c}": message[c] for c in _ALL_MESSAGE_COLUMNS}, **audited}
        won = bool(conn.execute(_with_audit(name, folded), params).one().moved)
        if won:
            _audit_rest(conn, entries, folded)
        return won
    if conn.execute(_ALONE[name], params).first() is None:
        return False
    if message is not None:
        conn.execute(INSERT_MESSAGE, message)
    audit.write_entries(conn, entries)
    return True


def finish_turn(
    conn: Connection,
    turn: TurnRecord,
    *,
    step: int,
    message: AssistantMessage | None,
    usage: Usage,
    model_used: str | None,
    status: str = "done",
    error: dict[str, Any] | None = None,
    grounding: dict[str, Any] | None = None,
    audit_entries: Sequence[AuditEntry] = (),
) -> bool:
    """running -> done | failed for the attempt that holds the step, storing the final
    assistant message (with its checked citations) and ``audit_entries``. False if the turn
    moved on (another attempt, the watchdog): then nothing is written."""
    row = None
    if message is not None and (message.content or message.tool_calls):
        row = message_row(tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id,
                          turn_no=turn.turn_no, step=step, ord=0, message=message, grounding=grounding)
    return _cas_and_message(conn, "finish", {
        "p_id": turn.id, "p_tenant": turn.tenant_id, "p_step": step, "p_attempt": turn.attempt, "p_status": status,
        "p_error": error, **_usage_params(usage, model_used)}, row, audit_entries)


def add_usage(conn: Connection, tenant_id: str, turn_id: str, usage: Usage) -> None:
    """Add what calls billed to a turn whose step could not record it with its own transition
    (the turn was cancelled or had moved on): whatever the turn's state."""
    if not (usage.input_tokens or usage.output_tokens or usage.cost_usd):
        return
    conn.execute(update(turns).where(_t.id == turn_id, _t.tenant_id == tenant_id)
                 .values(input_tokens=_t.input_tokens + usage.input_tokens,
                         output_tokens=_t.output_tokens + usage.output_tokens,
                         cost_usd=_t.cost_usd + usage.cost_usd))


def record_done_event(conn: Connection, tenant_id: str, turn_id: str, entry_id: str) -> None:
    """Remember the stream id of a finished turn's ``done`` (see ``turns.done_event_id``)."""
    conn.execute(update(turns).where(_t.id == turn_id, _t.tenant_id == tenant_id, _t.status.in_(TERMINAL))
                 .values(done_event_id=entry_id))


@dataclass(frozen=True, slots=True)
class Completion:
    """What completing one tool call did to its turn."""

    invocation: InvocationRecord
    next_step: int | None  # set when this was the last result of the step


_COMPLETE_INVOCATION = (
    update(tool_invocations)
    .where(_i.id == bindparam("p_id"), _i.tenant_id == bindparam("p_tenant"),
           _i.status.in_(bindparam("p_from", expanding=True)))
    .values(status="done", is_error=bindparam("p_is_error"), error_code=bindparam("p_error_code"),
            truncated=bindparam("p_truncated"), elapsed_ms=bindparam("p_elapsed"), finished_at=bindparam("p_now"))
    .returning(*tool_invocations.c)
)
# One statement decrements the counter and, when it reaches zero, advances the step: the SET
# clauses all read the old row, and the row lock orders concurrent completions.
_LAST = _t.pending_tools == 1
_COUNT_DOWN = (
    update(turns)
    .where(_t.id == bindparam("p_id"), _t.tenant_id == bindparam("p_tenant"), _t.step == bindparam("p_step"),
           _t.status == "waiting_tools")
    .values(pending_tools=_t.pending_tools - 1, status=case((_LAST, "queued"), else_=_t.status),
            step=case((_LAST, _t.step + 1), else_=_t.step), updated_at=bindparam("p_now"))
    .returning(_t.pending_tools, _t.step)
)


# PostgreSQL stores a result in one statement: the invocation's compare-and-set, its tool
# message and the turn's count down, three round trips one by one (SQLite takes them so). The
# message and the count down read the invocation's row from the first CTE, so they happen only
# when it won, and after it: the invocation is still locked before the turn (see fail_turn).
_done_inv = _COMPLETE_INVOCATION.cte("done_inv")
_RESULT_COLUMNS = tuple(c.name for c in chat_messages.c
                        if c.name not in ("session_id", "turn_id", "turn_no", "step", "ord"))
_result_message = (
    insert(chat_messages)
    .from_select([*_RESULT_COLUMNS, "session_id", "turn_id", "turn_no", "step", "ord"],
                 select(*[bindparam(f"m_{c}", type_=chat_messages.c[c].type) for c in _RESULT_COLUMNS],
                        _done_inv.c.session_id, _done_inv.c.turn_id, _done_inv.c.turn_no, _done_inv.c.step,
                        _done_inv.c.idx + 1))
    .returning(chat_messages.c.id)
    .cte("result_message")
)
_count_down = (
    update(turns)
    .where(_t.id == _done_inv.c.turn_id, _t.tenant_id == bindparam("p_tenant"), _t.step == _done_inv.c.step,
           _t.status == "waiting_tools")
    .values(pending_tools=_t.pending_tools - 1, status=case((_LAST, "queued"), else_=_t.status),
            step=case((_LAST, _t.step + 1), else_=_t.step), updated_at=bindparam("p_now"))
    .returning(_t.pending_tools.label("left_pending"), _t.step.label("left_step"))
    .cte("count_down")
)
_COMPLETE_PG = (
    select(_done_inv, _count_down.c.left_pending, _count_down.c.left_step,
           select(func.count()).select_from(_result_message).scalar_subquery().label("messages"))
    .select_from(_done_inv.outerjoin(_count_down, true()))
)


@functools.cache
def _complete_with_audit(audited: int) -> Any:
    """``_COMPLETE_PG`` with room for ``audited`` audit rows, written only if the result's
    compare-and-set won; made once."""
    if not audited:
        return _COMPLETE_PG
    return _COMPLETE_PG.add_columns(select(func.count()).select_from(_audit_rows(_done_inv, audited, "complete"))
                                    .scalar_subquery().label("audited"))


def complete_invocation(
    conn: Connection,
    tenant_id: str,
    invocation_id: str,
    result: ToolResult,
    *,
    from_status: tuple[str, ...] = ("running",),
    audit_entries: Sequence[AuditEntry] = (),
) -> Completion | None:
    """Store a result, and ``audit_entries`` with it; the last result of a step re-queues the
    turn for the next step, once. None (and nothing written) when the call was settled already."""
    now = utcnow()
    params = {
        "p_id": invocation_id, "p_tenant": tenant_id, "p_from": list(from_status), "p_is_error": result.is_error,
        "p_error_code": result.error_code, "p_truncated": result.truncated, "p_elapsed": result.elapsed_ms,
        "p_now": now,
    }
    if conn.dialect.name in ONE_STATEMENT_WRITE:
        message = message_row(tenant_id=tenant_id, session_id="", turn_id="", turn_no=0, step=0, ord=0,
                              message=ToolMessage(result=result))
        params.update({f"m_{c}": message[c] for c in _RESULT_COLUMNS})
        folded, audited = _fold(audit_entries)
        params.update(audited)
        done = conn.execute(_complete_with_audit(folded), params).first()
        if done is None:
            return None
        _audit_rest(conn, audit_entries, folded)
        next_step = done.left_step if done.left_pending == 0 else None
        return Completion(InvocationRecord.from_row(done), next_step)
    row = conn.execute(_COMPLETE_INVOCATION, params).first()
    if row is None:
        return None
    inv = InvocationRecord.from_row(row)
    conn.execute(INSERT_MESSAGE, message_row(tenant_id=tenant_id, session_id=inv.session_id, turn_id=inv.turn_id,
                                             turn_no=inv.turn_no, step=inv.step, ord=inv.idx + 1,
                                             message=ToolMessage(result=result)))
    advanced = conn.execute(_COUNT_DOWN, {"p_id": inv.turn_id, "p_tenant": tenant_id, "p_step": inv.step,
                                          "p_now": now}).first()
    audit.write_entries(conn, audit_entries)
    next_step = advanced.step if advanced is not None and advanced.pending_tools == 0 else None
    return Completion(inv, next_step)


@dataclass(frozen=True, slots=True)
class Ended:
    """A turn this call ended: the tool calls it settled as cancelled, (step, result) each,
    for the caller to announce before ``done``."""

    cancelled: tuple[tuple[int, ToolResult], ...] = ()


def fail_turn(conn: Connection, turn: TurnRecord, error: dict[str, Any]) -> Ended | None:
    """Any active state -> failed (deadline passed, unrecoverable error)."""
    return _end_turn(conn, turn, "failed", error)


def cancel_turn(conn: Connection, turn: TurnRecord, error: dict[str, Any]) -> Ended | None:
    """Any active state -> cancelled (a client asked). A step still streaming finds its stream
    closed at its next write; a tool call still running finds its invocation settled."""
    return _end_turn(conn, turn, "cancelled", error)


def _end_turn(conn: Connection, turn: TurnRecord, status: str, error: dict[str, Any]) -> Ended | None:
    """Any active state -> ``status``, by compare-and-set; None when another call moved it.

    Tool calls still open are settled as cancelled, each with a tool message, so the session's
    history never holds a call without its result (vendors reject such a conversation). The
    invocations are locked before the turn, the order complete_invocation uses too, so the
    two cannot deadlock.
    """
    now = utcnow()
    cancelled = conn.execute(
        update(tool_invocations)
        .where(_i.turn_id == turn.id, _i.tenant_id == turn.tenant_id, _i.status.in_(("pending", "running")))
        .values(status="done", is_error=True, error_code="cancelled", finished_at=now)
        .returning(_i.session_id, _i.turn_id, _i.turn_no, _i.step, _i.idx, _i.call_id, _i.name)
    ).all()
    moved = conn.execute(
        update(turns)
        .where(_t.id == turn.id, _t.tenant_id == turn.tenant_id, _t.status.in_(ACTIVE))
        .values(status=status, error=error, finished_at=now, updated_at=now, lease_until=None)
        .returning(_t.id)
    ).first()
    settled: list[tuple[int, ToolResult]] = []
    for inv in cancelled:
        result = ToolResult(call_id=inv.call_id, name=inv.name, is_error=True, error_code="cancelled",
                            content={"error": True, "message": "the turn ended before this tool finished",
                                     "code": "CANCELLED", "error_code": "cancelled"})
        conn.execute(INSERT_MESSAGE, message_row(tenant_id=turn.tenant_id, session_id=inv.session_id,
                                                 turn_id=inv.turn_id, turn_no=inv.turn_no, step=inv.step,
                                                 ord=inv.idx + 1, message=ToolMessage(result=result)))
        settled.append((inv.step, result))
    return None if moved is None else Ended(tuple(settled))


def session_usage(conn: Connection, tenant_id: str, session_id: str) -> Usage:
    row = conn.execute(
        select(func.coalesce(func.sum(_t.input_tokens), 0), func.coalesce(func.sum(_t.output_tokens), 0),
               func.coalesce(func.sum(_t.cost_usd), 0.0))
        .where(_t.tenant_id == tenant_id, _t.session_id == session_id)
    ).one()
    return Usage(input_tokens=int(row[0]), output_tokens=int(row[1]), cost_usd=round(float(row[2]), 8))


def cost_of(tenant_id: str, turn_id: str) -> Any:
    """What a turn has cost so far (a statement: its caller reads it in its own transaction)."""
    return select(_t.cost_usd).where(_t.id == turn_id, _t.tenant_id == tenant_id)
