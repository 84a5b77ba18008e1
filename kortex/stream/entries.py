"""Stream entry ids and entries as read back from Redis."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from kortex.errors import InvalidInput

_ID = re.compile(r"^(\d{1,20})-(\d{1,20})\Z")
_MAX = 2**64 - 1  # Redis rejects larger parts, and one bad id would break a shared XREAD
_SHAPE = re.compile(r"^\d+-\d+\Z")

START = "0-0"


def parse_id(entry_id: str) -> tuple[int, int]:
    match = _ID.match(entry_id)
    if not match:
        raise ValueError(f"not a stream entry id: {entry_id!r}")
    ms, seq = int(match.group(1)), int(match.group(2))
    if ms > _MAX or seq > _MAX:
        raise ValueError(f"stream entry id out of range: {entry_id!r}")
    return ms, seq


def entry_age(entry_id: str, *, now: float | None = None) -> float | None:
    """Seconds since Redis stamped ``entry_id`` (its milliseconds part); None for ids of a
    database replay (``0-n``) or ones that are not ids."""
    try:
        ms, _seq = parse_id(entry_id)
    except ValueError:
        return None
    if ms == 0:
        return None
    return max(0.0, (time.time() if now is None else now) - ms / 1000)


def resume_id(value: str | None, field: str = "Last-Event-ID") -> str:
    """Where a reader resumes: after ``value`` when it is an entry id, from the start when it is
    absent or not id-shaped (a proxy's or an old client's noise). An id-shaped value out of
    Redis's range is refused: Redis cannot read after it, and replaying the turn from the start
    would hand the client events it already has."""
    if not value or not _SHAPE.match(value):
        return START
    try:
        parts = parse_id(value)
    except ValueError:
        parts = (_MAX, _MAX)
    if parts == (_MAX, _MAX):  # nothing can come after the largest id
        raise InvalidInput(f"{field} is out of range: stream ids are two numbers below 2^64",
                           code="validation", details=[{"field": field, "message": "out of range"}])
    return value


def is_entry_id(value: str | None) -> bool:
    if not value:
        return False
    try:
        parse_id(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Entry:
    """One published event: its stream id, its type, and its JSON body (kept as text so the
    SSE endpoint forwards it without parsing)."""

    id: str
    type: str
    data: str

    @property
    def key(self) -> tuple[int, int]:
        return parse_id(self.id)


def entries_from_redis(raw: list[tuple[str, dict[str, str]]]) -> list[Entry]:
    return [Entry(id=eid, type=fields.get("t", ""), data=fields.get("d", "{}")) for eid, fields in raw]


def entries_from_raw(raw: list[Any]) -> list[Entry]:
    """Entries from an XRANGE/XREAD reply left unparsed by the client (fields as a flat
    ``[name, value, ...]`` list): building a dict per entry, as redis-py does, was the largest
    cost of fanning streams out. Fields other than ``t`` and ``d`` (attempt, sequence, ...) are
    skipped."""
    out = []
    for eid, fields in raw:
        if isinstance(fields, dict):
            out.append(Entry(id=eid, type=fields.get("t", ""), data=fields.get("d", "{}")))
            continue
        if len(fields) >= 4 and fields[0] == "t" and fields[2] == "d":  # the writers' order
            out.append(Entry(id=eid, type=fields[1], data=fields[3]))
            continue
        kind, data = "", "{}"
        for i in range(0, len(fields) - 1, 2):
            if fields[i] == "t":
                kind = fields[i + 1]
            elif fields[i] == "d":
                data = fields[i + 1]
        out.append(Entry(id=eid, type=kind, data=data))
    return out
