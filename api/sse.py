"""Server-Sent Events for a turn: replay from ``Last-Event-ID``, then live entries through the
process's stream hub, heartbeat comments while idle, and a Postgres replay once the Redis
stream has expired."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool

from kortex.container import Kortex
from kortex.storage.records import TurnRecord
from kortex.stream.entries import START, Entry, is_entry_id, parse_id
from kortex.stream.hub import StreamHub
from kortex.turns.chat import get_turn
from kortex.turns.replay import replay_events


def format_entry(entry: Entry) -> str:
    return f"id: {entry.id}\nevent: {entry.type}\ndata: {entry.data}\n\n"


async def turn_events(
    k: Kortex, hub: StreamHub, turn: TurnRecord, last_event_id: str | None, heartbeat: float
) -> AsyncIterator[str]:
    after = last_event_id if is_entry_id(last_event_id) else START
    yield "retry: 2000\n\n"
    if not await run_in_threadpool(k.events.exists, turn.id):
        turn = await run_in_threadpool(get_turn, k, turn.tenant_id, turn.id)
        if turn.finished:
            # The live stream has expired: rebuild it from the database (ids 0-1, 0-2, ...).
            skip = parse_id(after)[1] if after.startswith("0-") else 0
            for entry in await run_in_threadpool(replay_events, k, turn):
                if parse_id(entry.id)[1] > skip:
                    yield format_entry(entry)
            return
    async with hub.subscribe(k.events.key(turn.id), after) as subscription:
        while True:
            entry = await subscription.get(timeout=heartbeat)
            if entry is None:
                yield ": keepalive\n\n"
                continue
            yield format_entry(entry)
            if entry.type == "done":
                return
