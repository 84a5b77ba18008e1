"""Announce the end of a turn, in two halves: ``end_turn`` runs its profile's end hook in the
transaction whose compare-and-set ended it; ``announce`` publishes the closing events once that
transaction has committed.

``done`` goes out only after the commit, so a client that has read it finds the turn over:
published inside the transaction, it reached clients 30-60 ms before the commit, and a client
that asked again at once was refused (409, a turn still in progress) about half the time.
If Redis refuses the events they are kept in ``stream_outbox`` for the watchdog; if the
process dies between the commit and the publish, a client following the turn is sent a
``done`` made from the turn's row (kortex/turns/follow.py, ``DONE_GRACE``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from kortex import metrics
from kortex.container import Kortex
from kortex.errors import ConfigError, KortexError
from kortex.events import DoneEvent, ToolResultEvent, _Event
from kortex.storage import turns
from kortex.storage.records import TurnRecord
from kortex.turns.handoff import NOTHING, Handoff
from kortex.turns.outbox import publish_after
from kortex.turns.profiles import TurnEnd, profile_of

log = logging.getLogger(__name__)


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


__all__ = ["Ending", "announce", "end_turn", "settled_calls"]
