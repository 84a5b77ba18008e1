"""Follow a turn's events from a resume point: what a client is sent, decided in one place.

The HTTP shell (api/sse.py) only formats what this yields. The decisions:
- a live (or not yet written) stream is followed through the process's stream hub;
- a finished turn whose Redis stream has expired is rebuilt from the database (ids 0-1, 0-2,
  ..., seq 1, 2, ... again: kortex/turns/replay.py); a client that stopped part-way through
  the live stream cannot be placed in the rebuilt one (its text is whole per step), so it gets
  the turn again from the start;
- a finished turn whose stream never got its ``done`` (the publish failed after the commit)
  gets one made from the turn's row, once the turn has been over for ``DONE_GRACE``;
- ``nothing_left``: a finished turn resumed at its end has nothing to send (HTTP 204, which
  tells EventSource to stop reconnecting).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

from kortex.container import Kortex
from kortex.events import DoneEvent, done_status
from kortex.messages import Usage
from kortex.storage.records import TurnRecord
from kortex.stream.entries import START, Entry, parse_id
from kortex.stream.hub import StreamHub, Subscription
from kortex.timeparse import utcnow
from kortex.turns.chat import get_turn
from kortex.turns.replay import replay_events

DONE_GRACE = timedelta(seconds=10)


def nothing_left(k: Kortex, turn: TurnRecord, after: str) -> bool:
    """A finished turn with no entry after ``after``: the client has it all."""
    if not turn.finished or after == START:
        return False
    if after.startswith("0-"):  # an id from a database replay
        return parse_id(after)[1] >= len(replay_events(k, turn))
    if k.events.exists(turn.id):
        return not k.events.read(turn.id, after, count=1)
    # The live stream has expired: the client had it all if it reached the recorded done.
    return turn.done_event_id is not None and parse_id(after) >= parse_id(turn.done_event_id)


def closing_done(turn: TurnRecord, cursor: str) -> Entry:
    """The ``done`` a finished turn's stream is missing, placed just after ``cursor``."""
    error = (turn.error or {}).get("code")
    usage = Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)
    event = DoneEvent(status=done_status(turn.status), usage=usage, error=error)
    ms, seq = parse_id(cursor)
    return Entry(id=f"{ms}-{seq + 1}", type="done", data=event.model_dump_json())


async def follow(k: Kortex, hub: StreamHub, turn: TurnRecord, after: str, heartbeat: float,
                 watch: Callable[[Subscription], None] | None = None) -> AsyncIterator[list[Entry] | None]:
    """Batches of entries in order, the last one ending with ``done``; None after ``heartbeat``
    seconds without any (a keepalive is due). ``turn`` was read just before the client's stream
    opened. Blocking reads run on the loop's default executor, never on the loop itself.
    ``watch`` is given the live stream's subscription once it is open, so that the caller can
    end it (``Subscription.end``: the reader's key was revoked).

    Raises the hub's ``SubscriptionOverflow`` or ``ConnectionError`` when it cannot keep up or
    Redis goes away; the client reconnects with its last id and loses nothing. Raises
    ``SubscriptionEnded`` once the subscription was ended from outside."""
    # An unfinished turn's stream is live (or not yet written): the hub waits for it, so only a
    # finished turn is checked for an expired stream (a new stream skips a Redis round trip and
    # a database read).
    if turn.finished and not await asyncio.to_thread(k.events.exists, turn.id):
        skip = parse_id(after)[1] if after.startswith("0-") else 0
        replayed = await asyncio.to_thread(replay_events, k, turn)  # a finished turn's row is final
        yield [entry for entry in replayed if parse_id(entry.id)[1] > skip]
        return
    cursor = after
    async with hub.subscribe(k.events.key(turn.id), after) as subscription:
        if watch is not None:
            watch(subscription)
        while True:
            entries = await subscription.get_many(timeout=heartbeat)
            if entries:
                cursor = entries[-1].id
                yield entries
                if any(e.type == "done" for e in entries):
                    return
                continue
            # Idle: a turn finished a while ago whose stream never got its done must not keep
            # the client waiting forever (the done is published just after the commit).
            turn = await asyncio.to_thread(get_turn, k, turn.tenant_id, turn.id)
            if turn.finished and turn.finished_at is not None and utcnow() - turn.finished_at > DONE_GRACE:
                rest = await asyncio.to_thread(k.events.read, turn.id, cursor)
                late: list[Entry] = []
                for entry in rest:
                    late.append(entry)
                    if entry.type == "done":
                        yield late
                        return
                yield [*late, closing_done(turn, late[-1].id if late else cursor)]
                return
            yield None


__all__ = ["DONE_GRACE", "TurnRecord", "closing_done", "follow", "nothing_left"]
