"""How deep JSON-like data from outside may nest: one limit, ``MAX_DEPTH``, for what a model
writes as tool arguments (kortex/turns/consume.py) and what ingest stores as telemetry attributes
(kortex/telemetry/ingest.py), and the check for it.

A size bound in bytes does not bound depth: 8 KiB of ``{"a":`` nests past a thousand levels.
Unchecked, deep data fails far from where it came in and as something else: pydantic will not
serialise past about 254 levels (a ``tool_call`` or ``tool_result`` event, so the turn failed as
``internal`` or a tool call hung until the watchdog timed it out), orjson stops at 255, and the
recursive walks (json's decoder and encoder, redaction) meet Python's recursion limit near 1,000.

32 levels: tool arguments are objects a few levels deep (the tools' input schemas are flat
fields, lists and small objects), and telemetry attributes are flat maps (OpenTelemetry's are one
level of scalars and arrays) or an envelope a few levels deep; 32 is far past both. It also
leaves over 200 levels below pydantic's limit for the envelopes such data travels in (an event,
a tool result's spans and their tags, an audit row's payload).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests containers (dicts, lists, tuples) more than ``limit`` deep: ``"x"``
    is no level, ``{}`` and ``[1]`` one, ``{"a": [1]}`` two. Level by level, not recursive, so
    it answers for any depth without a RecursionError."""
    level = [value] if isinstance(value, dict | list | tuple) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [inner for outer in level for inner in (outer.values() if isinstance(outer, dict) else outer)
                 if isinstance(inner, dict | list | tuple)]
    return False


__all__ = ["MAX_DEPTH", "deeper_than"]
