"""Database engines: async for the application, sync for migrations; PostgreSQL or SQLite."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kortex.errors import ConfigError, Conflict, StorageError

log = logging.getLogger(__name__)


def _normalise(url: str | URL) -> URL:
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "sqlite"):
        raise ConfigError(f"unsupported database {backend!r}: use postgresql:// or sqlite://")
    return parsed


def async_url(url: str | URL) -> URL:
    parsed = _normalise(url)
    if parsed.get_backend_name() == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    return parsed.set(drivername="sqlite+aiosqlite")


def sync_url(url: str | URL) -> URL:
    parsed = _normalise(url)
    if parsed.get_backend_name() == "postgresql":
        return parsed.set(drivername="postgresql+psycopg")
    return parsed.set(drivername="sqlite")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the in-process worker threads read while one writes; busy_timeout waits for
    # the write lock instead of failing at once.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class Database:
    """The application's handle on the database. Create one per process (and event loop)."""

    def __init__(self, url: str, *, pool_size: int = 10, echo: bool = False) -> None:
        self.url = _normalise(url)
        self.dialect = self.url.get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "postgresql":
            kwargs.update(pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False,
                          pool_recycle=1800)
        else:
            database = self.url.database
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
        self.engine: AsyncEngine = create_async_engine(async_url(self.url), **kwargs)
        if self.dialect == "sqlite":
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A connection inside one transaction, committed on success, rolled back on error."""
        try:
            async with self.engine.begin() as conn:
                yield conn
        except IntegrityError as exc:
            # Unique constraints carry our idempotency rules; callers catch Conflict.
            raise Conflict("a row with this key already exists", code="integrity") from exc
        except SQLAlchemyError as exc:
            raise StorageError(f"database error: {exc.__class__.__name__}") from exc

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads (autocommit-style: each statement sees fresh data)."""
        try:
            async with self.engine.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise StorageError(f"database error: {exc.__class__.__name__}") from exc

    async def ping(self) -> None:
        from sqlalchemy import text

        async with self.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        await self.engine.dispose()
