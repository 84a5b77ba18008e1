"""How provider calls fail: secrets never in an error, frames of the wrong shape, what arrives
after a complete answer, what a failed or cancelled call was billed, client-safe messages."""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError
from kortex.llm import anthropic, http, ollama, openai
from kortex.llm import vendor as vendor_client
from kortex.llm.base import CompletionRequest, DoneChunk, StreamChunk, TextChunk, TokenUsage, UsageChunk
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.wire import SSEvent
from kortex.messages import UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import VENDORS, collect, make_provider, model_of, request, vendor_config
from tests.kortex.llm.test_adapters import texts


def _everything_said(error: BaseException) -> str:
    """Every text an operator or a client could see of an error, its traceback included."""
    parts = [str(error), repr(error), getattr(error, "message", ""), getattr(error, "detail", "")]
    return "\n".join([*parts, "".join(traceback.format_exception(error))])


# -- API keys (a trailing newline from a secret file, control characters) -----------------------


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
def test_a_key_read_from_a_secret_file_loses_its_newline(fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["ok"]}]})
    chunks = collect(make_provider(vendor, fake.url, api_key="test-key\n"), request(vendor))
    assert texts(chunks) == ["ok"]
    headers = fake.requests[-1].headers
    assert headers.get("x-api-key", headers.get("authorization")) in ("test-key", "Bearer test-key")


@pytest.mark.parametrize("key", ["sk-live-abc\ndef123", "sk-live abc123", "sk-live-\x1babc123", "sk-live-ünï123"])
def test_a_key_with_whitespace_or_control_characters_inside_makes_the_provider_unavailable(
        key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    registry = ProviderRegistry(Settings(llm={"providers": {"anthropic": {"api_key": key}}}), BUILTIN_PROVIDERS)
    status = {s.name: s for s in registry.status()}
    for name, where in (("anthropic", "llm.providers.anthropic.api_key"), ("openai", "OPENAI_API_KEY")):
        assert not status[name].available
        reason = status[name].reason or ""
        assert "API key" in reason and where in reason and "sk-live" not in reason


def test_a_request_that_cannot_be_sent_is_not_retried_and_never_quotes_the_key(transport: str, fake: FakeLLM,
                                                                               waits: list[float]) -> None:
    fake.add("claude-sonnet-4-6", {"steps": [{"text": ["never"]}]})
    # Past create()'s check, as a key changed under a running process would be.
    provider = anthropic.AnthropicProvider("anthropic", ProviderSettings(**vendor_config("anthropic", fake.url)),
                                           Settings(llm={"http_transport": transport}), "sk-secret-0123456789\n")
    with pytest.raises(ProviderError) as caught:
        collect(provider, request("anthropic"))
    error = caught.value
    assert error.code == "request_invalid" and not error.retryable and waits == [] and not fake.requests
    assert "sk-secret" not in _everything_said(error)


# A key of no shape the pattern scrubber knows, as corporate gateways issue them.
PLAIN_KEY = "corp-llm-7f3a9b2c4d5e6f708192a3b4"


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("echo", [
    f"Incorrect API key provided {PLAIN_KEY}",
    "x" * 264 + f" key {PLAIN_KEY} refused",  # the 300-character cut of a vendor message falls inside it
    f"<html>401 Unauthorized: api key {PLAIN_KEY} not valid</html>",
], ids=["message", "cut", "html"])
def test_a_vendor_error_that_echoes_the_key_never_shows_it(
        transport: str, fake: FakeLLM, vendor: str, echo: str, waits: list[float],
        caplog: pytest.LogCaptureFixture) -> None:
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": 401, "message": echo}]}]})
    provider = make_provider(vendor, fake.url, transport=transport, api_key=PLAIN_KEY)
    with caplog.at_level("DEBUG"), pytest.raises(ProviderError) as caught:
        collect(provider, request(vendor))
    error = caught.value
    assert error.code == "provider_auth" and "REDACTED" in error.detail  # said what it was, without the key
    assert PLAIN_KEY[:8] not in _everything_said(error) + caplog.text
    assert "401" in caplog.text or "provider_auth" in caplog.text  # the failure is still logged


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
def test_a_key_from_the_environment_is_taken_out_of_errors_too(
        fake: FakeLLM, vendor: str, waits: list[float], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(f"{vendor.upper()}_API_KEY", PLAIN_KEY)
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": 403, "message": f"key {PLAIN_KEY} is disabled"}]}]})
    provider = make_provider(vendor, fake.url, api_key=None)
    with pytest.raises(ProviderError) as caught:
        collect(provider, request(vendor))
    assert fake.requests  # the key was sent: it came from the environment
    assert PLAIN_KEY[:8] not in _everything_said(caught.value) + caplog.text


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("pad", [0, 470], ids=["whole", "cut"])  # 470: the 500-character detail ends inside the key
def test_an_in_stream_error_that_echoes_the_key_never_shows_it(
        fake: FakeLLM, vendor: str, pad: int, waits: list[float], caplog: pytest.LogCaptureFixture) -> None:
    message = "y" * pad + f" {PLAIN_KEY} is not allowed"
    fake.add(model_of(vendor), {"steps": [{"stream_error": {"type": "permission_error", "message": message}}]})
    provider = make_provider(vendor, fake.url, api_key=PLAIN_KEY, max_retries=0)
    with pytest.raises(ProviderError) as caught:
        collect(provider, request(vendor))
    assert PLAIN_KEY[:8] not in _everything_said(caught.value) + caplog.text


# -- what arrives after the final frame -------------------------------------------------------


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("after_end", ["reset", "stall"])
def test_a_reset_or_a_stall_after_the_final_frame_does_not_fail_a_complete_answer(
        transport: str, fake: FakeLLM, vendor: str, after_end: str, waits: list[float],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vendor_client, "DRAIN_SECONDS", 0.1)
    fake.add(model_of(vendor), {"steps": [{"text": ["whole ", "answer"], "after_end": after_end,
                                           "usage": {"input_tokens": 40, "output_tokens": 7}}]})
    # The read timeout is what a stalled drain would run into without its own short deadline.
    provider = make_provider(vendor, fake.url, transport=transport, timeout=2)
    chunks = collect(provider, request(vendor))
    assert texts(chunks) == ["whole ", "answer"]
    done = chunks[-1]
    assert isinstance(done, DoneChunk) and done.usage.input_tokens == 40 and done.usage.output_tokens == 7
    assert len(fake.requests) == 1 and waits == []


class _Canned(http.HTTPProvider):
    """An HTTP provider whose tries are scripted in Python (what no server can easily do)."""

    catalogue = openai.OpenAIProvider.catalogue

    def __init__(self, tries: list[list[Any]]) -> None:
        super().__init__("canned", ProviderSettings(retry_base=0.001), Settings())
        self.tries = tries

    async def _stream_once(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        for item in self.tries.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item


def _run(provider: http.HTTPProvider) -> list[Any]:
    async def go() -> list[Any]:
        return [c async for c in provider.stream(CompletionRequest(model="gpt-4o"))]
    return asyncio.run(go())


def test_an_error_after_the_final_chunk_is_ignored(waits: list[float]) -> None:
    done = DoneChunk(usage=TokenUsage(input_tokens=5, output_tokens=2))
    chunks = _run(_Canned([[TextChunk(text="ok"), done, ProviderError("late", code="stream_interrupted")]]))
    assert chunks == [TextChunk(text="ok"), done]


def test_an_unexpected_exception_becomes_a_provider_error(waits: list[float]) -> None:
    with pytest.raises(ProviderError) as caught:
        _run(_Canned([[KeyError("choices")]]))
    assert caught.value.code == "stream_invalid" and caught.value.provider == "canned"
    assert isinstance(caught.value.__cause__, KeyError)


# -- frames of the wrong shape ----------------------------------------------------------------


OPENAI_BAD = [
    {"choices": [{"index": 0, "delta": {"content": ["a", "list"]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0", "function": {"name": "x"}}]}}]},
    {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": "get_logs"}]}}]},
    {"choices": ["not a choice"]},
    {"choices": [{"index": 0, "delta": "text"}]},
    {"choices": {"index": 0}},
    ["a", "list"],
    {"usage": "many"},
]
ANTHROPIC_BAD = [
    {"type": "content_block_delta", "index": 0, "delta": "text"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": 5}},
    {"type": "content_block_start", "index": None, "content_block": {"type": "tool_use", "id": "a", "name": "b"}},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "a", "input": [1]}},
    {"type": "message_start", "message": ["not", "a", "message"]},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": "lots"},
    "a string",
]


@pytest.mark.parametrize("frame", OPENAI_BAD)
def test_malformed_openai_frames_are_stream_invalid(frame: Any) -> None:
    decoder = openai.Decoder("openai", "gpt-4o")
    with pytest.raises(ProviderError) as caught:
        list(decoder.feed(SSEvent("message", json.dumps(frame))))
    assert caught.value.code == "stream_invalid" and not caught.value.retryable


@pytest.mark.parametrize("frame", ANTHROPIC_BAD)
def test_malformed_anthropic_frames_are_stream_invalid(frame: Any) -> None:
    decoder = anthropic.Decoder("anthropic", "claude-sonnet-4-6")
    with pytest.raises(ProviderError) as caught:
        list(decoder.feed(SSEvent("message", json.dumps(frame))))
    assert caught.value.code == "stream_invalid"


@pytest.mark.parametrize(("vendor", "frame"), [
    ("openai", {"choices": [{"index": 0, "delta": {"content": ["x"]}}]}),
    ("anthropic", {"type": "content_block_delta", "index": 0, "delta": ["x"]}),
    ("ollama", {"message": "not an object", "done": False}),
    ("ollama", {"message": {"role": "assistant", "content": ["x"]}, "done": False}),
    ("ollama", {"message": {"role": "assistant", "content": "", "tool_calls": [7]}, "done": False}),
])
def test_a_malformed_frame_from_the_server_fails_the_call_cleanly(fake: FakeLLM, vendor: str, frame: Any,
                                                                 waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["partial "], "extra_frames": [frame]}]})
    got: list[Any] = []
    provider = make_provider(vendor, fake.url)

    async def run() -> None:
        try:
            async with aclosing(provider.stream(request(vendor))) as chunks:
                async for chunk in chunks:
                    got.append(chunk)
        finally:
            await provider.aclose()

    with pytest.raises(ProviderError) as caught:
        asyncio.run(run())
    assert caught.value.code == "stream_invalid" and caught.value.provider == vendor
    assert texts(got) == ["partial "] and waits == []


# -- what a failed or cancelled call was billed -------------------------------------------------


def test_an_anthropic_error_after_message_start_keeps_the_billed_prompt(fake: FakeLLM, waits: list[float]) -> None:
    fake.add("claude-sonnet-4-6", {"steps": [{
        "text": ["half"], "usage": {"input_tokens": 900, "output_tokens": 3},
        "stream_error": {"type": "api_error", "message": "Internal"}}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("anthropic", fake.url), request("anthropic"))
    assert caught.value.usage is not None and caught.value.usage.input_tokens == 900


def test_a_retried_call_adds_what_its_failed_tries_were_billed(waits: list[float]) -> None:
    retryable = ProviderError("down", code="provider_overloaded", retryable=True)
    provider = _Canned([
        [UsageChunk(usage=TokenUsage(input_tokens=100, output_tokens=1)), retryable],
        [UsageChunk(usage=TokenUsage(input_tokens=100, output_tokens=1)), TextChunk(text="ok"),
         DoneChunk(usage=TokenUsage(input_tokens=100, output_tokens=9))],
    ])
    chunks = _run(provider)
    assert [c.usage for c in chunks if isinstance(c, UsageChunk)] == [
        TokenUsage(input_tokens=100, output_tokens=1), TokenUsage(input_tokens=200, output_tokens=2)]
    assert chunks[-1].usage == TokenUsage(input_tokens=200, output_tokens=10) and len(waits) == 1


# -- truncation, and inner generators closed with their stream --------------------------------


def test_an_ndjson_line_cut_mid_way_is_a_retryable_truncation(fake: FakeLLM, waits: list[float]) -> None:
    fake.add("llama3.2", {"steps": [{"text": ["one ", "two ", "three"], "truncate_after": 0,
                                     "truncate_partial": True}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("ollama", fake.url, max_retries=1), request("ollama"))
    assert caught.value.code == "stream_truncated" and caught.value.retryable
    assert len(waits) == 1  # tried again: a cut body is the network's doing, not the server's answer


@pytest.mark.parametrize("vendor", VENDORS)
def test_closing_a_stream_closes_its_body_decoder_at_once(fake: FakeLLM, vendor: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    module: Any = {"anthropic": http, "openai": http, "ollama": ollama}[vendor]  # where each reads its stream
    name = "ndjson_lines" if vendor == "ollama" else "sse_events"
    original = getattr(module, name)
    closed: list[bool] = []

    async def watched(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            async for item in original(*args, **kwargs):
                yield item
        finally:
            closed.append(True)

    monkeypatch.setattr(module, name, watched)
    fake.add(model_of(vendor), {"steps": [{"text": [f"t{i} " for i in range(50)], "delay_ms": 5}]})
    provider = make_provider(vendor, fake.url)

    async def run() -> bool:
        stream = provider.stream(request(vendor))
        try:
            async for chunk in stream:
                if isinstance(chunk, TextChunk):
                    break
            await stream.aclose()
            return bool(closed)  # before the loop had a chance to finalize anything left behind
        finally:
            await provider.aclose()

    assert asyncio.run(run())


# -- which error statuses are tried again --------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 504, 507, 520, 522, 524, 529])
def test_every_server_error_is_tried_again(fake: FakeLLM, waits: list[float], status: int) -> None:
    # 520-524: Cloudflare in front of a vendor (origin unreachable, timed out), named by no RFC.
    fake.add("gpt-4o", {"steps": [{"faults": [{"status": status, "message": "<html>origin error</html>"}],
                                   "text": ["ok"]}]})
    chunks = collect(make_provider("openai", fake.url), request("openai"))
    assert texts(chunks) == ["ok"] and len(fake.requests) == 2 and len(waits) == 1


@pytest.mark.parametrize("status", [501, 505])
def test_a_server_error_that_says_never_is_not_tried_again(fake: FakeLLM, waits: list[float], status: int) -> None:
    fake.add("gpt-4o", {"steps": [{"faults": [{"status": status, "message": "not implemented"}], "text": ["ok"]}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("openai", fake.url), request("openai"))
    error = caught.value
    assert error.code == "provider_server_error" and error.status == status and not error.retryable
    assert len(fake.requests) == 1 and waits == []


@pytest.mark.parametrize(("vendor", "status", "kind"), [
    ("openai", 429, "insufficient_quota"),  # OpenAI's spent quota looks like a rate limit but for its code
    ("anthropic", 402, None),  # Anthropic's billing_error
])
def test_a_spent_quota_is_not_tried_again_and_a_plain_rate_limit_is(fake: FakeLLM, waits: list[float], vendor: str,
                                                                   status: int, kind: str | None) -> None:
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": status, "kind": kind, "retry_after": 0.01,
                                                       "message": "You exceeded your current quota"}],
                                           "text": ["ok"]}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(vendor, fake.url), request(vendor))
    error = caught.value
    assert error.code == "provider_quota" and not error.retryable and error.status == status
    assert error.message == "the provider account has no quota or credit left" and "quota" in error.detail
    assert len(fake.requests) == 1 and waits == []
    # The same status without the account's word is a rate limit, tried again after its pause.
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": 429, "retry_after": 0.01}], "text": ["ok"]}]})
    again = request(vendor, UserMessage(content="again"))  # the fake counts faults per question
    assert texts(collect(make_provider(vendor, fake.url), again)) == ["ok"] and len(waits) == 1


# -- messages clients see ------------------------------------------------------------------------


def test_vendor_error_text_stays_in_the_detail_and_out_of_what_clients_see(fake: FakeLLM) -> None:
    leak = "Incorrect API key provided: sk-proj-****************************wxyz. You can find your key at ..."
    fake.add("gpt-4o", {"steps": [{"faults": [{"status": 401, "message": leak}]}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("openai", fake.url), request("openai"))
    error = caught.value
    assert str(error) == "openai:gpt-4o: the provider rejected the API key (HTTP 401)"
    assert "wxyz" in error.detail and "wxyz" not in error.message
