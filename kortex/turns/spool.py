"""Where a computed tool result waits when the database cannot take it: in Redis, until a
retry of the tool task (or the watchdog) stores it. A result that was computed is never
thrown away for a timeout the model would otherwise be told about."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import datetime
from typing import Any, cast

from pydantic import TypeAdapter
from redis.exceptions import RedisError

from kortex.container import Kortex
from kortex.events import Event
from kortex.messages import ToolResult
from kortex.storage.audit import AuditEntry
from kortex.stream.keys import tool_spool

log = logging.getLogger(__name__)
_EVENTS: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
TTL = 2 * 24 * 3600  # outlives any turn's deadline, so the watchdog finds it first


@dataclasses.dataclass(frozen=True, slots=True)
class Spooled:
    result: ToolResult
    entries: list[AuditEntry]
    events: list[Any]
    #: Redis already has the result's events (published inside a transaction whose commit
    #: failed): storing it must not announce it a second time
    published: bool = False


def _entry_json(entry: AuditEntry) -> dict[str, Any]:
    data = dataclasses.asdict(entry)
    data["created_at"] = entry.created_at.isoformat()
    return data


def put(k: Kortex, invocation_id: str, result: ToolResult, entries: list[AuditEntry], events: list[Any], *,
        published: bool = False) -> bool:
    """Keep a result the database refused; False if Redis refused it too (then it is lost)."""
    body = json.dumps({"result": result.model_dump(mode="json"), "entries": [_entry_json(e) for e in entries],
                       "events": [e.model_dump(mode="json") for e in events], "published": published})
    try:
        k.redis.set(tool_spool(k.settings.redis_prefix, invocation_id), body, ex=TTL)
    except RedisError:
        log.error("tool result of %s lost: neither the database nor Redis took it", invocation_id, exc_info=True)
        return False
    return True


def get(k: Kortex, invocation_id: str) -> Spooled | None:
    try:
        raw = k.redis.get(tool_spool(k.settings.redis_prefix, invocation_id))
    except RedisError:
        log.warning("could not read the tool spool of %s", invocation_id, exc_info=True)
        return None
    if raw is None:
        return None
    data = json.loads(cast(str, raw))
    entries = [AuditEntry(**{**e, "created_at": datetime.fromisoformat(e["created_at"])}) for e in data["entries"]]
    return Spooled(ToolResult.model_validate(data["result"]), entries, _EVENTS.validate_python(data["events"]),
                   published=bool(data.get("published")))


def drop(k: Kortex, invocation_id: str) -> None:
    try:
        k.redis.delete(tool_spool(k.settings.redis_prefix, invocation_id))
    except RedisError:  # it expires on its own; a second settle of it is refused by its CAS
        log.warning("could not clear the tool spool of %s", invocation_id, exc_info=True)
