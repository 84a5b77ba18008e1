"""Group log lines into templates: the message with its variable parts masked (numbers, durations,
hex and UUID ids, IP addresses), so a thousand "took 1480ms" lines read as one template with a count,
when it first and last appeared, which hosts wrote it and, around a given moment (a metric's onset),
how many came before and how many after."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kortex.telemetry.sources import LogLine
from kortex.timeparse import isoformat

_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<ip>"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:ms|s|%)?(?!\w)"), "<n>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{4,}\b", re.I), "<id>"),  # hex ids with a digit: 88f1, 4b2a9c01
)
MAX_HOSTS = 5


def template(message: str) -> str:
    for pattern, mask in _MASKS:
        message = pattern.sub(mask, message)
    return message


@dataclass
class _Group:
    example: str
    count: int = 0
    first: datetime | None = None
    last: datetime | None = None
    levels: Counter[str] = field(default_factory=Counter)
    hosts: Counter[str] = field(default_factory=Counter)
    before: int = 0


def group(lines: Sequence[LogLine], *, split_at: datetime | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The templates of ``lines``, most frequent first, at most ``limit``."""
    groups: dict[str, _Group] = {}
    for line in lines:
        shape = template(line.message)
        g = groups.setdefault(shape, _Group(example=line.message))
        g.count += 1
        g.first = line.ts if g.first is None or line.ts < g.first else g.first
        g.last = line.ts if g.last is None or line.ts > g.last else g.last
        g.levels[line.level] += 1
        if line.host:
            g.hosts[line.host] += 1
        if split_at is not None and line.ts < split_at:
            g.before += 1
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1].count, kv[0]))[:limit]
    out = []
    for shape, g in ordered:
        item: dict[str, Any] = {
            "template": shape, "example": g.example, "count": g.count,
            "first_ts": isoformat(g.first) if g.first else None, "last_ts": isoformat(g.last) if g.last else None,
            # a list, not a map by host name: a key such as "auth-2" reads as a secret to redaction
            "levels": dict(g.levels), "hosts": [{"host": h, "count": n} for h, n in g.hosts.most_common(MAX_HOSTS)],
        }
        if split_at is not None:
            item.update(before=g.before, after=g.count - g.before)
        out.append(item)
    return out


__all__ = ["group", "template"]
