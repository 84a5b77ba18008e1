"""The FastAPI application factory: ``uvicorn --factory api.main:create_app``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from api import errors
from api.deps import AuthCache
from api.routes import health, sessions, turns
from kortex.config import Settings, load_settings
from kortex.container import Kortex, redis_factory
from kortex.stream.hub import StreamHub
from kortex.turns.handoff import Handoff

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024


def create_app(settings: Settings | None = None, *, dispatch: Callable[[Handoff], None] | None = None,
               embedded_worker: bool | None = None) -> FastAPI:
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from kortex.storage.migrate import upgrade

        worker = None
        if settings.embedded:
            upgrade(settings.effective_database_url)  # one process owns its SQLite file
        if dispatch is None:
            from workers.app import app as celery_app
            from workers.dispatch import dispatch as celery_dispatch

            app.state.dispatch = lambda handoff: celery_dispatch(celery_app, handoff)
            if embedded_worker if embedded_worker is not None else settings.embedded:
                from workers.embedded import EmbeddedWorker

                worker = EmbeddedWorker(celery_app, settings=settings)
                worker.start()
        else:
            app.state.dispatch = dispatch
        k = Kortex.create(settings)
        hub = StreamHub(redis_factory(settings))
        await hub.start()
        app.state.kortex = k
        app.state.hub = hub
        app.state.auth_cache = AuthCache()
        app.state.heartbeat = settings.turn.heartbeat
        try:
            yield
        finally:
            await hub.stop()
            await k.aclose()
            if worker is not None:
                worker.stop()

    app = FastAPI(title="Kortex", version="0.1.0", lifespan=lifespan,
                  description="An LLM investigates production problems with read-only tools and answers "
                              "with evidence, streamed as Server-Sent Events.")
    errors.install(app)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return errors.error_response(413, "too_large", f"request body is larger than {MAX_BODY_BYTES} bytes")
        return await call_next(request)  # type: ignore[no-any-return]

    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(turns.router)
    return app
