"""Many stream readers over one Redis connection.

An API process may hold thousands of open SSE connections. Giving each its own blocking
``XREAD`` would cost a Redis connection apiece; the hub instead runs one ``XREAD BLOCK`` over
every stream that has readers and fans entries out to per-reader queues. When readers come
or go, the blocked read is interrupted with ``CLIENT UNBLOCK`` so the new set takes effect
at once instead of after the block timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from kortex.stream.entries import START, Entry, entries_from_redis, parse_id

log = logging.getLogger(__name__)


class SubscriptionOverflow(Exception):
    """A reader fell too far behind; it should reconnect with its last event id."""


class Subscription:
    """One reader's view of one stream: an async iterator of entries after ``last_id``."""

    def __init__(self, hub: StreamHub, key: str, last_id: str, max_backlog: int) -> None:
        self.hub = hub
        self.key = key
        self.cursor = parse_id(last_id)
        self.cursor_id = last_id
        self._queue: asyncio.Queue[Entry | BaseException] = asyncio.Queue()
        self._max_backlog = max_backlog
        self._closed = False

    def _feed(self, entries: list[Entry]) -> None:
        if self._closed:
            return
        for entry in entries:
            key = entry.key
            if key <= self.cursor:
                continue
            self.cursor, self.cursor_id = key, entry.id
            self._queue.put_nowait(entry)
        if self._queue.qsize() > self._max_backlog:
            self._fail(SubscriptionOverflow(f"reader of {self.key} is too far behind"))

    def _fail(self, exc: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(exc)

    async def get(self, timeout: float | None = None) -> Entry | None:
        """The next entry, or None when ``timeout`` passes first."""
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self) -> AsyncIterator[Entry]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Entry]:
        while True:
            entry = await self.get()
            if entry is not None:
                yield entry


class StreamHub:
    """One reader task and one control connection per process, shared by every subscriber."""

    def __init__(
        self,
        redis_factory: Callable[[], Redis],
        *,
        block_ms: int = 5000,
        count: int = 500,
        max_backlog: int = 50_000,
    ) -> None:
        self._factory = redis_factory
        self._block_ms = block_ms
        self._count = count
        self._max_backlog = max_backlog
        self._subs: dict[str, set[Subscription]] = {}
        self._gen = 0          # bumped whenever the set of subscriptions changes
        self._reader_gen = -1  # the generation the current XREAD was built from
        self._changed = asyncio.Event()
        self._reader: Redis | None = None
        self._control: Redis | None = None
        self._reader_client_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._can_unblock = True
        self._background: set[asyncio.Task[None]] = set()  # keeps fire-and-forget tasks alive

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subs.values())

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._control = self._factory()
        self._task = asyncio.create_task(self._run(), name="kortex-stream-hub")

    async def stop(self) -> None:
        self._running = False
        self._changed.set()  # wakes a reader idling for subscribers: it sees _running and ends
        if self._task is not None:
            # A client library can swallow the cancellation of a command in flight (fakeredis
            # does, in client_id): the wake-up above and the _running checks in _run end the
            # task anyway, and shutdown never waits on it for more than a few seconds.
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=5)
            if not done:
                log.warning("stream hub reader did not stop; leaving it")
            elif not self._task.cancelled():
                with contextlib.suppress(Exception):
                    self._task.result()
        for subs in self._subs.values():
            for sub in subs:
                sub._fail(ConnectionError("stream hub stopped"))
        self._subs.clear()
        for client in (self._reader, self._control):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    @contextlib.asynccontextmanager
    async def subscribe(self, key: str, last_id: str = START) -> AsyncIterator[Subscription]:
        if not self._running:
            await self.start()
        sub = Subscription(self, key, last_id, self._max_backlog)
        self._subs.setdefault(key, set()).add(sub)
        await self._membership_changed()
        try:
            yield sub
        finally:
            sub._closed = True
            subs = self._subs.get(key)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[key]
            await self._membership_changed(wait=False)

    async def _membership_changed(self, wait: bool = True) -> None:
        self._gen += 1
        self._changed.set()
        if wait:
            await self._interrupt_read(self._gen)
        else:
            task = asyncio.ensure_future(self._interrupt_read(self._gen))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _interrupt_read(self, target: int) -> None:
        """Make sure an XREAD built before generation ``target`` is not left blocking."""
        for _ in range(200):
            if self._reader_gen >= target or not self._running:
                return
            if self._reader_client_id is None or self._control is None or not self._can_unblock:
                return
            try:
                if await self._control.client_unblock(self._reader_client_id):
                    return
            except ResponseError:
                self._can_unblock = False  # server without CLIENT UNBLOCK: rely on block timeout
                return
            except RedisError:
                return
            await asyncio.sleep(0.002)  # the reader is between building and sending its XREAD

    async def _drop_reader(self) -> None:
        reader, self._reader, self._reader_client_id = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def _connect_reader(self) -> None:
        await self._drop_reader()
        reader = self._factory()
        self._reader_client_id = int(await reader.client_id())
        self._reader = reader

    async def _run(self) -> None:
        backoff = 0.05
        while self._running:
            try:
                if self._reader is None:
                    await self._connect_reader()
                if not self._subs:
                    self._changed.clear()
                    self._reader_gen = self._gen
                    if not self._running:  # stopped while connecting
                        break
                    await self._changed.wait()
                    continue
                self._reader_gen = self._gen
                starts = {key: min(subs, key=lambda s: s.cursor) for key, subs in self._subs.items() if subs}
                streams = {key: sub.cursor_id for key, sub in starts.items()}
                since = {key: sub.cursor for key, sub in starts.items()}
                block = self._block_ms if self._can_unblock else min(self._block_ms, 100)
                reply: Any = await self._reader.xread(streams, count=self._count, block=block)  # type: ignore[union-attr]
                backoff = 0.05
                batches = reply.items() if isinstance(reply, dict) else (reply or [])
                for raw_key, raw in batches:
                    key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                    entries = entries_from_redis(raw)
                    for sub in list(self._subs.get(key, ())):
                        # A reader that joined while this read was in flight, from further back
                        # than it started, would jump over the entries in between: it waits for
                        # the next read, which starts from its own cursor.
                        if sub.cursor >= since.get(key, sub.cursor):
                            sub._feed(entries)
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                # Redis refused the read itself (not the connection): drop the subscribers of this
                # round rather than retrying a command that will fail again for everyone.
                log.warning("stream hub read refused (%s); ending its subscriptions", exc)
                for subs in list(self._subs.values()):
                    for sub in list(subs):
                        sub._fail(ConnectionError("stream read refused; reconnect"))
            except (RedisError, OSError) as exc:
                log.warning("stream hub read failed (%s); reconnecting", exc.__class__.__name__)
                await self._drop_reader()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
