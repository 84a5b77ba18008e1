"""OpenAI specifics: bodies cut between ``finish_reason`` and the usage chunk, and tool calls
that compatible servers number oddly, served byte for byte; servers that report no usage."""

from __future__ import annotations

import asyncio
import json
import math
from contextlib import aclosing
from typing import Any

import pytest

from kortex.config import Settings
from kortex.errors import ProviderError
from kortex.llm.base import DoneChunk, TokenUsage
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import RoutedStream, plan
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import collect, make_provider, request, vendor_config
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
    assert isinstance(got[-1], DoneChunk) and got[-1].stop_reason == "end_turn"
    assert got[-1].usage.estimated and got[-1].usage.output_tokens == math.ceil(len("The pool ran dry.") / 4)


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


# -- a server that reports no usage is billed an estimate, not $0 ------------------------------


def test_a_server_that_ignores_include_usage_is_billed_an_estimate(transport: str, fake: FakeLLM) -> None:
    fake.add("gpt-4o", {"steps": [{"text": ["The pool ", "ran dry."], "usage_omitted": True}]})
    provider = make_provider("openai", fake.url, transport=transport)
    chunks = collect(provider, request("openai"))
    assert texts(chunks) == ["The pool ", "ran dry."]
    usage = chunks[-1].usage
    assert usage.output_tokens == math.ceil(len("The pool ran dry.") / 4) and usage.estimated
    sent = fake.requests[-1].body
    assert "usage" not in json.dumps(sent["messages"])  # the fake really said nothing about usage
    # the prompt as sent (system, question, tool schemas), at four characters a token
    content = len("You investigate.") + len("why is checkout slow?") + len(json.dumps(sent["tools"]))
    assert content // 4 <= usage.input_tokens <= len(json.dumps(sent)) // 4 + 1
    assert provider.model_info("gpt-4o").cost_of(usage) > 0


def test_usage_null_then_done_without_a_usage_chunk_is_billed_an_estimate(transport: str, waits: list[float]) -> None:
    # "usage": null on every chunk and [DONE], but the usage chunk never comes (a proxy that
    # passes the key on and drops the last chunk): whole, and not free.
    call = frame({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": "get_logs", "arguments": "{\"product\":\"api\"}"}}]})
    fake = ExactBytes(call + frame({}, "tool_calls") + DONE)
    got, error = fake.stream(transport)
    assert error is None and [(c.id, c.arguments) for c in calls(got)] == [("call_1", {"product": "api"})]
    usage = got[-1].usage
    assert usage.output_tokens == math.ceil(len("get_logs" + "{\"product\":\"api\"}") / 4)
    assert usage.input_tokens > 0 and usage.estimated


def test_reported_usage_is_not_marked_estimated(transport: str, waits: list[float]) -> None:
    got, error = ExactBytes(b"".join(TEXT_ANSWER) + usage_frame() + DONE).stream(transport)
    assert error is None and got[-1].usage == TokenUsage(input_tokens=100, output_tokens=20)
    assert not got[-1].usage.estimated


def test_the_router_bills_the_estimate_so_budgets_see_it(fake: FakeLLM) -> None:
    fake.add("gpt-4o", {"steps": [{"text": ["The pool ran dry."], "usage_omitted": True}]})
    settings = Settings(llm={"providers": {"openai": vendor_config("openai", fake.url, max_retries=0)}})
    reg = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    routed = RoutedStream(plan(reg, "openai:gpt-4o"), request("openai"), settings.llm)

    async def go() -> None:
        try:
            async with aclosing(routed.stream()) as chunks:
                async for _ in chunks:
                    pass
        finally:
            await reg.aclose()

    asyncio.run(go())
    [attempt] = routed.attempts
    assert attempt.error is None and attempt.cost_usd > 0
    assert attempt.usage.input_tokens > 0 and attempt.usage.output_tokens > 0 and attempt.usage.estimated
