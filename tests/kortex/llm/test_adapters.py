"""Each vendor adapter against the fake server: a whole tool-use exchange in the vendor's wire
format, and the failures a network and a vendor can produce."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import aclosing

import pytest

from kortex.errors import ProviderError
from kortex.llm.base import DoneChunk, TextChunk, TokenUsage, ToolCallChunk
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import VENDORS, collect, make_provider, model_of, request

LOGS_ARGS = {"product": "checkout", "time_range": "last 30m"}
TOOL_TURN = {"steps": [
    {"text": ["Checking ", "the logs."], "usage": {"input_tokens": 120, "output_tokens": 30},
     "tool_calls": [{"id": "call_logs1", "name": "get_logs", "arguments": LOGS_ARGS, "fragments": 5}]},
    {"text": ["The pool ", "ran dry."], "usage": {"input_tokens": 200, "output_tokens": 12}},
]}


def texts(chunks: list) -> list[str]:
    return [c.text for c in chunks if isinstance(c, TextChunk)]


def calls(chunks: list) -> list:
    return [c.call for c in chunks if isinstance(c, ToolCallChunk)]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_tool_use_exchange_in_each_vendors_wire_format(transport: str, fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), TOOL_TURN)
    provider = make_provider(vendor, fake.url, transport=transport)
    first = collect(provider, request(vendor))
    assert texts(first) == ["Checking ", "the logs."]  # streamed piece by piece
    [call] = calls(first)
    assert call.name == "get_logs" and call.arguments == LOGS_ARGS and call.arguments_error is None
    assert isinstance(first[-1], DoneChunk) and first[-1].stop_reason == "tool_use"
    assert first[-1].usage == TokenUsage(input_tokens=120, output_tokens=30)

    result = ToolResult(call_id=call.id, name="get_logs", content={"lines": [{"message": "pool exhausted"}]})
    history = (UserMessage(content="why is checkout slow?"),
               AssistantMessage(content="Checking the logs.", tool_calls=(call,)), ToolMessage(result=result))
    second = collect(provider, request(vendor, *history))
    assert "".join(texts(second)) == "The pool ran dry." and second[-1].stop_reason == "end_turn"
    assert second[-1].usage.output_tokens == 12

    sent = fake.requests[-1]
    body, headers = sent.body, sent.headers
    result_json = '{"lines":[{"message":"pool exhausted"}]}'
    if vendor == "anthropic":
        assert call.id == "call_logs1"
        assert headers["x-api-key"] == "test-key" and headers["anthropic-version"] == "2023-06-01"
        assert body["system"] == "You investigate." and body["stream"] is True
        assert body["tools"][0]["input_schema"]["required"] == ["product"]
        assert body["messages"][1] == {"role": "assistant", "content": [
            {"type": "text", "text": "Checking the logs."},
            {"type": "tool_use", "id": "call_logs1", "name": "get_logs", "input": LOGS_ARGS}]}
        assert body["messages"][2] == {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_logs1", "content": result_json}]}
    elif vendor == "openai":
        assert call.id == "call_logs1"
        assert headers["authorization"] == "Bearer test-key"
        assert body["messages"][0] == {"role": "system", "content": "You investigate."}
        assert body["stream_options"] == {"include_usage": True} and body["tools"][0]["type"] == "function"
        assistant = body["messages"][2]
        assert assistant["tool_calls"][0]["id"] == "call_logs1"
        assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == LOGS_ARGS
        assert body["messages"][3] == {"role": "tool", "tool_call_id": "call_logs1", "content": result_json}
    else:
        assert call.id.startswith("call_")  # Ollama assigns none; we do
        assert body["messages"][0] == {"role": "system", "content": "You investigate."}
        assert body["messages"][2]["tool_calls"] == [{"function": {"name": "get_logs", "arguments": LOGS_ARGS}}]
        assert body["messages"][3] == {"role": "tool", "content": result_json, "tool_name": "get_logs"}
        assert body["options"]["num_predict"] == 4096


@pytest.mark.parametrize("vendor", VENDORS)
def test_consecutive_streams_reuse_one_connection(transport: str, fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["a", "b"]}]})
    provider = make_provider(vendor, fake.url, transport=transport)

    async def run() -> None:
        try:
            for _ in range(3):
                assert texts([c async for c in provider.stream(request(vendor))]) == ["a", "b"]
        finally:
            await provider.aclose()

    asyncio.run(run())
    assert fake.stats.requests == 3 and fake.stats.connections == 1  # each body was read to its end


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
def test_streamed_arguments_that_are_not_json_become_a_correctable_call(transport: str, fake: FakeLLM,
                                                                        vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"tool_calls": [
        {"id": "bad1", "name": "get_logs", "arguments_raw": '{"product": "checkout", "time_ra', "fragments": 3},
        {"id": "list1", "name": "get_logs", "arguments_raw": "[1, 2]"},
        {"id": "ok1", "name": "get_logs", "arguments": {"product": "api"}}]}]})
    chunks = collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    bad, listed, ok = calls(chunks)
    assert (bad.arguments, bad.arguments_error) == ({}, "invalid_json")
    assert listed.arguments_error == "invalid_json"  # valid JSON, but not an object
    assert ok.arguments == {"product": "api"} and ok.arguments_error is None


@pytest.mark.parametrize("vendor", VENDORS)
def test_max_tokens_is_reported_as_such(transport: str, fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["The deploy at 14:31 ", "changed"], "stop_reason": "max_tokens"}]})
    chunks = collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert chunks[-1].stop_reason == "max_tokens" and texts(chunks) == ["The deploy at 14:31 ", "changed"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_429_is_retried_after_the_servers_retry_after(transport: str, fake: FakeLLM, vendor: str,
                                                      waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": 429, "retry_after": 2, "message": "slow down"}],
                                           "text": ["ok"]}]})
    chunks = collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert texts(chunks) == ["ok"] and len(fake.requests) == 2
    assert len(waits) == 1 and 2.0 <= waits[0] <= 2.2  # the server's pause, plus a little jitter


@pytest.mark.parametrize("vendor", VENDORS)
def test_5xx_backs_off_exponentially_and_gives_up_after_max_retries(transport: str, fake: FakeLLM, vendor: str,
                                                                    waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"faults": [{"status": 500}] * 5, "text": ["never"]}]})
    provider = make_provider(vendor, fake.url, transport=transport, max_retries=2, retry_base=1.0)
    with pytest.raises(ProviderError) as caught:
        collect(provider, request(vendor))
    error = caught.value
    assert error.status == 500 and error.retryable and error.code == "provider_server_error"
    assert error.provider == vendor and "fake failure" in error.detail  # for the logs; the message is ours
    assert str(error) == f"{vendor}:{model_of(vendor)}: the provider had a server error (HTTP 500)"
    assert len(fake.requests) == 3 and len(waits) == 2
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0  # base * 2^n, with jitter in [50%, 100%]


def test_a_retry_after_beyond_the_limit_gives_up_at_once(transport: str, fake: FakeLLM, waits: list[float]) -> None:
    fake.add("claude-sonnet-4-6", {"steps": [{"faults": [{"status": 529, "retry_after": 120}], "text": ["x"]}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("anthropic", fake.url, transport=transport, retry_max_wait=30), request("anthropic"))
    assert caught.value.retry_after == 120 and caught.value.code == "provider_overloaded"
    assert waits == [] and len(fake.requests) == 1  # the router may fail over instead


@pytest.mark.parametrize(("status", "code"), [(400, "provider_rejected"), (401, "provider_auth"),
                                              (404, "provider_not_found")])
def test_client_errors_are_not_retried(transport: str, fake: FakeLLM, waits: list[float], status: int,
                                       code: str) -> None:
    fake.add("gpt-4o", {"steps": [{"faults": [{"status": status, "message": "nope, that did not work"}],
                                   "text": ["x"]}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("openai", fake.url, transport=transport), request("openai"))
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (status, code, False)
    # the vendor's words stay for operators (scrubbed: the 401's type names a key, so the word
    # after it goes), and never reach the client's message
    assert "did not work" in caught.value.detail and "did not work" not in str(caught.value)
    assert len(fake.requests) == 1 and waits == []


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_connection_reset_before_any_output_is_retried(transport: str, fake: FakeLLM, vendor: str,
                                                         waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"faults": [{"disconnect": True}], "text": ["recovered"]}]})
    chunks = collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert texts(chunks) == ["recovered"] and len(waits) == 1


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_connection_reset_mid_stream_fails_after_the_text_it_sent(transport: str, fake: FakeLLM, vendor: str,
                                                                    waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["one ", "two ", "three"], "disconnect_after": 2}]})
    provider = make_provider(vendor, fake.url, transport=transport)
    got: list = []

    async def run() -> None:
        try:
            async with aclosing(provider.stream(request(vendor))) as chunks:
                async for chunk in chunks:
                    got.append(chunk)
        finally:
            await provider.aclose()

    with pytest.raises(ProviderError) as caught:
        asyncio.run(run())
    assert texts(got) == ["one ", "two "]
    assert caught.value.code == "stream_interrupted" and caught.value.retryable
    assert waits == [] and len(fake.requests) == 1  # text went out: a retry would say it twice


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_truncated_stream_is_an_error_not_a_short_answer(transport: str, fake: FakeLLM, vendor: str,
                                                           waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["one ", "two"], "truncate_after": 1}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert caught.value.code == "stream_truncated" and caught.value.retryable


@pytest.mark.parametrize("vendor", VENDORS)
def test_an_in_stream_error_event_raises(transport: str, fake: FakeLLM, vendor: str, waits: list[float]) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["partial"], "stream_error": {"type": "overloaded_error",
                                                                                  "message": "Overloaded"}}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert "Overloaded" in caught.value.detail and caught.value.provider == vendor


def test_connection_refused_is_retryable_and_bounded(transport: str, waits: list[float]) -> None:
    with FakeLLM() as closed:
        url = closed.url
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("anthropic", url, transport=transport, max_retries=1), request("anthropic"))
    assert caught.value.code == "connect_failed" and caught.value.retryable and len(waits) == 1
    assert "test-key" not in str(caught.value)


def test_a_stalled_stream_hits_the_read_timeout(transport: str, fake: FakeLLM) -> None:
    fake.add("gpt-4o", {"steps": [{"text": ["late"], "delay_ms": 2000}]})
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("openai", fake.url, transport=transport, timeout=0.2, max_retries=0), request("openai"))
    assert caught.value.code == "read_timeout" and caught.value.retryable


@pytest.mark.parametrize("vendor", VENDORS)
def test_cancelling_the_consumer_closes_the_http_stream(transport: str, fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": [f"t{i} " for i in range(200)], "delay_ms": 20}]})
    provider = make_provider(vendor, fake.url, transport=transport)
    got: list = []

    async def consume() -> None:
        async for chunk in provider.stream(request(vendor)):
            got.append(chunk)

    async def run() -> None:
        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await provider.aclose()

    asyncio.run(run())
    deadline = time.monotonic() + 5
    while fake.stats.client_disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.stats.client_disconnects == 1 and fake.stats.streams_completed == 0
    assert len(got) < 10


def test_anthropic_request_translation_details(transport: str, fake: FakeLLM) -> None:
    fake.add("claude-haiku-4-6", {"steps": [{"text": ["ok"]}], "loop": True})
    history = (
        ToolMessage(result=ToolResult(call_id="orphan", name="get_logs")),  # cut by the history limit
        UserMessage(content="q"),
        AssistantMessage(content="", tool_calls=(ToolCall(id="a.1", name="get_logs"),
                                                 ToolCall(id="b", name="get_logs"))),
        ToolMessage(result=ToolResult(call_id="a.1", name="get_logs", content={"x": 1})),
        ToolMessage(result=ToolResult(call_id="b", name="get_logs", content={"error": "timeout"}, is_error=True)),
    )
    req = request("anthropic", *history).model_copy(update={"model": "claude-haiku-4-6", "temperature": 1.5,
                                                             "stop": ("END",)})
    collect(make_provider("anthropic", fake.url, transport=transport), req)
    body = fake.requests[-1].body
    assert body["temperature"] == 1.0 and body["stop_sequences"] == ["END"]
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    uses = [b["id"] for b in body["messages"][1]["content"]]
    results = body["messages"][2]["content"]
    assert uses[1] == "b" and uses[0] != "a.1" and uses[0].startswith("call_")  # '.' is not allowed in ids
    assert [r["tool_use_id"] for r in results] == uses  # both results in one message, matched
    assert results[1]["is_error"] is True and "is_error" not in results[0]


def test_openai_parameters_for_reasoning_models_and_compatible_servers(transport: str, fake: FakeLLM) -> None:
    for model in ("gpt-5", "gpt-4o", "local-llama"):
        fake.add(model, {"steps": [{"text": ["ok"]}]})
    official = make_provider("openai", fake.url, transport=transport)
    official.official = True  # what a base_url on api.openai.com means
    collect(official, request("openai").model_copy(update={"model": "gpt-5"}))
    body = fake.requests[-1].body
    assert body["max_completion_tokens"] == 4096 and "temperature" not in body and "max_tokens" not in body
    compatible = make_provider("openai", fake.url, transport=transport, model="local-llama")
    chunks = collect(compatible, request("openai").model_copy(update={"model": "local-llama"}))
    assert texts(chunks) == ["ok"]
    body = fake.requests[-1].body
    assert body["max_tokens"] == 4096 and body["temperature"] == 0.2
    assert compatible.model_info("local-llama").input_usd_per_mtok == 0  # configured, unpriced: free, and said so
    assert any("local-llama" in p and "$0" in p for p in compatible.problems)


@pytest.mark.parametrize("style", ["interleaved", "no_index"])
def test_openai_tool_call_deltas_interleaved_or_without_index(transport: str, fake: FakeLLM, style: str) -> None:
    fake.add("gpt-4o", {"steps": [{"tool_call_style": style, "tool_calls": [
        {"id": "call_a", "name": "get_logs", "arguments": LOGS_ARGS, "fragments": 4},
        {"id": "call_b", "name": "get_metrics", "arguments": {"product": "api"}, "fragments": 2}]}]})
    chunks = collect(make_provider("openai", fake.url, transport=transport), request("openai"))
    assert [(c.id, c.name, c.arguments) for c in calls(chunks)] == [
        ("call_a", "get_logs", LOGS_ARGS), ("call_b", "get_metrics", {"product": "api"})]
    assert chunks[-1].stop_reason == "tool_use"


def test_openai_usage_in_the_same_chunk_as_finish_reason(transport: str, fake: FakeLLM) -> None:
    fake.add("gpt-4o", {"steps": [{"text": ["ok"], "usage_with_finish": True,
                                   "usage": {"input_tokens": 33, "output_tokens": 4}}]})
    chunks = collect(make_provider("openai", fake.url, transport=transport), request("openai"))
    assert chunks[-1].usage == TokenUsage(input_tokens=33, output_tokens=4)


@pytest.mark.parametrize("vendor", VENDORS)
def test_multibyte_text_split_across_network_reads(transport: str, fake: FakeLLM, vendor: str) -> None:
    fake.add(model_of(vendor), {"steps": [{"text": ["café ☕ ", "終わり"], "split_bytes": 2}]})
    chunks = collect(make_provider(vendor, fake.url, transport=transport), request(vendor))
    assert texts(chunks) == ["café ☕ ", "終わり"]
