"""Announce the end of a finished turn: publish its closing events and remember where ``done`` is."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kortex.container import Kortex
from kortex.errors import KortexError, StaleAttempt, StreamError
from kortex.events import _Event
from kortex.storage import turns
from kortex.storage.records import TurnRecord

log = logging.getLogger(__name__)


def publish_done(k: Kortex, turn: TurnRecord, events: Sequence[_Event]) -> None:
    """Publish ``events`` (ending with ``done``) after the turn's finish has committed.

    The done's stream id is stored on the turn so a client reconnecting after the stream
    expired can be told it already has everything. Losing that write only costs such a client
    a replay, so it never fails the turn.

    The turn's state is already committed, so a publish that fails is logged, not raised: the
    watchdog publishes the closing events of a finished turn whose ``done`` never made it."""
    try:
        ids = k.events.append(turn.id, events, attempt=turn.attempt, final=True)
    except StaleAttempt:  # a later attempt finished it; this one's CAS lost, so it never gets here
        return
    except StreamError:
        log.warning("could not publish the end of turn %s; the watchdog will", turn.id, exc_info=True)
        return
    if not ids:
        return
    try:
        with k.db.begin() as conn:
            turns.record_done_event(conn, turn.tenant_id, turn.id, ids[-1])
    except KortexError:
        log.warning("could not record the done event of turn %s", turn.id, exc_info=True)
