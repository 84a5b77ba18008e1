"""PostgreSQL connections a process may open (the arithmetic of README "Sizing") and whether
the server has that many free: a start-up check that warns and never refuses, since the
other processes that share the server come and go."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import create_engine, pool, text

from kortex.errors import ConfigError
from kortex.storage.db import sync_url

log = logging.getLogger(__name__)

#: Seconds the check waits for the server (to connect, then for its one query): the figures are
#: advice, not worth holding up a start. libpq's connect_timeout counts whole seconds, at least 2.
PROBE_TIMEOUT = 2
#: The settings that make up one process's connections, in the order README "Sizing" adds them.
POOL_FIELDS = ("db_pool_size", "db_max_overflow", "telemetry_pool_size", "telemetry_max_overflow")

# Client backends only: max_connections does not cover autovacuum, background writers or (since
# PostgreSQL 12) WAL senders. A role without pg_read_all_stats sees another role's sessions with
# backend_type NULL but usesysid set (background processes have neither): counted as clients.
_FIGURES = text("""
    SELECT current_setting('max_connections')::int,
           current_setting('superuser_reserved_connections')::int,
           coalesce(current_setting('reserved_connections', true)::int, 0),
           (SELECT count(*) FROM pg_stat_activity
             WHERE usesysid IS NOT NULL AND coalesce(backend_type, 'client backend') = 'client backend'
               AND pid <> pg_backend_pid())
""")


class Pools(Protocol):
    """What a process's ``[pools]`` says of PostgreSQL (``kortex.config.PoolSettings``)."""

    @property
    def db_pool_size(self) -> int: ...
    @property
    def db_max_overflow(self) -> int: ...
    @property
    def telemetry_pool_size(self) -> int: ...
    @property
    def telemetry_max_overflow(self) -> int: ...


def per_process(pools: Pools) -> int:
    """The most one container opens: its main pool and its telemetry pool, each size plus
    overflow (PostgreSQL connections are kept once opened; kortex/storage/db.py)."""
    return sum(int(getattr(pools, name)) for name in POOL_FIELDS)


def worker_processes(pool_kind: str, concurrency: int) -> int:
    """Containers a ``kortex worker`` builds: one per prefork child (the parent builds none),
    one for the threads and solo pools whatever the concurrency."""
    return concurrency if pool_kind == "prefork" else 1


@dataclass(frozen=True)
class Room:
    """The server's connection figures at one moment."""

    max_connections: int
    reserved: int  # superuser_reserved_connections, plus reserved_connections (PostgreSQL 16)
    in_use: int  # client connections, not counting the one that asked

    @property
    def free(self) -> int:
        return max(0, self.max_connections - self.reserved - self.in_use)


def read_room(url: str, timeout: int = PROBE_TIMEOUT) -> Room | None:
    """The server's figures, read on a connection of its own that is closed at once; None on
    SQLite (one process, no server) or when they cannot be read within ``timeout`` seconds."""
    try:
        target = sync_url(url)
    except ConfigError:  # refused, with its own message, where the URL is first used
        return None
    if target.get_backend_name() != "postgresql":
        return None
    engine = create_engine(target, poolclass=pool.NullPool, connect_args={"connect_timeout": max(2, timeout)})
    try:
        with engine.begin() as conn:  # SET LOCAL: behind a transaction pooler a plain SET would outlive us
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {timeout * 1000}")
            row = conn.execute(_FIGURES).one()
    except Exception as exc:  # advice only: nothing here may stop a process from starting
        log.info("PostgreSQL's connection figures could not be read (%s); the connection budget is not "
                 "checked", exc.__class__.__name__)
        return None
    finally:
        engine.dispose()
    return Room(max_connections=int(row[0]), reserved=int(row[1]) + int(row[2]), in_use=int(row[3]))


def shortfall(pools: Pools, processes: int, room: Room, *, what: str, scaled_by: str | None = None) -> str | None:
    """The warning to log when ``processes`` containers of ``pools`` could take more than the
    server has free, naming the figures and what to change; None when they fit."""
    each = per_process(pools)
    total = each * processes
    if total <= room.free:
        return None
    parts = " + ".join(f"{name} {getattr(pools, name)}" for name in POOL_FIELDS)
    how = f"{processes} processes x {each}: " if processes > 1 else ""
    fewer = f" or {scaled_by}" if scaled_by else ""
    return (f"{what} may open up to {total} PostgreSQL connections ({how}[pools] {parts}), more than the "
            f"{room.free} the server has free (max_connections {room.max_connections}, {room.reserved} reserved, "
            f"{room.in_use} in use): under load its connections would fail with \"too many clients\". Lower "
            f"[pools] (KORTEX_POOLS__*){fewer}, or raise PostgreSQL's max_connections (README \"Sizing\"; "
            f"behind PgBouncer its pool size is what counts)")


def warn_if_short(url: str, pools: Pools, processes: int, *, what: str, scaled_by: str | None = None,
                  timeout: int = PROBE_TIMEOUT) -> str | None:
    """Read the server's figures once and log the shortfall as a warning; the warning, if any."""
    room = read_room(url, timeout)
    if room is None:
        return None
    message = shortfall(pools, processes, room, what=what, scaled_by=scaled_by)
    if message:
        log.warning("%s", message)
    return message


__all__ = ["POOL_FIELDS", "PROBE_TIMEOUT", "Pools", "Room", "per_process", "read_room", "shortfall",
           "warn_if_short", "worker_processes"]
