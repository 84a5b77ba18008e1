"""Keys revoked anywhere stop working in this API process: the keys it verified are forgotten,
and the event streams they opened end.

kortex/keys.py bumps a counter in Redis whenever a key is revoked or a tenant disabled (the
embedded mode reads the database instead: ``revocation_epoch``). Each API process reads it about
once a second; when it moves, the process forgets every key it had verified (``AuthCache``,
whose generation moves with it). A key is checked when a request comes
in, but an event stream stays open as long as its turn runs, and a post-mortem job's feed for up
to an hour: so every open stream whose key was last known good under an older generation has
its key checked again (one query for all of them), and the streams of a key that no longer
authenticates end. A stream ends the way a finished one does; the client's reconnection is
refused with 401.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.deps import AuthCache
from kortex.container import Kortex
from kortex.errors import StreamError
from kortex.keys import Caller, revocation_epoch, valid_key_ids
from kortex.stream.hub import Subscription

log = logging.getLogger(__name__)

REVOKED = "the API key that opened this stream no longer authenticates"
SHUTTING_DOWN = "this API process is shutting down; reconnect with Last-Event-ID"


class StreamGate:
    """One open event stream, by the key that opened it. ``checked``: the ``AuthCache``
    generation under which that key was last known good; ``ended`` once it is not (``reason``
    says so), or once the process stops."""

    __slots__ = ("_streams", "_subscription", "checked", "ended", "key_id", "reason")

    def __init__(self, streams: OpenStreams, key_id: str, checked: int) -> None:
        self._streams = streams
        self._subscription: Subscription | None = None
        self.key_id = key_id
        self.checked = checked
        self.ended = False
        self.reason = REVOKED

    def watch(self, subscription: Subscription) -> None:
        """End ``subscription`` (the stream's live reader) with the gate: a waiting reader wakes
        at once rather than at its next event or keepalive."""
        self._subscription = subscription
        if self.ended:
            subscription.end(self.reason)

    def end(self, reason: str = REVOKED) -> None:
        self.ended, self.reason = True, reason
        if self._subscription is not None:
            self._subscription.end(reason)

    def close(self) -> None:
        self._streams.discard(self)


class OpenStreams:
    """The event streams this process is serving. Used from the event loop only."""

    def __init__(self) -> None:
        self._gates: set[StreamGate] = set()
        self.closing = False

    def __len__(self) -> int:
        return len(self._gates)

    def open(self, key_id: str, checked: int) -> StreamGate:
        if self.closing:  # 503: the client opens it again elsewhere, or here once restarted
            raise StreamError(SHUTTING_DOWN, code="shutting_down")
        gate = StreamGate(self, key_id, checked)
        self._gates.add(gate)
        return gate

    def discard(self, gate: StreamGate) -> None:
        self._gates.discard(gate)

    def end_all(self, reason: str = SHUTTING_DOWN) -> int:
        """End every open stream, and open no more: the process is stopping. A streaming
        response kept the server's graceful stop waiting its whole timeout, after which it cut
        each client off mid-write and logged a traceback per stream; ended here, each stream
        closes like a finished one and its client resumes from its last event."""
        self.closing = True
        live = [gate for gate in self._gates if not gate.ended]
        for gate in live:
            gate.end(reason)
        if live:
            log.info("ending %d open event streams: %s", len(live), reason)
        return len(live)

    def unchecked(self, generation: int) -> list[StreamGate]:
        """The open streams whose key was last known good before ``generation``."""
        return [gate for gate in self._gates if gate.checked < generation and not gate.ended]


def open_stream(request: Request) -> StreamGate:
    """Register the event stream this request opens under the key that authenticated it (see
    ``api.deps.current_caller``); whoever serves the stream closes the gate when it ends."""
    caller: Caller = request.state.caller
    streams: OpenStreams = request.app.state.open_streams
    return streams.open(caller.key_id, request.state.auth_generation)


async def recheck(k: Kortex, cache: AuthCache, streams: OpenStreams) -> int:
    """Check the key of every open stream verified before the cache's current generation, in one
    query; end the streams of keys that no longer authenticate. Returns how many ended. When the
    database cannot answer, the streams stay unchecked and the next call tries again."""
    generation = cache.generation
    stale = streams.unchecked(generation)
    if not stale:
        return 0
    try:
        valid = await run_in_threadpool(valid_key_ids, k, {gate.key_id for gate in stale})
    except Exception:
        log.warning("could not check the keys of %d open event streams; trying again", len(stale), exc_info=True)
        return 0
    ended = 0
    for gate in stale:
        if gate.key_id in valid:
            gate.checked = max(gate.checked, generation)
        else:
            gate.end()
            ended += 1
    if ended:
        log.info("ended %d event streams: their API key was revoked or its tenant disabled", ended)
    return ended


async def watch(k: Kortex, cache: AuthCache, streams: OpenStreams, every: float = 1.0) -> None:
    """Forget verified keys when a key is revoked or a tenant disabled anywhere, and end the open
    streams of such keys: within about ``every`` seconds on every API process."""
    seen: Hashable | None = None
    while True:
        try:
            epoch = await run_in_threadpool(revocation_epoch, k)
            if seen is not None and epoch != seen:
                cache.clear()
            seen = epoch
        except Exception:  # Redis (or the embedded database) is down: keys still expire with the cache's TTL
            log.debug("could not read the key revocation epoch", exc_info=True)
        await recheck(k, cache, streams)  # also after a clear by this process (api/routes/keys.py)
        await asyncio.sleep(every)
