"""Throwaway PostgreSQL databases and Redis key prefixes, for tests and the bench.

Every caller that needs real services gets a database and a key prefix of its own, and leaves
nothing behind however it ends. The database is dropped ``WITH (FORCE)``: a killed worker's
connections must not keep it alive.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import redis


@contextmanager
def throwaway_database(admin_url: str, *, prefix: str = "kortex_test", options: str = "",
                       migrated: bool = False) -> Iterator[tuple[str, str]]:
    """``(url, name)`` of a new database on ``admin_url``'s server, dropped on exit.
    ``options`` are CREATE DATABASE's (a template, a locale); ``migrated`` brings it to the
    current schema first, as ``kortex migrate`` would."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}" {options}'.rstrip())
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        if migrated:
            from kortex.storage.migrate import upgrade

            upgrade(url)
        yield url, name
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_prefixed(redis_url: str, prefix: str) -> None:
    """Unlink every key that starts with ``prefix`` (in batches: a bench leaves many)."""
    client = redis.Redis.from_url(redis_url)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=2000):
            batch.append(key)
            if len(batch) >= 1000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
    finally:
        client.close()


@contextmanager
def throwaway_prefix(redis_url: str, prefix: str = "kxtest") -> Iterator[str]:
    """A key prefix of its own (``<prefix>-<random>``); every key under it is deleted on exit."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        delete_prefixed(redis_url, name)
