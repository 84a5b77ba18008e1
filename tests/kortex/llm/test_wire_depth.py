"""JSON from a vendor nested past what json's decoder can recurse through (orjson stops at 1,024
levels and hands such a document to json) is refused as ValueError, the error every decoder of
kortex/llm/wire.py's callers catches, not a RecursionError."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kortex.errors import ProviderError
from kortex.llm.wire import loads, ndjson_lines


def test_deep_json_is_a_value_error() -> None:
    for text in ("[" * 50_000 + "]" * 50_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        with pytest.raises(ValueError, match="nested too deeply"):
            loads(text)
    shallow = loads("[" * 500 + "]" * 500)  # within orjson's reach: read as ever
    for _ in range(499):
        shallow = shallow[0]
    assert shallow == []


def test_a_deep_ndjson_line_is_a_malformed_stream() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'{"message": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n"

    async def read() -> None:
        async for _ in ndjson_lines(body()):
            pass

    with pytest.raises(ProviderError) as caught:
        asyncio.run(read())
    assert caught.value.code == "stream_invalid"
