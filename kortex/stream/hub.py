"""Many stream readers over a few Redis connections.

An API process may hold thousands of open SSE connections. Giving each its own blocking
``XREAD`` would cost a Redis connection apiece; the hub instead spreads the streams that have
readers over a few *shards*, each running one ``XREAD BLOCK`` over its streams and fanning
entries out to per-reader buffers.

Why it is shaped this way (2,000 open streams, measured with ``bench/sse.py``):

- **Joins are O(1).** A new reader first catches up on its own: a *joiner* task reads the
  history of every reader that joined since its last round with one pipelined ``XRANGE`` each,
  then hands the readers to their shards at the position they reached. A shard blocked in its
  read is interrupted at most once per batch of joins (``CLIENT UNBLOCK``), not once per join;
  a read in flight is never rebuilt for one newcomer.
- **Rounds are paced, and built incrementally.** Each round's XREAD names every stream of its
  shard, so its cost grows with the streams. The shard keeps that command's pieces (each
  stream's key and the id it is read after, encoded) and updates only the streams whose
  readers moved, joined or left: a round joins the pieces in C instead of walking every
  stream's readers in Python (a third of a busy API's CPU was spent there). A shard of
  ``PACE_FROM`` streams or more starts at most one round per ``round_ms`` and so reads many
  entries per round under load (adding at most ``round_ms`` of latency) instead of one round
  per entry. A join cuts the pause short; fewer streams are not paced.
- **A turn's first answer is not paced.** A reader that has seen nothing but the
  ``preamble`` (the entry types a step writes before its model answers: the turn's status,
  say) is read by the *fresh* shard, which never pauses; the first other entry hands it on to
  its own shard. Under a flood of other turns a newcomer's first events no longer wait out the
  busy shards' pause (another tenant flooding 500 paced turns: from the first XADD to the
  reader, p50 14-17 ms before, 1.5-2 ms since), while text after the first, the bulk of the
  entries, is still read in paced rounds.
- **Per entry, little work**: ids are parsed once per round and shared by every reader of the
  stream, and readers take everything buffered at once (one socket write per batch).

A reader never skips, repeats or reorders entries: it is only fed a read that started at or
before its own position, and it drops entries at or before that position.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError, ResponseError

from kortex.stream.entries import START, Entry, entries_from_raw, parse_id
from kortex.stream.untimed import untimed

log = logging.getLogger(__name__)
PACE_FROM = 16  # streams in a shard from which its rounds are paced (see the module's docstring)
READ_BOUND = 30.0  # seconds a round may take when the reader's client sets no socket timeout

Position = tuple[int, int]


class SubscriptionOverflow(Exception):
    """A reader fell too far behind; it should reconnect with its last event id."""


class SubscriptionEnded(Exception):
    """The subscription was ended from outside: its reader may no longer read the stream."""


def _raw(client: Redis) -> Redis:
    """The client, returning XREAD and XRANGE replies as Redis sent them (see entries_from_raw)."""
    setter = getattr(client, "set_response_callback", None)
    if setter is not None:
        for command in ("XREAD", "XRANGE"):
            setter(command, _as_sent)
    return client


def _as_sent(response: Any, **options: Any) -> Any:
    return response


def _bulk(text: str) -> bytes:
    """One argument of a command in the Redis protocol."""
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _position(entry_id: str) -> Position:
    # Ids straight from Redis are well formed: skip the validation of parse_id on the hot path.
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


class Subscription:
    """One reader's view of one stream: entries after ``last_id``, in order, each once."""

    def __init__(self, hub: StreamHub, key: str, last_id: str, max_backlog: int) -> None:
        self.hub = hub
        self.key = key
        self.cursor: Position = parse_id(last_id)
        self.cursor_id = last_id
        self._items: deque[Entry] = deque()
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._max_backlog = max_backlog
        self._closed = False
        #: fed an entry beyond the hub's preamble (see the module's docstring)
        self.answered = False

    def _feed(self, entries: list[Entry], positions: list[Position] | None = None) -> None:
        """Queue the entries after this reader's position (``entries`` are in stream order)."""
        if self._closed or not entries:
            return
        positions = positions if positions is not None else [_position(e.id) for e in entries]
        start = 0
        if positions[0] <= self.cursor:
            while start < len(positions) and positions[start] <= self.cursor:
                start += 1
            if start == len(positions):
                return
        fresh = entries[start:] if start else entries
        self._items.extend(fresh)
        if not self.answered:
            preamble = self.hub._preamble
            self.answered = any(e.type not in preamble for e in fresh)
        self.cursor, self.cursor_id = positions[-1], entries[-1].id
        if len(self._items) > self._max_backlog:
            self._fail(SubscriptionOverflow(f"reader of {self.key} is too far behind"))
        else:
            self._wake()

    def end(self, reason: str) -> None:
        """End this subscription now: what it buffered is dropped, and its reader's wait (now or
        next) raises ``SubscriptionEnded``."""
        self._items.clear()
        self._fail(SubscriptionEnded(reason))

    def _fail(self, exc: BaseException) -> None:
        if not self._closed:
            self._closed = True
            self._error = exc
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout: float | None) -> None:
        if self._items or self._error is not None:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, waiter.cancel) if timeout is not None else None
        try:
            await waiter
        except asyncio.CancelledError:
            if timer is None or not waiter.cancelled() or asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _take(self, limit: int) -> list[Entry]:
        if self._items:
            if len(self._items) <= limit:
                out = list(self._items)
                self._items.clear()
                return out
            return [self._items.popleft() for _ in range(limit)]
        if self._error is not None:
            raise self._error
        return []

    async def get(self, timeout: float | None = None) -> Entry | None:
        """The next entry, or None when ``timeout`` passes first."""
        await self._wait(timeout)
        got = self._take(1)
        return got[0] if got else None

    async def get_many(self, timeout: float | None = None, limit: int = 1000) -> list[Entry]:
        """Every buffered entry (at most ``limit``), waiting for one at most ``timeout``; [] if none came."""
        await self._wait(timeout)
        return self._take(limit)

    def __aiter__(self) -> AsyncIterator[Entry]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Entry]:
        while True:
            entry = await self.get()
            if entry is not None:
                yield entry


class _Shard:
    """One reader connection and the streams hashed to it."""

    def __init__(self, hub: StreamHub, index: int, fresh: bool = False) -> None:
        self.hub = hub
        self.index = index
        #: reads only streams whose readers have seen nothing but the preamble, never paced; a
        #: reader moves to its own shard with its first answer (see the module's docstring)
        self.fresh = fresh
        self.subs: dict[str, set[Subscription]] = {}
        # The next round's read, kept up to date by _track: per stream, its key and the id its
        # slowest reader is at (both encoded for XREAD), and that id as a position. The three
        # share one order (keys are added and removed in all three at once), which is the
        # order XREAD names them in.
        self._keys: dict[str, bytes] = {}
        self._ids: dict[str, bytes] = {}
        self._since: dict[str, Position] = {}
        self.reader: Redis | None = None
        self.client_id: int | None = None
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.gen = 0            # bumped when readers are added
        self.read_gen = -1      # the generation the read in flight was built from
        self.reading = False
        self.unblocking = False
        self._read_bound = READ_BOUND  # seconds a round's XREAD may take in all (see _unhurried)

    @property
    def count(self) -> int:
        return sum(len(s) for s in self.subs.values())

    def add(self, subs: list[Subscription], cut_pause: bool = True) -> None:
        """Read ``subs`` from the next round on. ``cut_pause``: start that round now rather
        than after this shard's pause (a reader moved here from the fresh shard has had its
        first entries, so its next ones may wait for the round like everyone else's)."""
        for sub in subs:
            if not sub._closed:
                self.subs.setdefault(sub.key, set()).add(sub)
                self._track(sub.key)
        self.gen += 1
        if cut_pause or not self.subs.keys() - {sub.key for sub in subs}:
            self.wake.set()  # (a shard with no other stream is idle, not pausing: always woken)
        if self.reading and not self.unblocking:
            self.unblocking = True
            self.hub._spawn(self._interrupt(self.gen))

    def remove(self, sub: Subscription) -> None:
        # Not interrupted: the read in flight just names one stream too many until it returns.
        subs = self.subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subs[sub.key]
            self._track(sub.key)

    def _track(self, key: str) -> None:
        """Bring ``key``'s part of the next read up to date: read after its slowest reader's
        position, or not at all once it has no reader. Called whenever a reader of ``key`` is
        added, removed or fed."""
        subs = self.subs.get(key)
        if not subs:
            if self._keys.pop(key, None) is not None:
                del self._ids[key], self._since[key]
            return
        first = next(iter(subs)) if len(subs) == 1 else min(subs, key=lambda s: s.cursor)
        if self._since.get(key) != first.cursor:
            if key not in self._keys:
                self._keys[key] = _bulk(key)
            self._ids[key] = _bulk(first.cursor_id)
            self._since[key] = first.cursor

    def clear(self) -> list[Subscription]:
        """Forget every reader; returns them."""
        gone = [sub for subs in self.subs.values() for sub in subs]
        self.subs.clear()
        self._keys.clear()
        self._ids.clear()
        self._since.clear()
        return gone

    async def _interrupt(self, target: int) -> None:
        """Make sure a read built before generation ``target`` is not left blocking."""
        hub = self.hub
        # True when this interrupt ended because the read it was for is over (unblocked, or
        # rebuilt with ``target`` in it): a read built since may still miss later readers.
        done = False
        try:
            for _ in range(200):
                if self.read_gen >= target or not self.reading or not hub._running:
                    done = True
                    return
                if self.client_id is None or hub._control is None or not hub._can_unblock:
                    return
                try:
                    if await hub._control.client_unblock(self.client_id):
                        done = True
                        return
                except ResponseError:
                    hub._can_unblock = False  # no CLIENT UNBLOCK: rely on a short block instead
                    return
                except RedisError:
                    return
                await asyncio.sleep(0.002)  # the reader is between building and sending its read
        finally:
            self.unblocking = False
            # Readers added while this interrupt was in flight (their add did not start one of
            # its own) may not be in the read now in flight: interrupt that one too rather
            # than let them wait out its block. Before, this was done only after an unblock,
            # and a read rebuilt meanwhile could leave a reader handed on from the fresh shard
            # waiting up to block_ms for its second entry.
            if done and self.reading and self.read_gen < self.gen and hub._running:
                self.unblocking = True
                hub._spawn(self._interrupt(self.gen))

    def _unhurried(self, reader: Redis) -> None:
        """The reader's reads leave at once, each round bounded by ``_xread`` (kortex/stream/
        untimed.py): a turn of the loop before every round's read, and before a newcomer's
        first entry could be read, otherwise."""
        conn = getattr(reader, "connection", None)
        if isinstance(conn, AbstractConnection):
            self._read_bound = untimed(conn, READ_BOUND)

    async def _xread(self, reader: Redis, count: int, block: int) -> Any:
        """XREAD over every stream of the shard, after the positions ``_track`` keeps. redis-py
        would encode the command argument by argument on every round (in a busy API that was an
        eighth of the process's CPU): here it is joined from the kept pieces and sent as is."""
        conn = getattr(reader, "connection", None)
        if not isinstance(conn, AbstractConnection):  # not a socket client (the embedded fake)
            streams = {key: min(self.subs[key], key=lambda s: s.cursor).cursor_id for key in self._keys}
            return await reader.xread(streams, count=count, block=block)  # type: ignore[arg-type]
        command = b"".join([b"*%d\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n%s$5\r\nBLOCK\r\n%s$7\r\nSTREAMS\r\n"
                            % (6 + 2 * len(self._keys), _bulk(str(count)), _bulk(str(block))),
                            *self._keys.values(), *self._ids.values()])
        async with asyncio.timeout(max(self._read_bound, block / 1000 + 1)):
            await conn.send_packed_command(command, check_health=False)
            reply = await conn.read_response()
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _hand_on(self, fed: list[Subscription]) -> None:
        """Readers of the fresh shard that got their first answer go to their own shards, at
        the position they reached (nothing skipped or repeated: the next read of their stream
        starts there)."""
        moving: dict[int, list[Subscription]] = {}
        for sub in fed:
            self.remove(sub)
            if not sub._closed:
                moving.setdefault(self.hub._shard(sub.key).index, []).append(sub)
        for index, subs in moving.items():
            self.hub._shards[index].add(subs, cut_pause=False)

    async def _drop_reader(self) -> None:
        reader, self.reader, self.client_id = self.reader, None, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def run(self) -> None:
        hub = self.hub
        backoff = 0.05
        round_s = hub._round_ms / 1000
        while hub._running:
            try:
                if self.reader is None:
                    reader = _raw(hub._factory())
                    self.client_id = int(await reader.client_id())
                    self._unhurried(reader)
                    self.reader = reader
                if not self.subs:
                    self.wake.clear()
                    if not hub._running:
                        break
                    await self.wake.wait()
                    continue
                began = time.monotonic()
                self.read_gen = self.gen
                since = self._since.copy()  # where this read starts, stream by stream
                block = hub._block_ms if hub._can_unblock else min(hub._block_ms, 100)
                self.reading = True
                try:
                    reply: Any = await self._xread(self.reader, hub._count, block)
                finally:
                    self.reading = False
                backoff = 0.05
                batches = reply.items() if isinstance(reply, dict) else (reply or [])
                fed: list[Subscription] = []
                for raw_key, raw in batches:
                    key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
                    readers = self.subs.get(key)
                    if not readers or not raw:
                        continue
                    entries = entries_from_raw(raw)
                    positions = [_position(e.id) for e in entries]
                    start = since.get(key)
                    for sub in list(readers):
                        # A reader placed behind where this read started (it joined while the
                        # read was in flight) would jump over the entries in between: it waits
                        # for the next round, which starts from its own position.
                        if start is None or sub.cursor >= start:
                            sub._feed(entries, positions)
                            fed.append(sub)
                    self._track(key)
                if self.fresh:  # never paced
                    self._hand_on([sub for sub in fed if sub.answered])
                    continue
                rest = round_s - (time.monotonic() - began)
                if rest > 0 and reply and len(since) >= PACE_FROM:
                    # Let entries gather: fewer, fuller rounds. Only where a round is costly
                    # (it names many streams); a few streams are read at once, and a join cuts
                    # the pause short, so a new reader's first event does not wait it out.
                    self.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), rest)
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                # Redis refused the read itself (not the connection): end this shard's readers
                # rather than retry a command that will fail again for every one of them.
                log.warning("stream hub read refused (%s); ending its subscriptions", exc)
                for sub in self.clear():
                    sub._fail(ConnectionError("stream read refused; reconnect"))
            except (RedisError, OSError) as exc:
                log.warning("stream hub read failed (%s); reconnecting", exc.__class__.__name__)
                await self._drop_reader()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)


class StreamHub:
    """A few reader connections, one joiner and one control connection per process, shared by
    every subscriber."""

    def __init__(
        self,
        redis_factory: Callable[[], Redis],
        *,
        block_ms: int = 5000,
        count: int = 500,
        max_backlog: int = 50_000,
        shards: int = 2,
        round_ms: int = 20,
        join_batch: int = 500,
        preamble: frozenset[str] = frozenset(),
    ) -> None:
        self._factory = redis_factory
        self._preamble = preamble
        self._block_ms = block_ms
        self._count = count
        self._max_backlog = max_backlog
        self._round_ms = round_ms
        self._join_batch = join_batch
        self._shards = [_Shard(self, n) for n in range(max(1, shards))]
        self._fresh = _Shard(self, len(self._shards), fresh=True)
        self._joining: deque[Subscription] = deque()
        self._catching_up = 0
        self._join_wake = asyncio.Event()
        self._control: Redis | None = None
        self._joiner: asyncio.Task[None] | None = None
        self._running = False
        self._can_unblock = True
        self._background: set[asyncio.Task[None]] = set()  # keeps fire-and-forget tasks alive

    @property
    def subscriber_count(self) -> int:
        return sum(s.count for s in self._readers()) + len(self._joining) + self._catching_up

    def _readers(self) -> list[_Shard]:
        return [*self._shards, self._fresh]

    def _shard(self, key: str) -> _Shard:
        return self._shards[zlib.crc32(key.encode()) % len(self._shards)]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._control = _raw(self._factory())
        self._joiner = asyncio.create_task(self._join_loop(), name="kortex-stream-hub-joiner")
        for shard in self._readers():
            shard.task = asyncio.create_task(shard.run(), name=f"kortex-stream-hub-{shard.index}")

    async def stop(self) -> None:
        self._running = False
        self._join_wake.set()
        tasks = [t for t in [self._joiner, *(s.task for s in self._readers())] if t is not None]
        for shard in self._readers():
            shard.wake.set()  # wakes a reader idling for subscribers: it sees _running and ends
        for task in tasks:
            # A client library can swallow the cancellation of a command in flight (fakeredis
            # does, in client_id): the wake-ups above and the _running checks end the tasks
            # anyway, and shutdown never waits on them for more than a few seconds.
            task.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=5)
            if pending:
                log.warning("stream hub tasks did not stop; leaving them")
            for task in done:
                if not task.cancelled():
                    with contextlib.suppress(Exception):
                        task.result()
        stopped = ConnectionError("stream hub stopped")
        for sub in self._joining:
            sub._fail(stopped)
        self._joining.clear()
        for shard in self._readers():
            for sub in shard.clear():
                sub._fail(stopped)
            await shard._drop_reader()
        if self._control is not None:
            with contextlib.suppress(Exception):
                await self._control.aclose()

    @contextlib.asynccontextmanager
    async def subscribe(self, key: str, last_id: str = START) -> AsyncIterator[Subscription]:
        if not self._running:
            await self.start()
        sub = Subscription(self, key, last_id, self._max_backlog)
        self._joining.append(sub)
        self._join_wake.set()
        try:
            yield sub
        finally:
            sub._closed = True
            self._shard(key).remove(sub)  # a reader still catching up is dropped by the joiner
            self._fresh.remove(sub)

    async def _join_loop(self) -> None:
        """Catch new readers up with their own reads, then hand them to their shards."""
        backoff = 0.05
        while self._running:
            if not self._joining:
                self._join_wake.clear()
                await self._join_wake.wait()
                continue
            batch: list[Subscription] = []
            while self._joining and len(batch) < self._join_batch:
                sub = self._joining.popleft()
                if not sub._closed:
                    batch.append(sub)
            if not batch:
                continue
            self._catching_up = len(batch)
            try:
                replies = await self._catch_up(batch)
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not isinstance(exc, RedisError | OSError):  # a bug: end these readers, keep the hub
                    log.exception("stream hub catch-up failed; ending %d subscriptions", len(batch))
                    self._catching_up = 0
                    for sub in batch:
                        sub._fail(ConnectionError("stream catch-up failed; reconnect"))
                    continue
                log.warning("stream hub catch-up failed (%s); retrying", exc.__class__.__name__)
                self._joining.extendleft(reversed(batch))  # positions are unchanged: retry as they are
                self._catching_up = 0
                with contextlib.suppress(Exception):
                    await self._control.aclose()  # type: ignore[union-attr]
                self._control = _raw(self._factory())
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self._catching_up = 0
            ready: dict[int, list[Subscription]] = {}
            fresh: list[Subscription] = []
            for sub, raw in zip(batch, replies, strict=True):
                if isinstance(raw, ResponseError):
                    sub._fail(ConnectionError(f"stream read refused ({raw}); reconnect"))
                    continue
                if isinstance(raw, BaseException):
                    self._joining.append(sub)
                    continue
                sub._feed(entries_from_raw(raw))
                if sub._closed:
                    continue
                if len(raw) >= self._count:
                    self._joining.append(sub)  # more history than one page: another round
                elif not sub.answered:
                    fresh.append(sub)  # nothing but the preamble yet: its first answer is read unpaced
                else:
                    ready.setdefault(self._shard(sub.key).index, []).append(sub)
            for index, subs in ready.items():
                self._shards[index].add(subs)
            if fresh:
                self._fresh.add(fresh)

    async def _catch_up(self, batch: list[Subscription]) -> list[Any]:
        pipe = self._control.pipeline(transaction=False)  # type: ignore[union-attr]
        for sub in batch:
            lower = "-" if sub.cursor == (0, 0) else f"({sub.cursor_id}"
            pipe.xrange(sub.key, min=lower, max="+", count=self._count)
        return await pipe.execute(raise_on_error=False)
