"""Structural events are durable before they are published.

Tool calls and results, proposals and errors are published from inside the transaction of the
state change they announce, after its compare-and-set has won: if Redis takes them, nothing
more is written; if it does not, they go into ``stream_outbox`` in that same transaction, and
the watchdog publishes them once Redis is back. An outage delays them; it never loses them,
and the happy path costs no extra statement. A turn's closing events (``done``) go out just
after its ending commits instead (``publish_after``; kortex/turns/closing.py says why).

A process that dies between the publish and the commit leaves events of an attempt that never
committed; the step runs again under a higher attempt, and clients drop the older one's events.
An event kept here may reach clients after later ones that Redis took directly; its ``seq``
is then higher than theirs, and nothing is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from pydantic import TypeAdapter
from sqlalchemy.engine import Connection

from kortex.container import Kortex
from kortex.errors import StaleAttempt, StreamError
from kortex.events import Event, _Event
from kortex.storage import outbox, turns
from kortex.stream.store import StreamClosed
from kortex.timeparse import utcnow

log = logging.getLogger(__name__)
_EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
_STAMPS = {"attempt", "seq"}


def publish_in(k: Kortex, conn: Connection, *, tenant_id: str, turn_id: str, events: Sequence[_Event],
               attempt: int = 0, final: bool = False) -> list[str]:
    """Publish ``events`` from inside the caller's transaction, or keep them in the outbox
    there. Returns their stream ids ([] when kept or refused)."""
    ids = _try_publish(k, turn_id, events, attempt, final)
    if ids is None:
        _keep(conn, tenant_id, turn_id, events, attempt, final)
        return []
    return ids


def publish_after(k: Kortex, *, tenant_id: str, turn_id: str, events: Sequence[_Event], attempt: int = 0,
                  final: bool = False) -> list[str]:
    """``publish_in`` for a state change that has committed: the outbox row, written only if
    Redis refuses the events, is a transaction of its own."""
    ids = _try_publish(k, turn_id, events, attempt, final)
    if ids is None:
        with k.db.begin() as conn:
            _keep(conn, tenant_id, turn_id, events, attempt, final)
        return []
    return ids


def _try_publish(k: Kortex, turn_id: str, events: Sequence[_Event], attempt: int, final: bool) -> list[str] | None:
    """Their stream ids; [] when they describe nothing current; None when Redis refused them."""
    if not events:
        return []
    try:
        return k.events.append(turn_id, events, attempt=attempt, final=final)
    except (StaleAttempt, StreamClosed) as exc:
        # A later attempt has the turn or it is over: these events describe nothing current.
        log.warning("events of turn %s not published: %s", turn_id, exc)
        return []
    except StreamError:
        log.warning("Redis refused events of turn %s; keeping them for the watchdog", turn_id, exc_info=True)
        return None


def _keep(conn: Connection, tenant_id: str, turn_id: str, events: Sequence[_Event], attempt: int,
          final: bool) -> None:
    outbox.keep(conn, tenant_id=tenant_id, turn_id=turn_id, attempt=attempt, final=final,
                events=[e.model_dump(mode="json", exclude=_STAMPS) for e in events])


def republish(k: Kortex, *, settle_s: float = 2.0, limit: int = 500) -> int:
    """Publish kept events, oldest first; stops at the first that Redis still refuses. Rows
    younger than ``settle_s`` are left to the transaction that may still be writing them, and
    rows a step is publishing itself (``publish_kept``) are skipped."""
    with k.db.begin() as conn:
        rows = outbox.due(conn, utcnow() - timedelta(seconds=settle_s), limit)
        sent = _publish(k, conn, rows)
        outbox.forget(conn, sent)
    return len(sent)


def publish_kept(k: Kortex, tenant_id: str, turn_id: str) -> int:
    """Publish one turn's kept events; its next step calls this when its claim saw some, before
    its own events, so a result kept during an outage reaches clients before the text that
    follows it (and before ``done`` closes the stream)."""
    with k.db.begin() as conn:
        rows = outbox.take_turn(conn, tenant_id, turn_id)
        sent = _publish(k, conn, rows)
        if len(sent) < len(rows):
            raise StreamError(f"Redis still refuses the kept events of turn {turn_id}")  # rolls back: kept
    return len(sent)


def _publish(k: Kortex, conn: Connection, rows: Sequence[outbox.OutboxRow]) -> list[int]:
    """Publish ``rows`` in order, until Redis refuses one; returns the ids of those sent."""
    sent: list[int] = []
    for row in rows:
        try:
            # Unfenced (attempt 0): a kept row was committed, so what it says is true whichever
            # attempt now runs the turn; under its own attempt a later step's claim would fence
            # it out (a tool result kept while Redis was down, republished after step 2 began).
            ids = k.events.append(row.turn_id, _EVENTS.validate_python(row.events), attempt=0, final=row.final)
        except StreamClosed:
            ids = []  # the turn is over and its client has gone: nothing may follow done
        except StreamError:
            log.warning("Redis still refuses kept events; %d wait", len(rows) - len(sent))
            break
        sent.append(row.id)
        if row.final and ids:
            turns.record_done_event(conn, row.tenant_id, row.turn_id, ids[-1])
    return sent
