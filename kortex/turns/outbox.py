"""Structural events are durable before they are published.

Tool calls and results, proposals, errors and ``done`` are published from inside the
transaction of the state change they announce, after its compare-and-set has won: if Redis
takes them, nothing more is written; if it does not, they go into ``stream_outbox`` in that
same transaction, and the watchdog publishes them once Redis is back. An outage delays them;
it never loses them, and the happy path costs no extra statement.

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
from kortex.errors import KortexError, StaleAttempt, StreamError
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
        outbox.keep(conn, tenant_id=tenant_id, turn_id=turn_id, attempt=attempt, final=final,
                    events=[e.model_dump(mode="json", exclude=_STAMPS) for e in events])
        return []


def republish(k: Kortex, *, settle_s: float = 2.0, limit: int = 500) -> int:
    """Publish kept events, oldest first; stops at the first that Redis still refuses. Rows
    younger than ``settle_s`` are left to the transaction that may still be writing them."""
    with k.db.connect() as conn:
        rows = outbox.due(conn, utcnow() - timedelta(seconds=settle_s), limit)
    sent: list[int] = []
    done_ids: list[tuple[str, str, str]] = []
    for row in rows:
        try:
            ids = k.events.append(row.turn_id, _EVENTS.validate_python(row.events), attempt=row.attempt,
                                  final=row.final)
        except (StaleAttempt, StreamClosed):
            ids = []  # superseded meanwhile: dropping them is what a client would do
        except StreamError:
            log.warning("Redis still refuses kept events; %d wait", len(rows) - len(sent))
            break
        sent.append(row.id)
        if row.final and ids:
            done_ids.append((row.tenant_id, row.turn_id, ids[-1]))
    if sent:
        try:
            with k.db.begin() as conn:
                outbox.forget(conn, sent)
                for tenant_id, turn_id, entry_id in done_ids:
                    turns.record_done_event(conn, tenant_id, turn_id, entry_id)
        except KortexError:  # published but not forgotten: a later sweep's attempt is refused or harmless
            log.warning("could not clear %d published outbox rows", len(sent), exc_info=True)
    return len(sent)
