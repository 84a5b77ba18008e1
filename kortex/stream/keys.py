"""Redis key builders: the one place that knows how Kortex names its keys."""

from __future__ import annotations


def turn_events(prefix: str, turn_id: str) -> str:
    """The Redis Stream holding every event of one turn."""
    return f"{prefix}:turn:{turn_id}:events"


def turn_id_from_key(prefix: str, key: str) -> str:
    head = f"{prefix}:turn:"
    if not key.startswith(head) or not key.endswith(":events"):
        raise ValueError(f"not a turn stream key: {key!r}")
    return key[len(head):-len(":events")]
