"""Decoding streamed response bodies: Server-Sent Events (Anthropic, OpenAI) and NDJSON (Ollama).

Both work on raw byte chunks, split lines themselves (no per-line decoding layers) and bound
the length of a line, so a server that never sends a newline cannot exhaust memory.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kortex.errors import ProviderError

MAX_LINE = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SSEvent:
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_events(chunks: AsyncIterator[bytes], *, max_line: int = MAX_LINE) -> AsyncIterator[SSEvent]:
    """Events of a ``text/event-stream`` body (WHATWG rules: ``event:``, multi-line ``data:``,
    ``:`` comments, blank line dispatches; ``id``/``retry`` are not used by LLM APIs)."""
    pending = b""
    event = ""
    data: list[str] = []
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()
        if len(pending) > max_line:
            raise ProviderError("a streamed line is longer than the limit", code="stream_invalid")
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if data:
                    yield SSEvent(event or "message", "\n".join(data))
                event, data = "", []
                continue
            if line[0] == 58:  # ":" comment / keep-alive
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                data.append(value.decode("utf-8", "replace"))
            elif name == b"event":
                event = value.decode("utf-8", "replace")
    # An event cut off before its blank line is dropped, as the SSE rules say: a truncated body
    # must not pass for a complete one.


async def ndjson_lines(chunks: AsyncIterator[bytes], *, max_line: int = MAX_LINE) -> AsyncIterator[dict[str, Any]]:
    """Objects of a newline-delimited JSON body."""
    pending = b""
    async for chunk in chunks:
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()
        if len(pending) > max_line:
            raise ProviderError("a streamed line is longer than the limit", code="stream_invalid")
        for line in lines:
            if line.strip():
                yield _object(line)
    if pending.strip():
        yield _object(pending)


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise ProviderError("the stream sent a line that is not JSON", code="stream_invalid") from exc
    if not isinstance(value, dict):
        raise ProviderError("the stream sent JSON that is not an object", code="stream_invalid")
    return value
