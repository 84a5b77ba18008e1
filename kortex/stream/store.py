"""The per-turn event stream in Redis: fenced, sequenced appends (one Lua script, so a step
attempt that was superseded cannot write after its successor began), a TTL while active and a
shorter one after ``done``, ranged reads for replay and a blocking follow for single readers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from hashlib import sha1
from typing import Any, cast

from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, RedisError, ResponseError

from kortex.errors import StaleAttempt, StreamError
from kortex.events import _Event
from kortex.stream.entries import START, Entry, entries_from_redis
from kortex.stream.keys import step_stops, turn_events, turn_fence
from kortex.stream.untimed import untimed

log = logging.getLogger(__name__)

# KEYS: stream, fence. ARGV: attempt (0: an unfenced writer such as a tool task, which takes the
# current attempt), maxlen, ttl, final (1: close the stream), then type/body pairs.
# The body is the event's JSON without ``attempt`` and ``seq``; they are spliced in before its
# closing brace, so no JSON is parsed or re-encoded here.
# Returns {1, id...} when written, {0, fence attempt} when ``attempt`` is stale, {-1} once closed.
# ``closed`` holds the attempt that closed the stream: only a strictly later attempt (the step
# ran again because the transaction that published ``done`` never committed) opens it again.
# ``stop`` (``EventStore.stop``) refuses that attempt and earlier ones as ``closed`` does, but
# not writers outside any attempt: the stream stays open for the ``done`` that follows.
# The TTL is set when the stream is born (the fence has none yet) and again at ``done``.
_APPEND = """
local st = redis.call('HMGET', KEYS[2], 'a', 's', 'closed', 'stop')
local cur = tonumber(st[1]) or 0
local seq = tonumber(st[2]) or 0
local a = tonumber(ARGV[1])
if st[3] then
  if a <= tonumber(st[3]) then return {-1} end
  redis.call('HDEL', KEYS[2], 'closed')
end
if st[4] and a ~= 0 and a <= tonumber(st[4]) then return {-1} end
if a == 0 then a = cur elseif a < cur then return {0, cur} end
local out = {1}
for i = 5, #ARGV, 2 do
  seq = seq + 1
  local body = string.sub(ARGV[i + 1], 1, -2) .. ',"attempt":' .. a .. ',"seq":' .. seq .. '}'
  out[#out + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 't', ARGV[i], 'd', body)
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'a', a, 's', seq, 'closed', a)
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[2], 'a', a, 's', seq)
  if redis.call('TTL', KEYS[2]) < 0 then
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    redis.call('EXPIRE', KEYS[2], ARGV[3])
  end
end
return out
"""
# KEYS: fence. ARGV: attempt, ttl, the stops channel, turn id. The fence gets the stream's TTL
# if it has none (no append yet). Announced on the channel in the same call: a step that writes
# nothing (its model silent) learns of it only there, at once, not at its lease's next renewal.
_STOP = """
redis.call('HSET', KEYS[1], 'stop', ARGV[1])
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' ' .. ARGV[1])
"""
_STAMPS = {"attempt", "seq"}
# A deleted turn's fence: closed at an attempt no step reaches (the turn's row is gone, so no
# later attempt can be claimed), for longer than a step may run unaware (its lease, 60 s, and
# its time limit, 300 s, by default); a stream recreated after that has its active TTL anyway.
TOMBSTONE = 2**53
TOMBSTONE_TTL = 900
DEFAULT_TIMEOUT = 10.0  # seconds a stream write's round trip may take when the client sets none
_dumps = partial(json.dumps, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Encoded:
    """An event already in its JSON form (without ``attempt`` and ``seq``): the streamed text,
    written a few times a second by every step, skips building and dumping a model."""

    type: str
    body: str

    @staticmethod
    def text(step: int, delta: str) -> Encoded:
        # The same JSON as TextEvent(step=..., delta=...).model_dump_json(exclude=_STAMPS).
        return Encoded("text", f'{{"type":"text","step":{step:d},"delta":{_dumps(delta)}}}')


class StreamClosed(StreamError):
    """The turn's ``done`` is already in its stream: nothing may follow it."""


def _result(reply: list[Any], key: str, attempt: int) -> list[str]:
    status = int(reply[0])
    if status == 1:
        return [r.decode() if isinstance(r, bytes) else str(r) for r in reply[1:]]
    if status == 0:
        raise StaleAttempt(f"attempt {attempt} of {key} was superseded by attempt {int(reply[1])}")
    raise StreamClosed(f"{key} is closed")


#: seconds one wait for a stop message lasts (then it waits again): how often the subscription
#: finds out its connection broke when nothing else says so
STOPS_POLL = 5.0


class EventStore:
    """Appends and reads turn events. One per process, shared by its threads; ``aappend`` is
    for the streaming event loop (its client is made on that loop, on first use)."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        maxlen: int = 20_000,
        active_ttl: int = 3600,
        done_ttl: int = 3600,
        async_redis: Callable[[], AsyncRedis] | None = None,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.maxlen = maxlen
        self.active_ttl = max(1, int(active_ttl))
        self.done_ttl = max(1, int(done_ttl))
        self._script = redis.register_script(_APPEND)
        self._stop = redis.register_script(_STOP)
        self._async_factory = async_redis
        self._aredis: AsyncRedis | None = None
        self._batch: _AppendBatch | None = None
        self._quick: _AppendBatch | None = None

    def key(self, turn_id: str) -> str:
        return turn_events(self.prefix, turn_id)

    def _args(self, turn_id: str, events: Sequence[_Event | Encoded], attempt: int, final: bool
              ) -> tuple[list[str], list[Any]]:
        ttl = self.done_ttl if final else self.active_ttl  # the script sets it at birth and at done
        argv: list[Any] = [attempt, self.maxlen, ttl, 1 if final else 0]
        for event in events:
            argv.append(event.type)
            argv.append(event.body if isinstance(event, Encoded) else event.model_dump_json(exclude=_STAMPS))
        return [self.key(turn_id), turn_fence(self.prefix, turn_id)], argv

    def append(self, turn_id: str, events: Sequence[_Event | Encoded], *, attempt: int = 0,
               final: bool = False) -> list[str]:
        """Publish ``events`` in order in one round trip, as step attempt ``attempt`` (0 for
        writers outside any attempt). ``final`` closes the stream and starts the after-done
        TTL. Raises ``StaleAttempt`` when a later attempt has written, ``StreamClosed`` after
        ``done``."""
        if not events:
            return []
        keys, argv = self._args(turn_id, events, attempt, final)
        try:
            reply = self._script(keys=keys, args=argv)
        except RedisError as exc:
            raise StreamError(f"could not publish to {keys[0]}: {exc.__class__.__name__}") from exc
        return _result(reply, keys[0], attempt)

    def stop(self, turn_id: str, attempt: int) -> None:
        """Refuse every later append of step attempt ``attempt`` and earlier ones (``StreamClosed``),
        without closing the stream: writers outside any attempt still append. A cancel stops the
        step it cut short this way, and publishes ``done`` once that step has billed its call."""
        try:
            self._stop(keys=[turn_fence(self.prefix, turn_id)],
                       args=[attempt, self.active_ttl, step_stops(self.prefix), turn_id])
        except RedisError as exc:
            raise StreamError(f"could not stop {self.key(turn_id)}: {exc.__class__.__name__}") from exc

    async def stops(self) -> AsyncIterator[tuple[str, int]]:
        """The (turn id, attempt) of every ``stop``, as it happens, for as long as the caller
        iterates (on its own event loop and connection). Best effort: while Redis is away none
        come, and the subscription is made again (0.5 s, then up to 5 s apart); a step missed
        so stops at its next write (the fence) or its lease's renewal, as it did before."""
        if self._async_factory is None:
            return
        delay = 0.5
        while True:
            client = self._async_factory()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(step_stops(self.prefix))
                delay = 0.5
                while True:
                    # A wait with a timeout of its own: the client's socket timeout would end a
                    # quiet subscription as a failure, and a message sent while it was made
                    # again would be lost.
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=STOPS_POLL)
                    if message is None or message.get("type") != "message":
                        continue
                    data = message["data"]
                    turn_id, _, attempt = (data.decode() if isinstance(data, bytes) else str(data)).partition(" ")
                    if attempt.isdigit():
                        yield turn_id, int(attempt)
            except (RedisError, OSError):
                log.debug("the step stops subscription broke; subscribing again in %.1fs", delay, exc_info=True)
            except Exception:  # a bug, not Redis: still made again, for a step's stop is its cost
                log.warning("the step stops subscription failed; subscribing again in %.1fs", delay, exc_info=True)
            finally:
                with contextlib.suppress(Exception):  # already broken, or the loop is stopping
                    await cast(Any, pubsub).aclose()  # untyped in redis-py
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def aappend(self, turn_id: str, events: Sequence[_Event | Encoded], *, attempt: int = 0,
                      final: bool = False, quick: bool = False) -> list[str]:
        """``append`` without blocking the event loop it runs on. Appends made on the loop at
        about the same time go to Redis together, in one pipeline (see ``_AppendBatch``).

        ``quick``: what a client is waiting for first (a step's announcement and its first
        text) goes in a lane of its own, with its own pipeline in flight, so it never queues
        behind the streamed text of every other step of the process. Under a flood of 500
        streaming turns another tenant's first event waited about 350 ms there (measured)."""
        if not events:
            return []
        if self._batch is None or self._quick is None:
            if self._async_factory is None:
                raise StreamError("this event store has no asyncio client")
            self._aredis = self._async_factory()
            self._batch, self._quick = _AppendBatch(self._aredis), _AppendBatch(self._aredis, gather=False)
        keys, argv = self._args(turn_id, events, attempt, final)
        lane = self._quick if quick else self._batch
        return _result(await lane.submit(keys, argv), keys[0], attempt)

    async def aclose(self) -> None:
        if self._aredis is not None:
            lanes = [lane for lane in (self._batch, self._quick) if lane is not None]
            client, self._aredis, self._batch, self._quick = self._aredis, None, None, None
            for lane in lanes:
                await lane.aclose()
            await client.aclose()

    def read(self, turn_id: str, after: str = START, count: int = 1000) -> list[Entry]:
        """Entries strictly after ``after``, oldest first."""
        try:
            raw = self.redis.xrange(self.key(turn_id), min=f"({after}", max="+", count=count)
        except RedisError as exc:
            raise StreamError(f"could not read {self.key(turn_id)}: {exc.__class__.__name__}") from exc
        return entries_from_redis(cast(list[tuple[str, dict[str, str]]], raw))

    def exists(self, turn_id: str) -> bool:
        try:
            return bool(self.redis.exists(self.key(turn_id)))
        except RedisError as exc:
            raise StreamError(f"could not check {self.key(turn_id)}: {exc.__class__.__name__}") from exc

    def delete(self, turn_id: str) -> None:
        """Drop the turn's events, and leave its fence closed to every attempt for
        ``TOMBSTONE_TTL``: a step of the turn still running (cancelled, its session then
        deleted) is refused at its next write and stops, instead of streaming (and spending)
        into a stream born again."""
        fence = turn_fence(self.prefix, turn_id)
        try:
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(self.key(turn_id), fence)
                pipe.hset(fence, "closed", str(TOMBSTONE))
                pipe.expire(fence, TOMBSTONE_TTL)
                pipe.execute()
        except RedisError as exc:
            raise StreamError(f"could not delete {self.key(turn_id)}: {exc.__class__.__name__}") from exc

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




class _AppendBatch:
    """Sends the appends of every step streaming on one event loop in one pipeline per round.

    Hundreds of steps each write a few times a second; one round trip each cost a connection
    checkout, a retry wrapper and a reply parse per write (py-spy: a sixth of a busy turns
    worker). Here appends made in the same turn of the loop go together, and while a pipeline
    is in flight, new ones gather for the next (a 2 ms wait for company cost the first text
    2-3 ms in the latency bench and saved no measurable CPU under 300 paced turns). Each keeps
    its own reply: one refused or fenced append does not fail the others, and a stream's order
    is its publisher's (one write in flight per step), whichever of the store's two batches
    (its lanes: quick and bulk) carries each write.

    Each lane writes on a connection of its own, not one checked out of the client's pool per
    pipeline: redis-py's checkout probes the socket with a zero-timeout read, which gives the
    event loop away, and the send itself took another turn (kortex/stream/untimed.py). So
    every write waited two turns of the loop before it was even sent (1.3-1.6 ms of a step's
    2 ms first append with the loop idle, measured; a turn of a busy loop is 100 ms and more).
    A lane has one pipeline in flight at a time, so nothing else shares its connection.
    """

    MAX = 256  # appends per pipeline

    def __init__(self, redis: AsyncRedis, *, gather: bool = True) -> None:
        self.redis = redis
        # Wait one turn of the loop for company before the first pipeline. Not in the quick
        # lane: under load a turn of the busy loop took 100-250 ms (measured between a claim's
        # return and its first append), and few quick appends arrive together anyway.
        self.gather = gather
        self.sha = sha1(_APPEND.encode()).hexdigest()
        self._waiting: list[tuple[list[str], list[Any], asyncio.Future[list[Any]]]] = []
        self._sender: asyncio.Task[None] | None = None
        # Made now, connected by its first send (and again by the first send after a drop).
        pool = redis.connection_pool
        self._conn: AbstractConnection = pool.connection_class(**pool.connection_kwargs)
        self.timeout = untimed(self._conn, DEFAULT_TIMEOUT)  # a whole round trip's bound

    def submit(self, keys: list[str], argv: list[Any]) -> asyncio.Future[list[Any]]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((keys, argv, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send())
        return future

    async def _send(self) -> None:
        if self.gather:
            await asyncio.sleep(0)  # appends made in this turn of the loop join the first pipeline
        while self._waiting:
            batch, self._waiting = self._waiting[:self.MAX], self._waiting[self.MAX:]
            try:
                replies = await self._run(batch)
            except BaseException as exc:  # the connection failed: every append in it did
                for keys, _, future in batch:
                    if not future.done():
                        future.set_exception(_as_stream_error(exc, keys[0]))
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (keys, _, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(_as_stream_error(reply, keys[0]))
                else:
                    future.set_result(reply)

    async def _run(self, batch: list[tuple[list[str], list[Any], asyncio.Future[list[Any]]]]) -> list[Any]:
        replies = await self._pipeline(batch)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:  # a restarted Redis forgot the script: load it, then send those again
            await self.redis.script_load(_APPEND)
            again = await self._pipeline([batch[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _pipeline(self, batch: list[tuple[list[str], list[Any], asyncio.Future[list[Any]]]]) -> list[Any]:
        # EVALSHA directly: a pipeline given redis-py's Script asks SCRIPT EXISTS on every run.
        # The commands are written and their replies read as redis-py's own pipeline does, on
        # the lane's connection (see the class).
        commands = [("EVALSHA", self.sha, len(keys), *keys, *argv) for keys, argv, _ in batch]
        conn = self._conn
        try:
            async with asyncio.timeout(self.timeout):
                await conn.send_packed_command(conn.pack_commands(commands))
                replies: list[Any] = []
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:  # this append's own refusal (NOSCRIPT, a script error)
                        replies.append(exc)
                return replies
        except BaseException:
            # Cut off, timed out or cancelled with replies unread: the connection's state is
            # unknown, so it is closed, and the next pipeline connects afresh.
            await self.aclose()
            raise

    async def aclose(self) -> None:
        try:
            await self._conn.disconnect()
        except Exception:  # already broken: nothing left to close cleanly
            log.debug("closing a stream-write connection failed", exc_info=True)


def _as_stream_error(exc: BaseException, key: str) -> StreamError:
    if isinstance(exc, StreamError):
        return exc
    error = StreamError(f"could not publish to {key}: {exc.__class__.__name__}")
    error.__cause__ = exc
    return error


class StepPublisher:
    """Publishes one LLM step attempt's streamed output in order, coalescing text deltas, from
    the event loop that consumes the provider's stream, without ever blocking it.

    The first delta goes out at once (time to first token is what users feel); later ones are
    batched for ``flush_ms`` so a fast model does not cost one Redis write per token. One write
    is in flight at a time (that keeps the order); whatever arrives meanwhile goes in the next.
    A write that fails is retried with what came since, so a Redis blip delays text but loses
    none. Once the store says a later attempt has written, ``stale`` is set and nothing more is
    sent: the caller stops the step.
    """

    def __init__(self, store: EventStore, turn_id: str, step: int, attempt: int, flush_ms: int = 25,
                 *, on_stale: Callable[[], None] | None = None) -> None:
        self.store = store
        self.turn_id = turn_id
        self.step = step
        self.attempt = attempt
        self.flush_s = flush_ms / 1000.0
        self.stale = False
        self._on_stale = on_stale
        self._text: list[str] = []
        self._pending: list[_Event | Encoded] = []  # events queued behind the buffered text
        self._sent_text = False
        self._answered = False  # a write with text went out: what follows takes the bulk lane
        self._timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None

    def text(self, delta: str) -> None:
        if not delta or self.stale:
            return
        self._text.append(delta)
        if not self._sent_text or self.flush_s <= 0:
            self._sent_text = True
            self._cut_text()  # with no coalescing window, one event per delta even when batched
            self._kick()
        elif self._timer is None and (self._writer is None or self._writer.done()):
            self._timer = asyncio.get_running_loop().call_later(self.flush_s, self._kick)

    def emit(self, *events: _Event) -> None:
        """Queue ``events`` after the text buffered so far and start sending."""
        if self.stale:
            return
        self._cut_text()
        self._pending.extend(events)
        self._kick()

    def _cut_text(self) -> None:
        if self._text:
            self._pending.append(Encoded.text(self.step, "".join(self._text)))
            self._text.clear()

    def _kick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self, retries: int = 0) -> None:
        delay = 0.05
        while not self.stale:
            self._cut_text()
            if not self._pending:
                return
            batch = list(self._pending)
            try:
                # Until the client has the step's first text, it is waiting on every write.
                await self.store.aappend(self.turn_id, batch, attempt=self.attempt, quick=not self._answered)
            except (StaleAttempt, StreamClosed):  # a later attempt has the turn, or it is over
                self._fence()
                return
            except StreamError:
                if retries <= 0:
                    log.warning("could not publish to turn %s; will retry", self.turn_id, exc_info=True)
                    return  # the buffer is kept: the next kick or flush() sends it
                retries -= 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            del self._pending[:len(batch)]
            if not self._answered:
                self._answered = any(event.type == "text" for event in batch)

    def _fence(self) -> None:
        self.stale = True
        self._text.clear()
        self._pending.clear()
        if self._on_stale is not None:
            self._on_stale()

    async def flush(self, *, retries: int = 6) -> None:
        """Send everything queued, waiting for it; raises ``StreamError`` if Redis still
        refuses after ``retries`` tries (about 4 s), ``StaleAttempt`` when fenced out."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        if self.stale:
            raise StaleAttempt(f"attempt {self.attempt} of turn {self.turn_id} was superseded")
        await self._drain(retries)
        if self.stale:
            raise StaleAttempt(f"attempt {self.attempt} of turn {self.turn_id} was superseded")
        if self._pending or self._text:
            raise StreamError(f"could not publish to turn {self.turn_id}")

    def abandon(self) -> None:
        """Stop sending (the step was cancelled and will not flush)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
