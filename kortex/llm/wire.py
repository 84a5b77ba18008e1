"""Decoding streamed response bodies: Server-Sent Events (Anthropic, OpenAI) and NDJSON (Ollama).

Both work on raw byte chunks and split lines themselves (no per-line decoding layers, so a
multibyte character split between chunks is whole again before it is decoded). Everything is
bounded: a line, and the data of one SSE event, so a server that never sends a newline or a
blank line cannot exhaust memory, and a long line delivered in many small pieces costs linear
time, not quadratic.

JSON goes through orjson (``loads``, ``dumps``): under half the CPU of json's for the small
frames of a stream, a tenth for a request body; what orjson refuses is handed to json, so the
same documents are accepted or refused as with json alone.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from kortex.llm.failures import failure

MAX_LINE = 4 * 1024 * 1024
MAX_EVENT = 4 * 1024 * 1024  # the data lines of one SSE event, together


@dataclass(frozen=True, slots=True)
class SSEvent:
    event: str
    data: str

    def json(self) -> Any:
        return loads(self.data)


# orjson reads an integer beyond 64 bits as a float (a 20-digit id in a model's tool arguments
# would lose digits): a document with a run of 19 digits goes to json, whatever they are part
# of. Found by mapping every digit to "0" and anything else to " " (bytes.translate, a third of
# a microsecond for a frame; a regex took longer than orjson's whole parse).
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_LONG_RUN = b"0" * 19


def loads(data: str | bytes) -> Any:
    """``json.loads``, faster and with the same results. What orjson refuses or would read
    differently (``NaN``, integers beyond 64 bits, UTF-16 bytes) is parsed by json, and what
    both refuse raises json's ValueError; so does JSON nested past json's recursion (orjson
    stops at 1,024 levels, json near Python's recursion limit, with a RecursionError that the
    decoders' ``except ValueError`` would not catch)."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if _LONG_RUN not in raw.translate(_DIGITS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


#: orjson hands what json cannot encode (datetimes, dataclasses) back, and subclasses of
#: str/int/dict/list too, so that json decides about them as it did before orjson
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``
    encoded (but a float NaN or infinity is ``null``, which a server can parse)."""
    try:
        return orjson.dumps(value, option=_PASSTHROUGH)
    except TypeError:  # orjson.JSONEncodeError: json's own error (or output) for such values
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dumps_text(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)``: a tool
    result as the model reads it, re-encoded for every request of a turn (3.4% of a turns
    worker's CPU through json, py-spy). orjson writes the same text for JSON data; what it
    would write otherwise goes through ``default`` as json's does (datetimes, dataclasses), and
    what it refuses (integers beyond 64 bits, non-string keys, lone surrogates) to json itself.
    Floats may be spelled differently (``1e16`` for ``1e+16``), the same number."""
    try:
        return orjson.dumps(value, default=str,
                            option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _too_long() -> Exception:
    return failure("stream_invalid", detail="a streamed line is longer than the limit")


class _Lines:
    """Complete lines of a byte stream, fed chunk by chunk. A partial line waits in a bytearray
    and only newly arrived bytes are searched for its end, so a long line delivered in many
    small pieces costs linear time; whole lines are cut by ``bytes.split`` (C speed)."""

    def __init__(self, max_line: int) -> None:
        self.pending = bytearray()
        self.max_line = max_line

    def feed(self, chunk: bytes) -> list[bytes]:
        pending = self.pending
        if pending:
            scan_from = len(pending)
            pending += chunk
            if pending.find(b"\n", scan_from) < 0:
                if len(pending) > self.max_line:
                    raise _too_long()
                return []
            data = bytes(pending)
            pending.clear()
        else:
            data = chunk
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest:
            if len(rest) > self.max_line:
                raise _too_long()
            pending += rest
        return lines


_BOM = b"\xef\xbb\xbf"


class _EventLines(_Lines):
    """Lines of an event stream, where CR, LF and CRLF each end a line and one leading BOM is
    dropped. Its own loop, not a wrapper around ``_Lines.feed``: on the hot path (every text
    delta) an LF-only chunk costs one ``13 in`` (a memchr; ``b"\\r" in`` is several times
    slower) more than plain splitting, and nothing per line."""

    def __init__(self, max_line: int) -> None:
        super().__init__(max_line)
        self.head: bytes | None = b""  # the first bytes while they may still be a BOM; None once decided
        self.after_cr = False  # the last chunk ended in CR: an LF starting this one completes that CRLF

    def feed(self, chunk: bytes) -> list[bytes]:
        if self.head is not None:
            chunk = self.head + chunk
            if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
                self.head = chunk  # a BOM cut between reads
                return []
            self.head = None
            if chunk.startswith(_BOM):
                chunk = chunk[len(_BOM):]
        if self.after_cr and chunk:  # an empty read says nothing about the next byte
            self.after_cr = False
            if chunk[0] == 10:
                chunk = chunk[1:]
        pending = self.pending
        if pending:  # never holds a CR: each is a line end, taken below
            scan_from = len(pending)
            pending += chunk
            if 13 not in chunk and pending.find(b"\n", scan_from) < 0:
                if len(pending) > self.max_line:
                    raise _too_long()
                return []
            data = bytes(pending)
            pending.clear()
        else:
            data = chunk
        if 13 in data:
            # bytes.splitlines breaks at exactly CR, LF and CRLF, in C; it does not say whether
            # the last line was ended, the last byte does. A CR ending the chunk ends its line
            # now (waiting for the next read could hold an event back).
            lines = data.splitlines()
            last = data[-1]
            self.after_cr = last == 13
            rest = b"" if last in (10, 13) else lines.pop()
        else:
            lines = data.split(b"\n")
            rest = lines.pop()
        if rest:
            if len(rest) > self.max_line:
                raise _too_long()
            pending += rest
        return lines


async def sse_events(chunks: AsyncIterator[bytes], *, max_line: int = MAX_LINE,
                     max_event: int = MAX_EVENT) -> AsyncGenerator[SSEvent, None]:
    """Events of a ``text/event-stream`` body (WHATWG rules: ``event:``, multi-line ``data:``,
    ``:`` comments, blank line dispatches, CR/LF/CRLF line ends, one leading BOM ignored;
    ``id``/``retry`` are not used by LLM APIs)."""
    lines = _EventLines(max_line)
    event = ""
    data: list[str] = []
    size = 0
    async for chunk in chunks:
        for line in lines.feed(chunk):
            if not line:
                if data:
                    yield SSEvent(event or "message", "\n".join(data))
                event, data, size = "", [], 0
                continue
            if line[0] == 58:  # ":" comment / keep-alive
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                size += len(value) + 1
                if size > max_event:
                    raise failure("stream_invalid", detail="a streamed event is larger than the limit")
                data.append(value.decode("utf-8", "replace"))
            elif name == b"event":
                event = value.decode("utf-8", "replace")
    # An event cut off before its blank line is dropped, as the SSE rules say: a truncated body
    # must not pass for a complete one.


async def ndjson_lines(chunks: AsyncIterator[bytes], *,
                       max_line: int = MAX_LINE) -> AsyncGenerator[dict[str, Any], None]:
    """Objects of a newline-delimited JSON body."""
    lines = _Lines(max_line)
    async for chunk in chunks:
        for line in lines.feed(chunk):
            if line.strip():
                yield _object(line)
    rest = bytes(lines.pending)
    if rest.strip():
        # A last line without its newline: whole (some servers omit the final newline) or cut
        # off mid-way, which is a truncated body (worth another try), not a malformed one.
        try:
            loads(rest)
        except ValueError as exc:
            raise failure("stream_truncated", retryable=True, detail="the body ended in the middle of a line") from exc
        yield _object(rest)


def _object(line: bytes) -> dict[str, Any]:
    try:
        value = loads(line)
    except ValueError as exc:
        raise failure("stream_invalid", detail="the stream sent a line that is not JSON") from exc
    if not isinstance(value, dict):
        raise failure("stream_invalid", detail="the stream sent JSON that is not an object")
    return value
