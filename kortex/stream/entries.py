"""Stream entry ids and entries as read back from Redis."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_MAX = 2**64 - 1  # Redis rejects larger parts, and one bad id would break a shared XREAD

START = "0-0"


def parse_id(entry_id: str) -> tuple[int, int]:
    match = _ID.match(entry_id)
    if not match:
        raise ValueError(f"not a stream entry id: {entry_id!r}")
    ms, seq = int(match.group(1)), int(match.group(2))
    if ms > _MAX or seq > _MAX:
        raise ValueError(f"stream entry id out of range: {entry_id!r}")
    return ms, seq


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
