"""Announce the end of a turn, in two halves: ``end_turn`` runs its profile's end hook in the
transaction whose compare-and-set ended it; ``announce`` publishes the closing events once that
transaction has committed.

``done`` goes out only after the commit, so a client that has read it finds the turn over:
published inside the transaction, it reached clients 30-60 ms before the commit, and a client
that asked again at once was refused (409, a turn still in progress) about half the time.
If Redis refuses the events they are kept in ``stream_outbox`` for the watchdog; if the
process dies between the commit and the publish, a client following the turn is sent a
``done`` made from the turn's row (kortex/turns/follow.py, ``DONE_GRACE``).

An ending that may have cut a step's LLM call short (a cancel, the watchdog's deadline) makes
its ``done`` say what the turn cost with that call included: ``cut_short`` notes the cut inside
its transaction, ``bill_cuts`` stops the step after the commit and waits for its bill.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy.engine import Connection

from kortex import metrics
from kortex.container import Kortex
from kortex.errors import ConfigError, KortexError
from kortex.events import DoneEvent, ErrorEvent, ToolResultEvent, _Event
from kortex.storage import audit, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.timeparse import utcnow
from kortex.turns.billing import billed
from kortex.turns.handoff import NOTHING, Handoff
from kortex.turns.outbox import publish_after
from kortex.turns.profiles import TurnEnd, profile_of

log = logging.getLogger(__name__)
# How long an ending waits for the steps it cut short to bill their calls: the stop's
# announcement reaches a step's process at once (its next write would refuse it anyway), and it
# bills in one transaction; 0.1-0.3 s in practice. Its client's stream ends by then either way.
BILL_WAIT = 0.8
BILL_POLL = 0.05


@dataclass(frozen=True, slots=True)
class Ending:
    """A turn ended by a transaction: what ``announce`` sends once it has committed, and the
    work its profile's end hook hands on."""

    turn: TurnRecord
    events: Sequence[_Event]
    attempt: int
    handoff: Handoff


def settled_calls(ended: turns.Ended) -> list[ToolResultEvent]:
    """The ``tool_result`` of each call the ending settled as cancelled: a client shown the
    call is told it will not finish, as the history the model reads next says."""
    return [ToolResultEvent(step=step, call_id=r.call_id, name=r.name, is_error=True, error_code=r.error_code,
                            content=r.content) for step, r in ended.cancelled]


def end_turn(k: Kortex, conn: Connection, turn: TurnRecord, events: Sequence[_Event], *,
             attempt: int | None = None, answer: str | None = None) -> Ending:
    """Inside the transaction that ended the turn, after its compare-and-set won: run the
    profile's end hook. ``events`` end with ``done``; ``attempt`` defaults to the turn's (the
    step that finished it); a writer outside any attempt (the watchdog, a cancel) passes 0, as
    its record of the turn may be older than the stream. ``answer`` is the final text of a turn
    that ended done."""
    done = events[-1] if events else None
    status = done.status if isinstance(done, DoneEvent) else "done"
    ending = Ending(turn, events, turn.attempt if attempt is None else attempt, NOTHING)
    try:
        profile = profile_of(turn.profile)
    except ConfigError:  # a kind of turn this process does not know has no hook it could run
        log.warning("turn %s of unknown profile %r ended; no end hook ran", turn.id, turn.profile)
        return ending
    if profile.on_end is None:
        return ending
    end = TurnEnd(status=status if status in ("failed", "cancelled") else "done",
                  answer=answer if status == "done" else None,
                  error=done.error if isinstance(done, DoneEvent) else None)
    return Ending(turn, events, ending.attempt, profile.on_end(k, conn, turn, end))


@dataclass(frozen=True, slots=True)
class Cut:
    """A step an ending may have cut short: the attempt that held the turn, and how many LLM
    call rows the turn had when the ending's compare-and-set won."""

    attempt: int
    calls: int


def cut_short(conn: Connection, was: TurnRecord, turn: TurnRecord, *, by: str = "watchdog") -> Cut | None:
    """Inside the transaction that ended the turn, after its compare-and-set won: the step it
    may have cut mid-call, if any. ``was`` is the turn as the ender found it, ``turn`` its row
    re-read after the compare-and-set (locked by it, so its attempt is the last, and a bill
    racing the ending commits after the count and is seen by ``bill_cuts``).

    A step whose lease had lapsed has no process left to bill its call (its worker died before
    a sweep handed the step on): the call gets its ``worker_lost`` row here, as a lapsed step's
    does in the sweep, and nothing is waited for."""
    if was.status != "running" and turn.attempt == was.attempt:
        return None  # queued or waiting for tools: no step was streaming
    if was.status == "running" and was.lease_until is not None and was.lease_until < utcnow():
        audit.write_entries(conn, [lost_call(was, by=by)])
        return None
    return Cut(turn.attempt, audit.count_for_turn(conn, turn.tenant_id, turn.id, "llm_call"))


def lost_call(turn: TurnRecord, *, by: str = "watchdog") -> AuditEntry:
    """The LLM call of an attempt whose process stopped renewing its lease: it was made (and
    may be billed), but what it cost died with the process. If the process was only paused,
    its own row (``cancelled``, with what it knew) follows when it wakes."""
    return AuditEntry(tenant_id=turn.tenant_id, kind="llm_call", subject=turn.model_used or turn.model or "default",
                      ok=False, session_id=turn.session_id, turn_id=turn.id,
                      payload={"step": turn.step, "turn_attempt": turn.attempt, "error_code": "worker_lost",
                               "settled_by": by, "cost_known": False})


def bill_cuts(k: Kortex, cuts: Sequence[tuple[Ending, Cut]], wait: float = BILL_WAIT
              ) -> list[tuple[Ending, TurnRecord | None]]:
    """After the endings' commits: stop each step they cut short (``EventStore.stop``: its
    attempt's appends are refused and every step engine is told, so the step ends at once, its
    vendor call closed, and bills it), wait for those bills, then make each ending's ``done``
    say the turn's usage from its row as it is then. Every step is stopped before any is
    waited for, and the wait is one for all of them, at most ``wait``: a sweep that fails many
    turns at once waits no longer than one cancel does. A step not billed by then (the stop's
    announcement lost to a Redis blip: it stops at its next write or lease renewal) has its
    ``done`` preceded by a ``usage_pending`` notice. Returns each ending, to announce, with the
    turn's row read then (None when it could not be read)."""
    if not cuts:
        return []
    for ending, cut in cuts:
        try:
            k.events.stop(ending.turn.id, cut.attempt)
        except KortexError:  # it stops at done's close of the stream (or its lease) all the same
            log.warning("could not stop the step of turn %s", ending.turn.id, exc_info=True)
    paid = _billed_within(k, cuts, wait)
    rows: dict[str, TurnRecord] = {}
    try:
        with k.db.connect() as conn:
            for ending, _ in cuts:
                rows[ending.turn.id] = turns.get_turn(conn, ending.turn.tenant_id, ending.turn.id)
    except KortexError:  # done says what its transaction knew
        log.warning("could not read %d turns after stopping their steps", len(cuts), exc_info=True)
    return [(_with_usage(ending, rows.get(ending.turn.id), ending.turn.id in paid), rows.get(ending.turn.id))
            for ending, _ in cuts]


def _billed_within(k: Kortex, cuts: Sequence[tuple[Ending, Cut]], wait: float) -> set[str]:
    """The turns whose stopped step billed its call within ``wait`` seconds: a step writes its
    audit rows and the turn's usage in one transaction (kortex/turns/step.py ``_audit_alone``),
    so a new row means the usage is in too."""
    deadline = time.monotonic() + wait
    waiting = {ending.turn.id: (ending.turn, cut.calls) for ending, cut in cuts}
    paid: set[str] = set()
    while True:
        try:
            with k.db.connect() as conn:
                for turn_id, (turn, calls) in list(waiting.items()):
                    if audit.count_for_turn(conn, turn.tenant_id, turn_id, "llm_call") > calls:
                        paid.add(turn_id)
                        del waiting[turn_id]
        except KortexError:
            log.warning("could not wait for %d stopped steps to bill their calls", len(waiting), exc_info=True)
            return paid
        if not waiting or time.monotonic() >= deadline:
            return paid
        time.sleep(BILL_POLL)


def _with_usage(ending: Ending, turn: TurnRecord | None, paid: bool) -> Ending:
    """``ending`` with its ``done`` (its last event) saying what ``turn``'s row says it cost,
    after a ``usage_pending`` notice unless the cut call was billed and that row read."""
    done = ending.events[-1] if ending.events else None
    if not isinstance(done, DoneEvent):
        return ending
    if turn is not None:
        done = done.model_copy(update={"usage": billed(turn)})
    pending = [] if paid and turn is not None else [ErrorEvent(code="usage_pending", fatal=False, message=(
        "the model call cut short as the turn ended had not stopped yet: the usage in done may leave it "
        "out; GET /v1/turns/{id} counts it once it is billed"))]
    return replace(ending, events=[*ending.events[:-1], *pending, done])


def announce(k: Kortex, ending: Ending) -> Handoff:
    """After the commit: publish the closing events (kept in the outbox if Redis refuses
    them), remember where ``done`` is, give back a chat turn's admission slot. Returns the end
    hook's hand-on, to enqueue."""
    turn, events = ending.turn, ending.events
    done = events[-1] if events else None
    # Every way a turn ends comes through here once (its compare-and-set won), so it is counted
    # here, and a chat turn's slot is given back (the watchdog frees one this misses).
    metrics.turn_finished(turn.profile, done.status if isinstance(done, DoneEvent) else "done")
    if turn.profile == "chat":
        k.slots.give_back(turn.tenant_id, turn.id)
    try:
        ids = publish_after(k, tenant_id=turn.tenant_id, turn_id=turn.id, events=events, attempt=ending.attempt,
                            final=True)
        if ids:
            with k.db.connect() as conn:
                turns.record_done_event(conn, turn.tenant_id, turn.id, ids[-1])
    except KortexError:
        # Redis refused the events and the database the outbox, or the done's id was not
        # stored: the turn is over in the database, which is what a client is told.
        log.exception("the end of turn %s was not announced; its readers are sent one made from its row", turn.id)
    return ending.handoff


__all__ = ["BILL_WAIT", "Cut", "Ending", "announce", "bill_cuts", "cut_short", "end_turn", "lost_call",
           "settled_calls"]
