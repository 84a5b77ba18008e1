"""Whether this process can serve: each backing service answers, and the database's schema is
the one this code was written for (a process on an unmigrated database would fail every
request). What failed is named, never with a URL or a secret."""

from __future__ import annotations

from kortex.container import Kortex
from kortex.storage.migrate import schema_state, upgrade


def readiness(k: Kortex) -> dict[str, str]:
    """``{"database": "ok", "schema": "ok", "redis": "ok"}`` or what failed in each."""
    checks: dict[str, str] = {}
    try:
        with k.db.connect() as conn:
            checks["database"] = "ok"
            problem = schema_state(conn).problem()
        checks["schema"] = f"failed: {problem}" if problem else "ok"
    except Exception as exc:  # any failure means not ready; say which
        checks.setdefault("database", f"failed: {exc.__class__.__name__}")
        checks["schema"] = "unknown: the database did not answer" if checks["database"] != "ok" \
            else f"failed: {exc.__class__.__name__}"
    try:
        k.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"failed: {exc.__class__.__name__}"
    return checks


def prepare_embedded(database_url: str) -> None:
    """Bring the embedded database to this code's schema at start-up: one process owns its
    SQLite file, so there is no separate migration step to run first."""
    upgrade(database_url)


__all__ = ["prepare_embedded", "readiness"]
