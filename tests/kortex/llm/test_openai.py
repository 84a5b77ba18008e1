"""OpenAI specifics the fake server cannot say: bodies cut between ``finish_reason`` and the
usage chunk, and tool calls that compatible servers number oddly; served byte for byte."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kortex.errors import ProviderError
from kortex.llm.base import DoneChunk, TokenUsage
from tests.kortex.llm.conftest import make_provider, request
from tests.kortex.llm.test_adapters import calls, texts

DONE = b"data: [DONE]\n\n"
USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def frame(delta: dict[str, Any] | None = None, finish: str | None = None, *, usage_key: bool = True,
          **extra: Any) -> bytes:
    """One chunk as api.openai.com writes it; ``usage_key``: with ``"usage": null`` (what it
    sends on every chunk but the last when ``include_usage`` is set)."""
    chunk: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                             "model": "gpt-4o-2024-08-06",
                             "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]}
    if usage_key:
        chunk["usage"] = None
    chunk.update(extra)
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def usage_frame() -> bytes:
    return frame(choices=[], usage=USAGE)


class ExactBytes:
    """Answers the n-th POST with the n-th body (the last once they run out), byte for byte,
    then closes the connection: a body cut where the test says."""

    def __init__(self, *bodies: bytes) -> None:
        self.bodies = bodies
        self.requests: list[dict[str, Any]] = []

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        self.requests.append(json.loads(await reader.readexactly(length)))
        body = self.bodies[min(len(self.requests), len(self.bodies)) - 1]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    def stream(self, transport: str, *, official: bool = False) -> tuple[list[Any], ProviderError | None]:
        """What the OpenAI adapter makes of it (``official``: as for a base_url on api.openai.com)."""
        async def run() -> tuple[list[Any], ProviderError | None]:
            server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            provider = make_provider("openai", url, transport=transport, max_retries=1)
            provider.official = official  # type: ignore[attr-defined]
            got: list[Any] = []
            error = None
            try:
                async for chunk in provider.stream(request("openai")):
                    got.append(chunk)
            except ProviderError as exc:
                error = exc
            finally:
                await provider.aclose()
                server.close()
                await server.wait_closed()
            return got, error
        return asyncio.run(run())


# -- a body cut between finish_reason and the usage chunk ------------------------------------

TEXT_ANSWER = [frame({"role": "assistant", "content": "The pool"}), frame({"content": " ran dry."}),
               frame({}, "stop")]


@pytest.mark.parametrize("server", ["api.openai.com", "says usage null"])
def test_a_body_cut_before_the_usage_chunk_it_owes_is_truncated_not_free(
        transport: str, waits: list[float], server: str) -> None:
    official = server == "api.openai.com"
    cut = b"".join(TEXT_ANSWER)  # neither the usage chunk nor [DONE]
    if official:
        cut = cut.replace(b',"usage":null', b"")  # owed all the same: api.openai.com always sends it
    fake = ExactBytes(cut)
    got, error = fake.stream(transport, official=official)
    assert texts(got) == ["The pool", " ran dry."] and not any(isinstance(c, DoneChunk) for c in got)
    assert error is not None and error.code == "stream_truncated" and error.retryable
    assert "usage" in error.detail
    assert len(fake.requests) == 1 and waits == []  # text went out: a retry would say it twice
    assert fake.requests[0]["stream_options"] == {"include_usage": True}


def test_a_cut_answer_that_produced_nothing_yet_is_tried_again(transport: str, waits: list[float]) -> None:
    # Tool calls come out only once the answer is whole: cut before its usage, nothing was said.
    call = frame({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": "get_logs", "arguments": "{\"product\":\"api\"}"}}]})
    answer = call + frame({}, "tool_calls")
    fake = ExactBytes(answer, answer + usage_frame() + DONE)
    got, error = fake.stream(transport)
    assert error is None and len(fake.requests) == 2 and len(waits) == 1
    assert [(c.id, c.arguments) for c in calls(got)] == [("call_1", {"product": "api"})]
    assert got[-1].usage == TokenUsage(input_tokens=100, output_tokens=20)


def test_a_compatible_server_that_never_sends_usage_may_omit_done(transport: str, waits: list[float]) -> None:
    body = b"".join(f.replace(b',"usage":null', b"") for f in TEXT_ANSWER)  # no sign of include_usage
    fake = ExactBytes(body)
    got, error = fake.stream(transport)
    assert error is None and texts(got) == ["The pool", " ran dry."]
    assert isinstance(got[-1], DoneChunk) and got[-1].usage == TokenUsage() and got[-1].stop_reason == "end_turn"


def test_a_whole_body_with_usage_and_without_done_is_accepted(transport: str, waits: list[float]) -> None:
    fake = ExactBytes(b"".join(TEXT_ANSWER) + usage_frame())
    got, error = fake.stream(transport, official=True)
    assert error is None and got[-1].usage == TokenUsage(input_tokens=100, output_tokens=20)


# -- tool calls numbered oddly -----------------------------------------------------------------


def test_two_calls_at_one_index_with_different_ids_stay_two_calls(transport: str, waits: list[float]) -> None:
    def part(**call: Any) -> bytes:
        return frame({"tool_calls": [call]})

    fake = ExactBytes(
        part(index=0, id="a", function={"name": "get_logs", "arguments": "{\"p\":\"1\"}"})
        + part(index=0, id="b", function={"name": "get_logs", "arguments": "{\"p\":"})
        + part(index=0, function={"arguments": "\"2\"}"})  # no id: continues b
        + part(index=0, id="b", function={"arguments": ""})  # its own id again: still b
        + frame({}, "tool_calls") + usage_frame() + DONE)
    got, error = fake.stream(transport)
    assert error is None
    assert [(c.id, c.arguments, c.arguments_error) for c in calls(got)] == [
        ("a", {"p": "1"}, None), ("b", {"p": "2"}, None)]
    assert got[-1].stop_reason == "tool_use"
