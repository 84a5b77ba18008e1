"""Server-Sent Events for a turn: the per-tenant stream slots and the SSE formatting of what
kortex/turns/follow.py decides to send (replay, live entries, a rebuilt or synthesised end)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.revocation import SHUTTING_DOWN, StreamGate
from kortex import metrics
from kortex.container import Kortex
from kortex.errors import RateLimited
from kortex.stream.entries import Entry, entry_age, resume_id
from kortex.stream.hub import StreamHub, SubscriptionEnded, SubscriptionOverflow
from kortex.turns.follow import TurnRecord, follow

log = logging.getLogger(__name__)


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

    def __init__(self, body: AsyncIterator[str], *, slots: StreamSlots, tenant_id: str, gate: StreamGate,
                 headers: dict[str, str]) -> None:
        slots.take(tenant_id)  # RateLimited (429) past the tenant's cap, before any byte is sent
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._release: Callable[[], None] = lambda: slots.give_back(tenant_id)
        self._gate = gate
        metrics.SSE_OPEN.inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            self._gate.close()
            metrics.SSE_OPEN.dec()


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


async def turn_events(
    k: Kortex, hub: StreamHub, turn: TurnRecord, last_event_id: str | None, heartbeat: float, gate: StreamGate
) -> AsyncIterator[str]:
    """The turn's events as SSE text; what to send is kortex/turns/follow.py's to decide. Ends
    when ``gate`` does (the key that opened the stream was revoked)."""
    yield "retry: 2000\n\n"
    try:
        async for batch in follow(k, hub, turn, resume_point(last_event_id), heartbeat, watch=gate.watch):
            if gate.ended:  # a replay from the database has no subscription to end
                _ending(turn.id, gate.reason)
                return
            if batch is None:
                yield ": keepalive\n\n"
            elif batch:
                # The newest event's age: delivery lag for a live stream. Older than a minute
                # it is a replay to a client catching up, not lag.
                lag = entry_age(batch[-1].id)
                if lag is not None and lag < 60:
                    metrics.STREAM_LAG.observe(lag)
                yield format_entries(batch)[0]  # everything buffered in one socket write
    except (SubscriptionOverflow, ConnectionError, SubscriptionEnded) as exc:
        # The client reconnects with its Last-Event-ID and loses nothing (or, once its key was
        # revoked, is refused).
        _ending(turn.id, str(exc))


def _ending(turn_id: str, why: str) -> None:
    # A stopping process ends every stream at once and says so in one line (api/revocation.py).
    log.log(logging.DEBUG if why == SHUTTING_DOWN else logging.INFO, "ending event stream of turn %s: %s",
            turn_id, why)
