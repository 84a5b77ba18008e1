"""Announce the end of a turn: publish its closing events, remember where ``done`` is, and run
its profile's end hook, all in the transaction whose compare-and-set ended it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from kortex import metrics
from kortex.container import Kortex
from kortex.errors import ConfigError
from kortex.events import DoneEvent, _Event
from kortex.storage import turns
from kortex.storage.records import TurnRecord
from kortex.turns.handoff import NOTHING, Handoff
from kortex.turns.outbox import publish_in
from kortex.turns.profiles import TurnEnd, profile_of

log = logging.getLogger(__name__)


def publish_done(k: Kortex, conn: Connection, turn: TurnRecord, events: Sequence[_Event], *,
                 attempt: int | None = None, answer: str | None = None) -> Handoff:
    """Publish ``events`` (ending with ``done``) inside the transaction that ended the turn,
    after its compare-and-set won: durable there if Redis refuses them (kortex/turns/outbox.py).

    The done's stream id is stored on the turn so a client reconnecting after the stream
    expired can be told it already has everything. ``attempt`` defaults to the turn's (the step
    that finished it); a writer outside any attempt (the watchdog) passes 0, as its record of
    the turn may be older than the stream. ``answer`` is the final text of a turn that ended
    done. Returns what the profile's end hook hands on, to enqueue after the commit."""
    ids = publish_in(k, conn, tenant_id=turn.tenant_id, turn_id=turn.id, events=events,
                     attempt=turn.attempt if attempt is None else attempt, final=True)
    if ids:
        turns.record_done_event(conn, turn.tenant_id, turn.id, ids[-1])
    done = events[-1] if events else None
    status = done.status if isinstance(done, DoneEvent) else "done"
    # Every way a turn ends comes through here once (its compare-and-set won), so it is counted
    # here, and a chat turn's admission slot is given back (the watchdog frees one this misses).
    metrics.turn_finished(turn.profile, status)
    if turn.profile == "chat":
        k.slots.give_back(turn.tenant_id, turn.id)
    try:
        profile = profile_of(turn.profile)
    except ConfigError:  # a kind of turn this process does not know has no hook it could run
        log.warning("turn %s of unknown profile %r ended; no end hook ran", turn.id, turn.profile)
        return NOTHING
    if profile.on_end is None:
        return NOTHING
    end = TurnEnd(status=status if status in ("failed", "cancelled") else "done",
                  answer=answer if status == "done" else None,
                  error=done.error if isinstance(done, DoneEvent) else None)
    return profile.on_end(k, conn, turn, end)
