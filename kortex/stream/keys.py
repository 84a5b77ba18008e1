"""Redis key builders: the one place that knows how Kortex names its keys (Celery's own keys
live under ``<prefix>:celery:``, see workers/app.py)."""

from __future__ import annotations


def turn_events(prefix: str, turn_id: str) -> str:
    """The Redis Stream holding every event of one turn."""
    return f"{prefix}:turn:{turn_id}:events"


def turn_fence(prefix: str, turn_id: str) -> str:
    """A hash beside a turn's stream: the highest step attempt that wrote to it (``a``), the
    last sequence number given out (``s``) and, once ``done`` is in, ``closed`` (the attempt that
    wrote it)."""
    return f"{prefix}:turn:{turn_id}:fence"


def step_stops(prefix: str) -> str:
    """The Pub/Sub channel on which a stopped step attempt is announced (``EventStore.stop``):
    the process running it stops it at once (kortex/turns/engine.py)."""
    return f"{prefix}:stops"


def tool_spool(prefix: str, invocation_id: str) -> str:
    """A computed tool result the database could not take yet (kortex/turns/spool.py)."""
    return f"{prefix}:spool:{invocation_id}"


def turn_id_from_key(prefix: str, key: str) -> str:
    head = f"{prefix}:turn:"
    if not key.startswith(head) or not key.endswith(":events"):
        raise ValueError(f"not a turn stream key: {key!r}")
    return key[len(head):-len(":events")]


def rate_window(prefix: str, tenant_id: str, window: int) -> str:
    """The counter of a tenant's turns in one minute-long window."""
    return f"{prefix}:rate:{tenant_id}:{window}"


def active_turns(prefix: str, tenant_id: str) -> str:
    """The sorted set of a tenant's live chat turns, by admission time (kortex/turns/admission.py)."""
    return f"{prefix}:active:{tenant_id}"


def quota_window(prefix: str, tenant_id: str, name: str, window: int) -> str:
    """The counter of one of a tenant's quotas (``sessions``, ``ingest_items``, ...) in one window."""
    return f"{prefix}:quota:{tenant_id}:{name}:{window}"
