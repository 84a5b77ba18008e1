"""The per-turn event stream in Redis: capped XADD, a TTL while active and a shorter one after
``done``, ranged reads for replay and a blocking follow for single readers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

from kortex.errors import StreamError
from kortex.events import TextEvent, _Event
from kortex.stream.entries import START, Entry, entries_from_redis
from kortex.stream.keys import turn_events

log = logging.getLogger(__name__)


class EventStore:
    """Appends and reads turn events. One per process, shared by its threads."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        maxlen: int = 20_000,
        active_ttl: int = 3600,
        done_ttl: int = 3600,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.maxlen = maxlen
        self.active_ttl = max(1, int(active_ttl))
        self.done_ttl = max(1, int(done_ttl))

    def key(self, turn_id: str) -> str:
        return turn_events(self.prefix, turn_id)

    def _queue(self, pipe: Any, turn_id: str, events: Sequence[_Event], final: bool) -> tuple[str, bool]:
        key = self.key(turn_id)
        for event in events:
            pipe.xadd(key, {"t": event.type, "d": event.model_dump_json()}, maxlen=self.maxlen, approximate=True)
        # The TTL is set when a stream is born (a step starts) and when it ends: enough to
        # bound an abandoned stream without an EXPIRE on every write.
        expire = final or events[0].type == "turn"
        if expire:
            pipe.expire(key, self.done_ttl if final else self.active_ttl)
        return key, expire

    def append(self, turn_id: str, events: Sequence[_Event], *, final: bool = False) -> list[str]:
        """Publish ``events`` in order in one round trip; ``final`` starts the after-done TTL."""
        if not events:
            return []
        pipe = self.redis.pipeline(transaction=False)
        key, expire = self._queue(pipe, turn_id, events, final)
        try:
            result = pipe.execute()
        except RedisError as exc:
            raise StreamError(f"could not publish to {key}: {exc.__class__.__name__}") from exc
        return [str(r) for r in (result[:-1] if expire else result)]

    def read(self, turn_id: str, after: str = START, count: int = 1000) -> list[Entry]:
        """Entries strictly after ``after``, oldest first."""
        try:
            raw = self.redis.xrange(self.key(turn_id), min=f"({after}", max="+", count=count)
        except RedisError as exc:
            raise StreamError(f"could not read {self.key(turn_id)}: {exc.__class__.__name__}") from exc
        return entries_from_redis(raw)

    def exists(self, turn_id: str) -> bool:
        try:
            return bool(self.redis.exists(self.key(turn_id)))
        except RedisError as exc:
            raise StreamError(f"could not check {self.key(turn_id)}: {exc.__class__.__name__}") from exc

    def delete(self, turn_id: str) -> None:
        self.redis.delete(self.key(turn_id))

    def follow(self, turn_id: str, after: str = START, *, block_ms: int = 1000,
               idle_timeout: float | None = None) -> Iterator[Entry]:
        """Yield entries as they arrive until a ``done`` entry (one blocking reader per call)."""
        key = self.key(turn_id)
        last = after
        idle_since = time.monotonic()
        while True:
            try:
                reply: Any = self.redis.xread({key: last}, count=500, block=block_ms)
            except RedisError as exc:
                raise StreamError(f"could not follow {key}: {exc.__class__.__name__}") from exc
            batches = reply.items() if isinstance(reply, dict) else (reply or [])
            got = False
            for _key, raw in batches:
                for entry in entries_from_redis(raw):
                    got = True
                    last = entry.id
                    yield entry
                    if entry.type == "done":
                        return
            if got:
                idle_since = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - idle_since > idle_timeout:
                return

    def close(self) -> None:
        self.redis.close()


class StepPublisher:
    """Publishes one LLM step's streamed output in order, coalescing text deltas.

    The first delta goes out at once (time to first token is what users feel); later ones
    are batched for ``flush_ms`` so a fast model does not cost one Redis write per token.

    It is driven from the event loop that consumes the provider's stream, yet writes with the
    blocking client: that loop serves this one step only, a local XADD takes ~0.1 ms, and the
    blocking client costs less than half the CPU of the asyncio one per write.
    """

    def __init__(self, store: EventStore, turn_id: str, step: int, flush_ms: int = 25) -> None:
        self.store = store
        self.turn_id = turn_id
        self.step = step
        self.flush_s = flush_ms / 1000.0
        self._buffer: list[str] = []
        self._sent_text = False
        self._timer: asyncio.TimerHandle | None = None

    def text(self, delta: str) -> None:
        if not delta:
            return
        self._buffer.append(delta)
        if not self._sent_text or self.flush_s <= 0:
            self._sent_text = True
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.flush_s, self._timed_flush)

    def flush(self) -> None:
        self.emit()

    def _timed_flush(self) -> None:
        self._timer = None
        try:
            self.flush()
        except StreamError:  # the text stays buffered; the next write or the final flush retries
            log.warning("could not flush text of turn %s; will retry", self.turn_id, exc_info=True)

    def emit(self, *events: _Event, final: bool = False) -> None:
        """Flush buffered text, then publish ``events`` after it. The buffer is only dropped once
        Redis has it, so a failed write loses nothing."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch: list[_Event] = [TextEvent(step=self.step, delta="".join(self._buffer))] if self._buffer else []
        batch.extend(events)
        if batch:
            self.store.append(self.turn_id, batch, final=final)
        self._buffer.clear()
