"""Request dependencies: the process's container and the calling tenant.

They are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency on the thread pool,
a hop that cost more CPU than the dependency itself (five hops a request, most of the API's
overhead in a POST burst). Only a key that is not in the cache goes to the database, on the
pool.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Generic, TypeVar

import anyio
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from kortex import logcontext
from kortex.access import Permission, require
from kortex.container import Kortex
from kortex.errors import AuthError, NotFound
from kortex.keys import Caller, TenantRecord, authenticate
from kortex.roundrobin import RoundRobin
from kortex.stream.hub import StreamHub
from kortex.turns.chat import TurnRecord

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most ``size`` items, each for ``ttl`` seconds, the least recently used going first.
    Used from the event loop and the API's thread pool."""

    def __init__(self, ttl: float, size: int = 10_000) -> None:
        self.ttl = ttl
        self.size = size
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] < time.monotonic():
                self._items.pop(key, None)
                return None
            self._items.move_to_end(key)
            return item[1]

    def pop(self, key: K) -> V | None:
        """The item, taken out (None if absent or expired)."""
        with self._lock:
            item = self._items.pop(key, None)
        return item[1] if item is not None and item[0] >= time.monotonic() else None

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = (time.monotonic() + self.ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class AuthCache(TTLCache[str, Caller]):
    """Recently verified keys, so a stream of requests costs one database lookup per key and TTL.
    Only keys that authenticated are kept (a refused key is looked up every time), so a revoked
    key, or a key of a tenant since disabled, stops working within ``ttl`` seconds (30 s by
    default; README, "Configuration"). ``generation`` moves with every ``clear`` (a revocation):
    a key verified under an older one may have been revoked since (api/revocation.py)."""

    def __init__(self, ttl: float = 30.0, size: int = 10_000) -> None:
        super().__init__(ttl, size)
        self.generation = 0

    def clear(self) -> None:
        self.generation += 1
        super().clear()


class AcceptedTurns(TTLCache[tuple[str, str], TurnRecord]):
    """Turns this process has just accepted, by (tenant, turn id), as the POST stored them: the
    client's next request opens the turn's event stream, and that request then starts at once
    instead of reading back from the database what the POST wrote (a trip to the thread pool
    and a query, 2-3 ms of the 14 ms from POST to first event, measured). The record serves
    that one request, within seconds of the POST: an unfinished turn is followed live through
    the stream hub, which reads its state afresh whenever the stream goes quiet
    (kortex/turns/follow.py). Any later request reads the turn (it may have finished, and its
    stream expired)."""

    def __init__(self, ttl: float = 10.0, size: int = 10_000) -> None:
        super().__init__(ttl, size)


class FairLane:
    """At most ``size`` pieces of blocking work at once, on threads of their own; past that,
    callers wait in a queue per key (the tenant) and a freed place goes to the next key in the
    ring, not to the oldest caller. A tenant that posts 500 turns at once queued them all in
    front of everyone else's: another tenant's one post waited 1.5 s in the fairness bench's
    flood; now it waits for at most one post of each tenant ahead of it in the ring."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._busy = 0
        self._waiting: RoundRobin[asyncio.Future[None]] = RoundRobin()  # callers, served key by key
        # What anyio runs the work on: as many threads as places, so never a wait of its own.
        self._threads = anyio.CapacityLimiter(size)

    @property
    def waiting(self) -> int:
        return sum(1 for f in self._waiting if not f.done())

    async def run(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a thread, once this caller has a place (the request's log context
        goes with it, as with ``run_in_threadpool``)."""
        await self._enter(key)
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._threads)
        finally:
            self._leave()

    async def _enter(self, key: str) -> None:
        if self._busy < self.size and not self._waiting:
            self._busy += 1
            return
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.push(key, place)
        try:
            await place  # resolved by _leave, which hands over its place (still counted busy)
        except asyncio.CancelledError:
            if place.done() and not place.cancelled():
                self._leave()  # given a place as the caller went away: pass it on
            raise

    def _leave(self) -> None:
        while self._waiting:
            place = self._waiting.pop()
            if not place.done():  # a caller that went away left a cancelled place behind
                place.set_result(None)
                return
        self._busy -= 1


class Lanes:
    """The API's blocking work, in lanes of the thread pool: turn posts (``write``) and the
    opening of event streams (``stream``) each have their own lane, below the database pool's
    size, fair across tenants (``FairLane``). Before, both queued on one limiter of 40 threads:
    a burst of 1,000 posts held every thread, mostly waiting for one of the pool's 10
    connections, and the event streams of the turns already accepted opened only after the
    last post (6-8 s later)."""

    def __init__(self, connections: int) -> None:
        size = max(2, connections - 2)
        self.write = FairLane(size)
        self.stream = FairLane(size)


def remember(request: Request, tenant_id: str, turn: TurnRecord) -> None:
    """Keep a turn this request has just created for its event stream's request (AcceptedTurns)."""
    if not turn.finished:
        accepted: AcceptedTurns = request.app.state.accepted_turns
        accepted.put((tenant_id, turn.id), turn)


async def kortex(request: Request) -> Kortex:
    return request.app.state.kortex  # type: ignore[no-any-return]


async def hub(request: Request) -> StreamHub:
    return request.app.state.hub  # type: ignore[no-any-return]


#: the OpenAPI security scheme (Swagger's "Authorize" sends it); parsing stays ours, so a
#: missing or malformed header is the same 401 as a wrong key
bearer = HTTPBearer(auto_error=False, bearerFormat="kx_<key id>_<secret>", scheme_name="api_key",
                    description="An API key: `Authorization: Bearer kx_...` (kortex admin create-key, POST /v1/keys)")


async def current_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> Caller:
    caller: Caller | None = getattr(request.state, "verified", None)
    if caller is None:  # else verified before the body was read (api/main.py AuthFirst): no second lookup
        caller = await verify(request, credentials.credentials if credentials is not None else "")
    # Only here, behind ``allowed``, does the request get a caller: a route without a
    # permission check finds none (current_tenant) and answers 401, whoever is calling.
    request.state.caller = caller
    return caller


async def verify(request: Request, key: str) -> Caller:
    """The caller whose API key is ``key`` (AuthError if none), kept on the request's state as
    ``verified`` with the ``AuthCache`` generation it was verified under (api/revocation.py)."""
    key = key.strip()
    if not key:
        raise AuthError("send 'Authorization: Bearer <api key>'")
    cache: AuthCache = request.app.state.auth_cache
    # Read first: a key verified while a revocation clears the cache counts as verified before it.
    generation = cache.generation
    digest = hashlib.sha256(key.encode()).hexdigest()
    caller = cache.get(digest)
    if caller is None:
        caller = await run_in_threadpool(authenticate, request.app.state.kortex, key)
        cache.put(digest, caller)
    request.state.verified = caller
    request.state.auth_generation = generation
    logcontext.bind(tenant_id=caller.tenant.id)  # the rest of this request's records name its tenant
    return caller


def allowed(permission: Permission) -> Callable[..., Coroutine[Any, Any, None]]:
    """A router dependency: the caller's key must carry ``permission`` (403 otherwise)."""

    async def check(caller: Annotated[Caller, Depends(current_caller)]) -> None:
        require(caller.role, permission)

    return check


async def authenticated_caller(request: Request) -> Caller:
    """The caller a router's ``allowed`` dependency authenticated (401 outside such a router)."""
    caller: Caller | None = getattr(request.state, "caller", None)
    if caller is None:
        raise AuthError("send 'Authorization: Bearer <api key>'")
    return caller


async def current_tenant(request: Request) -> TenantRecord:
    """The tenant of the caller a router's ``allowed`` dependency authenticated. A route
    outside such a router has no caller, and gets a 401 rather than an open door."""
    caller: Caller | None = getattr(request.state, "caller", None)
    if caller is None:
        raise AuthError("send 'Authorization: Bearer <api key>'")
    return caller.tenant


def object_id(value: str, what: str) -> str:
    """Path ids are UUIDs; anything else cannot exist, so it is a 404 like an unknown id."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise NotFound(f"{what} not found") from None


KortexDep = Annotated[Kortex, Depends(kortex)]
TenantDep = Annotated[TenantRecord, Depends(current_tenant)]
CallerDep = Annotated[Caller, Depends(authenticated_caller)]
HubDep = Annotated[StreamHub, Depends(hub)]
