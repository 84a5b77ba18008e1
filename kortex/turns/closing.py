"""Announce the end of a finished turn: publish its closing events and remember where ``done`` is."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kortex.container import Kortex
from kortex.errors import KortexError
from kortex.events import _Event
from kortex.storage import turns
from kortex.storage.records import TurnRecord

log = logging.getLogger(__name__)


def publish_done(k: Kortex, turn: TurnRecord, events: Sequence[_Event]) -> None:
    """Publish ``events`` (ending with ``done``) after the turn's finish has committed.

    The done's stream id is stored on the turn so a client reconnecting after the stream
    expired can be told it already has everything. Losing that write only costs such a client
    a replay, so it never fails the turn."""
    ids = k.events.append(turn.id, events, final=True)
    if not ids:
        return
    try:
        with k.db.begin() as conn:
            turns.record_done_event(conn, turn.tenant_id, turn.id, ids[-1])
    except KortexError:
        log.warning("could not record the done event of turn %s", turn.id, exc_info=True)
