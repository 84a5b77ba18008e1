"""Stream decoding, retry timing rules and the pseudo-tool marker parser, without a server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from kortex.errors import ProviderError
from kortex.llm.convert import load_arguments, parse_arguments
from kortex.llm.pseudotools import MarkerParser, to_plain_messages
from kortex.llm.retry import RetryPolicy, parse_retry_after
from kortex.llm.wire import dumps, dumps_text, loads, ndjson_lines, sse_events
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _sse(*parts: bytes, max_line: int = 1 << 20) -> list[tuple[str, str]]:
    async def run() -> list[tuple[str, str]]:
        return [(e.event, e.data) async for e in sse_events(_chunks(*parts), max_line=max_line)]
    return asyncio.run(run())


def test_sse_events_split_anywhere_with_comments_crlf_and_multiline_data() -> None:
    body = b'event: message_start\r\ndata: {"a":1}\r\n\r\n: keep-alive\n\ndata: line one\ndata: line two\n\n' \
           b'event: ping\ndata: {}\n\n'
    whole = _sse(body)
    assert whole == [("message_start", '{"a":1}'), ("message", "line one\nline two"), ("ping", "{}")]
    assert _sse(*[body[i:i + 1] for i in range(len(body))]) == whole  # one byte at a time


def test_sse_events_are_the_same_wherever_the_body_is_cut_in_two() -> None:
    body = ('event: message_start\r\ndata: {"t": "café ☕"}\r\n\r\n'  # CRLF, multibyte
            ': ping\n\n'  # a comment alone is no event
            'event:delta\ndata:{"a":\ndata\ndata:  1}\nid: 7\nretry: 10\n\n'  # no spaces, empty data, unused fields
            'data: 終わり\r\n\r\n'
            'data: \xff\n\n').encode().replace("\xff".encode(), b"\xff")  # not UTF-8: replaced
    whole = _sse(body)
    assert whole == [("message_start", '{"t": "café ☕"}'), ("delta", '{"a":\n\n 1}'), ("message", "終わり"),
                     ("message", "\ufffd")]
    for cut in range(1, len(body)):  # inside \r\n pairs and multibyte characters too
        assert _sse(body[:cut], body[cut:]) == whole, cut


def test_sse_events_drop_one_leading_bom_and_end_lines_at_cr_lf_or_crlf() -> None:
    body = (b"\xef\xbb\xbfevent: a\rdata: 1\r\r"  # BOM; bare CRs
            b"data: 2\r\ndata: 3\r\n\r\n"  # CRLF, two data lines: one event
            b"data: \xef\xbb\xbf4\rdata: 5\n\n"  # a BOM past the start is data; CR then LF
            b"data: 6\r\r\n"  # CR, then CRLF: two line ends
            b"data: 7\n\r")  # LF, then CR
    expected = [("a", "1"), ("message", "2\n3"), ("message", "\ufeff4\n5"), ("message", "6"), ("message", "7")]
    assert _sse(body) == expected
    # A CR ending one read and an LF starting the next are one line end (else "2" and "3" would
    # be two events), also with an empty read between them.
    for cut in range(1, len(body)):
        assert _sse(body[:cut], body[cut:]) == expected, cut
        assert _sse(body[:cut], b"", body[cut:]) == expected, cut
    assert _sse(*[body[i:i + 1] for i in range(len(body))]) == expected
    assert _sse(b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n") == []  # only one BOM is dropped: "\ufeffdata" is no field


def test_json_reads_and_writes_what_json_did() -> None:
    for text in ('{"a": [1, 2.5, "é☕", null, true]}', '{"big": 123456789012345678901234567890}', "[NaN, 1e400]",
                 '{"k": "\\ud83d\\ude00"}', " 7 ", "[-9223372036854775809, 18446744073709551616, 1.0000000000000000001]"):
        assert repr(loads(text)) == repr(json.loads(text)) and repr(loads(text.encode())) == repr(json.loads(text))
    assert loads('{"u": 1}'.encode("utf-16")) == {"u": 1}  # json detects the encoding of bytes
    for bad in ("{oops}", "", '{"a": 1', '"\x01"', b"\xff"):
        with pytest.raises(ValueError):
            loads(bad)

    def old(value: object) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()

    body = {"model": "m", "messages": [{"role": "user", "content": "café ☕ \n \"q\" \\ \u2028 \x00"}],
            "max_tokens": 4096, "temperature": 0.2, "stop": ["END"], "tools": [], "n": None, "t": (1, 2),
            "big": 2 ** 70, "keys": {1: "int key"}}
    assert dumps(body) == old(body)
    assert dumps({"x": float("nan")}) == b'{"x":null}'  # json would write NaN, which no server parses
    with pytest.raises(TypeError):  # what json cannot encode stays an error
        dumps({"when": datetime(2026, 1, 1, tzinfo=UTC)})


def test_a_tool_result_is_written_as_json_writes_it() -> None:
    # The text the model reads of a result: json.dumps's, whichever encoder writes it.
    import dataclasses
    import decimal
    import uuid

    @dataclasses.dataclass
    class Row:
        n: int

    def old(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)

    for value in ({"a": [1, 2.5, "é\n\t\x01\u2028 \"q\" \\ /", None, True], "n": -3},
                  {"when": datetime(2026, 1, 1, 14, 31, tzinfo=UTC), "id": uuid.UUID(int=7)},
                  {"cost": decimal.Decimal("1.10"), "row": Row(3)},
                  {"big": 2 ** 70}, {1: "int key"}, {"lone": "\ud800"}, [0.1, 1.5, 123456789.125]):
        assert dumps_text(value) == old(value), value


def test_an_sse_event_cut_off_before_its_blank_line_is_dropped() -> None:
    assert _sse(b"data: complete\n\ndata: {\"half\": tr") == [("message", "complete")]


def test_an_endless_line_is_refused() -> None:
    with pytest.raises(ProviderError) as caught:
        _sse(b"data: " + b"x" * 5000, max_line=1000)
    assert caught.value.code == "stream_invalid" and "longer than the limit" in caught.value.detail


def test_ndjson_lines_and_bad_lines() -> None:
    async def run(*parts: bytes) -> list[dict]:
        return [line async for line in ndjson_lines(_chunks(*parts))]
    assert asyncio.run(run(b'{"a": 1}\n{"b"', b': 2}\n\n{"c": 3}')) == [{"a": 1}, {"b": 2}, {"c": 3}]
    with pytest.raises(ProviderError) as caught:
        asyncio.run(run(b"{oops}\n"))
    assert caught.value.code == "stream_invalid" and "not JSON" in caught.value.detail
    with pytest.raises(ProviderError) as caught:
        asyncio.run(run(b"[1]\n"))
    assert caught.value.code == "stream_invalid" and "not an object" in caught.value.detail


def test_backoff_doubles_with_jitter_and_respects_its_bounds() -> None:
    policy = RetryPolicy(max_retries=3, base=1.0, cap=3.0, max_wait=10, budget=5)
    assert [policy.delay(n, None, rand=lambda: 1.0) for n in range(4)] == [1.0, 2.0, 3.0, 3.0]
    assert [policy.delay(n, None, rand=lambda: 0.0) for n in range(3)] == [0.5, 1.0, 1.5]
    assert policy.delay(0, 4.0, rand=lambda: 0.0) == 4.0  # Retry-After wins over the backoff
    assert policy.next_wait(3, None, 0) is None  # out of retries
    assert policy.next_wait(0, 11, 0) is None  # the server wants more than max_wait
    assert policy.next_wait(0, 4, 2) is None  # over the total budget
    assert policy.next_wait(0, 4, 0) is not None


def test_retry_after_in_seconds_milliseconds_or_as_a_date() -> None:
    now = datetime(2026, 4, 7, 14, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after": "7"}) == 7
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "7"}) == 0.25
    assert parse_retry_after({"retry-after": "Tue, 07 Apr 2026 14:00:30 GMT"}, now=now) == 30
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


def _feed(parser: MarkerParser, *pieces: str) -> list:
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def test_markers_split_across_chunks_become_calls_and_text_stays_text() -> None:
    text = ("Let me look. <<TOOL name=\"get_logs\" args='{\"product\": \"a >> b\"}'>> then "
            "<<TOOL name=\"get_metrics\">> done")
    for size in (1, 3, 7, len(text)):
        items = _feed(MarkerParser(), *[text[i:i + size] for i in range(0, len(text), size)])
        prose = "".join(i for i in items if isinstance(i, str))
        found = [i for i in items if isinstance(i, ToolCall)]
        assert prose == "Let me look.  then  done"
        assert [(c.name, c.arguments) for c in found] == [("get_logs", {"product": "a >> b"}), ("get_metrics", {})]


def test_garbled_or_unfinished_markers() -> None:
    [call] = [i for i in _feed(MarkerParser(), "<<TOOL name=\"get_logs\" args='{nope'>>") if isinstance(i, ToolCall)]
    assert call.arguments_error == "invalid_json"
    [cut] = _feed(MarkerParser(), "<<TOOL name=\"get_logs\" args='{\"product\":")
    assert isinstance(cut, ToolCall) and cut.arguments_error == "invalid_json"
    assert _feed(MarkerParser(), "a << b <<TOO") == ["a << b ", "<<TOO"]  # never a marker


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_arguments_with_numbers_jsonb_cannot_hold_are_invalid_json(value: str) -> None:
    # json.loads reads these (as float nan/inf); PostgreSQL's jsonb then refuses the whole step.
    text = f'{{"product": "checkout", "limit": {value}}}'
    call = parse_arguments("c1", "get_logs", text)
    assert (call.arguments, call.arguments_error) == ({}, "invalid_json")
    [marked] = [i for i in _feed(MarkerParser(), f"<<TOOL name=\"get_logs\" args='{text}'>>")
                if isinstance(i, ToolCall)]
    assert (marked.arguments, marked.arguments_error) == ({}, "invalid_json")
    with pytest.raises(ValueError):
        load_arguments(f"[{value}]")


def test_strict_arguments_keep_every_finite_number_and_big_integer() -> None:
    call = parse_arguments("c1", "get_logs", '{"a": 1.5e300, "b": -0.0, "c": 123456789012345678901234567890}')
    assert call.arguments == {"a": 1.5e300, "b": -0.0, "c": 123456789012345678901234567890}
    assert call.arguments_error is None
    assert parse_arguments("c1", "x", "[" * 100_000).arguments_error == "invalid_json"  # not a RecursionError


def test_pseudo_tool_history_writes_calls_as_markers_and_results_as_user_text() -> None:
    call = ToolCall(id="c1", name="get_logs", arguments={"product": "checkout"})
    messages = to_plain_messages([
        UserMessage(content="why?"), AssistantMessage(content="Looking.", tool_calls=(call,)),
        ToolMessage(result=ToolResult(call_id="c1", name="get_logs", content={"lines": []}))])
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "Looking.\n<<TOOL name=\"get_logs\" args='{\"product\": \"checkout\"}'>>"
    assert messages[2]["content"] == 'Tool result (get_logs, ok):\n{"lines":[]}'


def test_sse_data_without_a_blank_line_is_bounded() -> None:
    async def run() -> list:
        lines = b"".join(b"data: " + b"x" * 100 + b"\n" for _ in range(50))  # never dispatched
        return [e async for e in sse_events(_chunks(lines), max_line=1000, max_event=2000)]
    with pytest.raises(ProviderError) as caught:
        asyncio.run(run())
    assert caught.value.code == "stream_invalid" and "event" in caught.value.detail


def test_a_multibyte_character_split_between_chunks_arrives_whole() -> None:
    text = '{"text": "café ☕ 終わり"}'
    body = f"data: {text}\n\n".encode()
    cut = body.index("☕".encode()) + 1  # inside the three bytes of ☕
    assert _sse(body[:cut], body[cut:]) == [("message", text)]

    async def ndjson() -> list[dict]:
        line = (text + "\n").encode()
        at = line.index("終".encode()) + 2
        return [o async for o in ndjson_lines(_chunks(line[:at], line[at:]))]
    assert asyncio.run(ndjson()) == [{"text": "café ☕ 終わり"}]


def test_an_ndjson_body_cut_mid_line_is_truncated_not_invalid() -> None:
    async def run(*parts: bytes) -> list[dict]:
        return [line async for line in ndjson_lines(_chunks(*parts))]
    with pytest.raises(ProviderError) as caught:
        asyncio.run(run(b'{"a": 1}\n{"message": {"content": "hal'))
    assert caught.value.code == "stream_truncated" and caught.value.retryable
    assert asyncio.run(run(b'{"a": 1}\n{"done": true}')) == [{"a": 1}, {"done": True}]  # no final newline: whole


def test_tool_call_arguments_and_the_number_of_calls_are_bounded() -> None:
    from kortex.llm.anthropic import Decoder as AnthropicDecoder
    from kortex.llm.convert import MAX_ARGUMENT_BYTES, MAX_CALLS
    from kortex.llm.openai import Decoder as OpenAIDecoder
    from kortex.llm.wire import SSEvent

    def feed(decoder: object, frames: list[dict]) -> None:
        for frame in frames:
            list(decoder.feed(SSEvent("message", json.dumps(frame))))  # type: ignore[attr-defined]

    piece = "x" * 65536
    big = [{"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "n"}}]
    big += [{"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece}}
            for _ in range(MAX_ARGUMENT_BYTES // len(piece) + 1)]
    with pytest.raises(ProviderError) as caught:
        feed(AnthropicDecoder("anthropic", "m"), big)
    assert caught.value.code == "stream_invalid" and "arguments" in caught.value.detail
    many = [{"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": i, "id": f"c{i}", "function": {"name": "get_logs", "arguments": "{}"}}]}}]}
        for i in range(MAX_CALLS + 1)]
    feed(OpenAIDecoder("openai", "m"), many[:MAX_CALLS])  # up to the cap: fine
    with pytest.raises(ProviderError) as caught:
        feed(OpenAIDecoder("openai", "m"), many)
    assert caught.value.code == "stream_invalid" and "tool calls" in caught.value.detail
