"""Server-Sent Events for a turn: replay from ``Last-Event-ID``, then live entries through the
process's stream hub, heartbeat comments while idle, and a Postgres replay once the Redis
stream has expired."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kortex.container import Kortex
from kortex.errors import RateLimited
from kortex.events import DoneEvent, done_status
from kortex.messages import Usage
from kortex.storage.records import TurnRecord
from kortex.stream.entries import START, Entry, parse_id, resume_id
from kortex.stream.hub import StreamHub, SubscriptionOverflow
from kortex.timeparse import utcnow
from kortex.turns.chat import get_turn
from kortex.turns.replay import replay_events

log = logging.getLogger(__name__)
DONE_GRACE = timedelta(seconds=10)


class StreamSlots:
    """Open event streams per tenant in this API process: one tenant's runaway client cannot
    hold every connection the process has. The event loop is single-threaded, so plain
    counters suffice."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._open: dict[str, int] = {}

    def open(self, tenant_id: str) -> int:
        return self._open.get(tenant_id, 0)

    def take(self, tenant_id: str) -> None:
        count = self._open.get(tenant_id, 0)
        if count >= self.per_tenant:
            raise RateLimited(f"this tenant already has {count} open event streams; close some and retry")
        self._open[tenant_id] = count + 1

    def give_back(self, tenant_id: str) -> None:
        count = self._open.get(tenant_id, 0) - 1
        if count > 0:
            self._open[tenant_id] = count
        else:
            self._open.pop(tenant_id, None)


class HeldStream(StreamingResponse):
    """An event stream that holds one of its tenant's slots until the response ends, however
    it ends: the client leaves, the turn finishes, or the server shuts down. (A release inside
    the body generator would leak when the client leaves before the first chunk, as a
    generator that never started runs no ``finally``.)"""

    def __init__(self, body: AsyncIterator[str], *, slots: StreamSlots, tenant_id: str,
                 headers: dict[str, str]) -> None:
        slots.take(tenant_id)  # RateLimited (429) past the tenant's cap, before any byte is sent
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._release = lambda: slots.give_back(tenant_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def format_entry(entry: Entry) -> str:
    """The one place an entry becomes SSE: its body is forwarded as stored, never re-encoded."""
    return f"id: {entry.id}\nevent: {entry.type}\ndata: {entry.data}\n\n"


def format_entries(entries: list[Entry]) -> tuple[str, bool]:
    """Entries up to and including a ``done`` as one chunk, and whether the stream ended."""
    out = []
    for entry in entries:
        out.append(format_entry(entry))
        if entry.type == "done":
            return "".join(out), True
    return "".join(out), False


def resume_point(last_event_id: str | None) -> str:
    return resume_id(last_event_id, "Last-Event-ID")


def nothing_left(k: Kortex, turn: TurnRecord, after: str) -> bool:
    """A finished turn with no entry after ``after``: the client has it all (answer 204, which
    tells EventSource to stop reconnecting)."""
    if not turn.finished or after == START:
        return False
    if after.startswith("0-"):  # an id from a database replay
        return parse_id(after)[1] >= len(replay_events(k, turn))
    if k.events.exists(turn.id):
        return not k.events.read(turn.id, after, count=1)
    # The live stream has expired: the client had it all if it reached the recorded done.
    return turn.done_event_id is not None and parse_id(after) >= parse_id(turn.done_event_id)


def _closing_done(turn: TurnRecord, cursor: str) -> Entry:
    """The ``done`` a finished turn's stream is missing (its publish failed after the commit)."""
    error = (turn.error or {}).get("code")
    usage = Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)
    event = DoneEvent(status=done_status(turn.status), usage=usage, error=error)
    ms, seq = parse_id(cursor)
    return Entry(id=f"{ms}-{seq + 1}", type="done", data=event.model_dump_json())


async def turn_events(
    k: Kortex, hub: StreamHub, turn: TurnRecord, last_event_id: str | None, heartbeat: float
) -> AsyncIterator[str]:
    after = resume_point(last_event_id)
    yield "retry: 2000\n\n"
    # ``turn`` was read just before the stream opened. An unfinished turn's stream is live (or
    # not yet written): the hub waits for it, so only a finished turn is checked for an expired
    # stream, which saves a new stream a Redis round trip, a database read and two trips to the
    # thread pool.
    if turn.finished and not await run_in_threadpool(k.events.exists, turn.id):
        # The live stream has expired: rebuild it from the database (ids 0-1, 0-2, ...). A
        # finished turn's row is final, so the one read already serves. A client that stopped
        # part-way through the live stream cannot be placed in the rebuilt one (its text is
        # whole per step), so it gets the turn again from the start; the restart shows in the
        # ids, which fall back to 0-1.
        skip = parse_id(after)[1] if after.startswith("0-") else 0
        for entry in await run_in_threadpool(replay_events, k, turn):
            if parse_id(entry.id)[1] > skip:
                yield format_entry(entry)
        return
    cursor = after
    try:
        async with hub.subscribe(k.events.key(turn.id), after) as subscription:
            while True:
                entries = await subscription.get_many(timeout=heartbeat)
                if entries:
                    # Everything buffered goes out as one chunk: one socket write, not one each.
                    chunk, finished = format_entries(entries)
                    cursor = entries[-1].id
                    yield chunk
                    if finished:
                        return
                    continue
                # Idle: a finished turn whose stream never got its done must not keep the
                # client waiting forever. The done is published just after the commit, so only
                # a turn finished a while ago counts as missing it.
                turn = await run_in_threadpool(get_turn, k, turn.tenant_id, turn.id)
                if turn.finished and turn.finished_at is not None and utcnow() - turn.finished_at > DONE_GRACE:
                    rest = await run_in_threadpool(k.events.read, turn.id, cursor)
                    for late in rest:
                        cursor = late.id
                        yield format_entry(late)
                        if late.type == "done":
                            return
                    yield format_entry(_closing_done(turn, cursor))
                    return
                yield ": keepalive\n\n"
    except (SubscriptionOverflow, ConnectionError) as exc:
        # The client reconnects with its Last-Event-ID and loses nothing.
        log.info("ending event stream of turn %s: %s", turn.id, exc)
