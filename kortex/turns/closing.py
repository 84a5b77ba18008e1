"""Announce the end of a finished turn: publish its closing events and remember where ``done`` is."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from kortex import metrics
from kortex.container import Kortex
from kortex.events import DoneEvent, _Event
from kortex.storage import turns
from kortex.storage.records import TurnRecord
from kortex.turns.outbox import publish_in


def publish_done(k: Kortex, conn: Connection, turn: TurnRecord, events: Sequence[_Event], *,
                 attempt: int | None = None) -> None:
    """Publish ``events`` (ending with ``done``) inside the transaction that finished the turn,
    after its compare-and-set won: durable there if Redis refuses them (kortex/turns/outbox.py).

    The done's stream id is stored on the turn so a client reconnecting after the stream
    expired can be told it already has everything. ``attempt`` defaults to the turn's (the step
    that finished it); a writer outside any attempt (the watchdog) passes 0, as its record of
    the turn may be older than the stream."""
    ids = publish_in(k, conn, tenant_id=turn.tenant_id, turn_id=turn.id, events=events,
                     attempt=turn.attempt if attempt is None else attempt, final=True)
    if ids:
        turns.record_done_event(conn, turn.tenant_id, turn.id, ids[-1])
    done = events[-1] if events else None
    # Every way a turn ends comes through here once (its compare-and-set won), so it is counted here.
    metrics.turn_finished(turn.profile, done.status if isinstance(done, DoneEvent) else "done")
