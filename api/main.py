"""The FastAPI application factory: ``uvicorn --factory api.main:create_app``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.security.utils import get_authorization_scheme_param
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from starlette.concurrency import run_in_threadpool

from api import errors, openapi, revocation, stopping
from api.deps import AcceptedTurns, AuthCache, Lanes, verify
from api.revocation import OpenStreams
from api.routes import health, ingest, keys, llm, metrics, postmortems, proposals, sessions, tools, turns
from api.sse import StreamSlots
from kortex import events, heap, logcontext, logsafe, switching, tracing
from kortex.config import Settings, load_settings
from kortex.container import Kortex, redis_factory
from kortex.errors import KortexError
from kortex.health import prepare_embedded
from kortex.stream.hub import StreamHub
from kortex.turns.handoff import Handoff

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024


class BodyLimit:
    """Reject request bodies over ``limit`` bytes with 413, declared or streamed (pure ASGI, so
    streaming responses pass through untouched)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._reject(scope, receive, send)
            return
        seen = 0

        async def limited() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return message  # type: ignore[no-any-return]

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        response = errors.error_response(413, "too_large", f"request body is larger than {self.limit} bytes")
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


#: what a JSON body holds when a string of it may carry a lone surrogate: a \uD800-\uDFFF
#: escape, or such a code point's own bytes (Python's JSON decoder reads bytes with
#: "surrogatepass"). Most bodies hold neither, and are never parsed here.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


class UnicodeBody:
    """Refuse a JSON body with a string (a value or a key) that is not valid Unicode, a lone
    surrogate such as ``"\\ud800"``, with a 422 naming where it is. Python's JSON decoder accepts
    one, and pydantic lets it through a plain ``str`` field: no database can store it (psycopg
    cannot encode it to UTF-8) and no response can echo it, so it failed as a 500 at the first
    write or serialisation (a proposal's ``note``, a post-mortem filter's ``product``). Checked
    here, for every route at once, as part of reading the body: like malformed JSON, it is never
    a route's own validation. Inside ``AuthFirst``: a stranger is told only to authenticate."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE"):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                await self.app(scope, _replay(message, receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        where = _lone_surrogate(body) if _SURROGATE.search(body) else None
        if where is not None:
            response = errors.error_response(422, "validation", "the request is not valid", [
                {"field": where, "message": "not valid Unicode: a lone surrogate (\\ud800-\\udfff)"}])
            await response(scope, receive, send)
            return
        await self.app(scope, _replay({"type": "http.request", "body": body, "more_body": False}, receive), send)


def _replay(first: dict[str, Any], receive: Any) -> Any:
    """A ``receive`` that answers ``first`` once, then the client's own."""
    pending = [first]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


def _lone_surrogate(body: bytes) -> str | None:
    """Where in ``body`` (a field path, as a 422 names fields) the first string holding a lone
    surrogate is; None when there is none, or when the body is not JSON (FastAPI says so)."""
    try:
        root = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[tuple[str, ...], Any]] = [((), root)]
    while stack:  # not recursive: a body nested almost as deeply as the decoder allows is fine
        path, value = stack.pop()
        if isinstance(value, str):
            if not _valid(value):
                return ".".join(path) or "body"
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if not _valid(key):
                    # the key as a client can read it: the response cannot carry a surrogate either
                    return ".".join((*path, key.encode("utf-16", "surrogatepass").decode("utf-16", "replace")))
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, str(n)), item) for n, item in reversed(list(enumerate(value))))
    return None


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: paths behind an API key: every route under it depends on ``api.deps.allowed`` (deny by
#: default: tests/api/test_roles.py); health, metrics and the docs lie outside
KEYED_PREFIX = "/v1/"


class AuthFirst:
    """The API key of a request under ``KEYED_PREFIX`` is checked before the route reads its
    body: FastAPI parses a JSON body before it runs any dependency, so malformed JSON answered
    422 to a caller with no key or a wrong one. The caller verified here is on the request's
    state, where ``current_caller`` takes it: still one lookup per key and cache TTL. The role
    is still the route's dependency to check (which route a path is becomes known only inside
    FastAPI's routing, which parses the body next), so a key of the tenant with the wrong role
    may still be told its body is malformed; a stranger is told nothing, not even whether the
    path exists."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _route_path(scope).startswith(KEYED_PREFIX):
            request = Request(scope)
            scheme, key = get_authorization_scheme_param(request.headers.get("authorization"))
            try:
                await verify(request, key if scheme.lower() == "bearer" else "")
            except KortexError as exc:  # answered as the route's own dependency would have been
                response = await scope["app"].exception_handlers[KortexError](request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route_path(scope: dict[str, Any]) -> str:
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path  # type: ignore[no-any-return]


_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}\Z")


class RequestIds:
    """Each request's id (the caller's ``X-Request-ID`` when it is a plain token, else a new
    one) on every log record written while serving it, and echoed in the response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        header = (b"x-request-id", request_id.encode())
        status = 0

        async def send_with_id(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message.get("status", 0))
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        with logcontext.bound(request_id=request_id), tracing.span(
                f"HTTP {scope.get('method', '')}", kind=SpanKind.SERVER,
                attributes={"http.method": scope.get("method", ""), "http.target": scope.get("path", ""),
                            "kortex.request_id": request_id}) as span:
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                if span is not None:
                    _answered(span, scope, status)


def _answered(span: Span, scope: dict[str, Any], status: int) -> None:
    """What the request's span says of the answer. Most failures never reach the middleware as
    an exception (api/errors.py answers them, a 503 for a storage outage): the status sent is
    what tells a failed request from a good one. As OpenTelemetry's HTTP conventions have it, a
    5xx fails the server's span and a 4xx (the caller's mistake) does not."""
    route = scope.get("route")
    if route is not None and getattr(route, "path", None):
        span.update_name(f"HTTP {scope.get('method', '')} {route.path}")
        span.set_attribute("http.route", route.path)
    if status:
        span.set_attribute("http.status_code", status)  # the older name, which most backends still read
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


def _setup_logging(settings: Settings) -> None:
    """uvicorn's worker processes never ran ``kortex``'s own setup: give kortex.* records a
    handler, scrub them and apply the log format (uvicorn's own loggers too)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=settings.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logsafe.install(logging.getLogger(name))
        logcontext.configure(logging.getLogger(name))


def create_app(settings: Settings | None = None, *, dispatch: Callable[[Handoff], None] | None = None,
               embedded_worker: bool | None = None) -> FastAPI:
    settings = settings or load_settings()
    _setup_logging(settings)
    tracing.setup_from(settings, "api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = None
        if settings.embedded:
            prepare_embedded(settings.effective_database_url)
        if dispatch is None:
            from workers.app import app as celery_app
            from workers.dispatch import dispatch as celery_dispatch
            from workers.dispatch import warm

            warm(celery_app)
            app.state.dispatch = lambda handoff: celery_dispatch(celery_app, handoff)
            if embedded_worker if embedded_worker is not None else settings.embedded:
                from workers.embedded import EmbeddedWorker

                worker = EmbeddedWorker(celery_app, settings=settings)
                worker.start()
        else:
            app.state.dispatch = dispatch
        k = Kortex.create(settings)
        hub = StreamHub(redis_factory(settings), shards=settings.turn.stream_readers,
                        round_ms=settings.turn.stream_round_ms, preamble=events.PREAMBLE)
        await hub.start()
        app.state.kortex = k
        app.state.hub = hub
        app.state.auth_cache = AuthCache()
        app.state.accepted_turns = AcceptedTurns()
        app.state.open_streams = OpenStreams()
        watcher = asyncio.create_task(revocation.watch(k, app.state.auth_cache, app.state.open_streams))
        # Told to stop, end the open streams first: their clients resume elsewhere (api/stopping.py)
        undo_signals = stopping.on_stop_signal(asyncio.get_running_loop(), app.state.open_streams.end_all)
        app.state.heartbeat = settings.turn.heartbeat
        app.state.stream_slots = StreamSlots(settings.turn.max_streams_per_tenant)
        app.state.lanes = Lanes(k.db.max_connections)
        if settings.settle_heap:
            heap.settle()  # started: what exists now lives as long as the process (kortex/heap.py)
        switching.apply(settings.switch_interval_ms)
        try:
            yield
        finally:
            undo_signals()
            app.state.open_streams.end_all()  # a stop without a signal (a test client, an embedder)
            watcher.cancel()
            await hub.stop()
            if worker is not None:
                worker.stop()
            await run_in_threadpool(k.close)

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's built-in OpenTelemetry hooks look the providers up in os.environ on every
        # request: 16% of the API's CPU in a POST burst (py-spy). Kortex has no tracing yet.
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(title="Kortex", version="0.1.0", lifespan=lifespan,
                  description="An LLM investigates production problems with read-only tools and answers "
                              "with evidence, streamed as Server-Sent Events.", **extra)
    errors.install(app)
    app.openapi = functools.partial(openapi.build, app)  # type: ignore[method-assign]

    app.add_middleware(UnicodeBody)  # inside AuthFirst: a stranger's body is never read
    app.add_middleware(AuthFirst)  # inside BodyLimit: a body declared too large is a 413 unread
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(RequestIds)
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(turns.router)
    app.include_router(tools.router)
    app.include_router(proposals.router)
    app.include_router(ingest.router)
    app.include_router(llm.router)
    app.include_router(keys.router)
    app.include_router(postmortems.router)
    app.include_router(metrics.router)
    return app
