"""Ollama specifics: models from /api/tags, and the pseudo-tool fallback for models without
native tool calls (rfc-005 §4.3)."""

from __future__ import annotations

import asyncio

import pytest

from kortex.config import Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm.base import ToolCallChunk, WarningChunk
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import plan
from kortex.messages import AssistantMessage, ToolMessage, ToolResult, UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import TRANSPORTS, collect, make_provider, request, vendor_config
from tests.kortex.llm.test_adapters import texts


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_models_come_from_api_tags_with_the_configured_ones_first(fake: FakeLLM, transport: str) -> None:
    fake.ollama_models = ["qwen2.5:7b", "llama3.2"]
    provider = make_provider("ollama", fake.url, transport=transport, fast_model="llama3.2:1b")
    before = [m.id for m in provider.models()]
    assert before == ["llama3.2", "llama3.2:1b"]

    async def refresh() -> list[str]:
        try:
            return [m.id for m in await provider.refresh_models()]
        finally:
            await provider.aclose()

    assert asyncio.run(refresh()) == ["llama3.2", "llama3.2:1b", "qwen2.5:7b"]
    info = provider.model_info("qwen2.5:7b")
    assert info.input_usd_per_mtok == 0 and info.output_usd_per_mtok == 0 and provider.local
    assert provider.model_info("llama3.2:1b").tier == "fast" and provider.fast_model().id == "llama3.2:1b"
    with pytest.raises(ProviderError) as caught:
        provider.model_info("anything:not-pulled")  # the list is fresh: not served here
    assert caught.value.code == "unknown_model"


def test_a_model_without_native_tools_falls_back_to_markers_with_a_warning(fake: FakeLLM) -> None:
    fake.add("tiny", {"native_tools": False, "steps": [
        {"text": ["Let me check. "], "tool_calls": [{"name": "get_logs", "arguments": {"product": "checkout"}}]},
        {"text": ["Pool exhausted."]}]})
    provider = make_provider("ollama", fake.url, model="tiny")
    req = request("ollama").model_copy(update={"model": "tiny"})
    first = collect(provider, req)
    warning = first[0]
    assert isinstance(warning, WarningChunk) and warning.code == "pseudo_tools" and "tiny" in warning.message
    [call] = [c.call for c in first if isinstance(c, ToolCallChunk)]
    assert (call.name, call.arguments) == ("get_logs", {"product": "checkout"})
    assert texts(first) == ["Let me check. "] and first[-1].stop_reason == "tool_use"
    refused, pseudo = fake.requests[0].body, fake.requests[1].body
    assert "tools" in refused and "tools" not in pseudo
    assert "<<TOOL name=" in pseudo["messages"][0]["content"] and "get_logs" in pseudo["messages"][0]["content"]

    history = (UserMessage(content="why is checkout slow?"),
               AssistantMessage(content="Let me check.", tool_calls=(call,)),
               ToolMessage(result=ToolResult(call_id=call.id, name="get_logs", content={"lines": 3})))
    second = collect(provider, req.model_copy(update={"messages": history}))
    assert texts(second) == ["Pool exhausted."]
    assert len(fake.requests) == 3  # the refusal is remembered: no second native attempt
    sent = fake.requests[-1].body["messages"]
    assert sent[-1] == {"role": "user", "content": 'Tool result (get_logs, ok):\n{"lines":3}'}
    assert not provider.model_info("tiny").supports_tools


def test_a_model_the_server_does_not_serve_is_refused_before_the_call(fake: FakeLLM) -> None:
    fake.ollama_models = ["llama3.2"]
    fake.add("qwen2.5:72b", {"steps": [{"text": ["would answer"]}]})  # the fake would serve it; /api/tags does not
    provider = make_provider("ollama", fake.url)
    assert provider.model_info("qwen2.5:72b").id == "qwen2.5:72b"  # not asked yet: checked before the call
    with pytest.raises(ProviderError) as caught:
        collect(provider, request("ollama").model_copy(update={"model": "qwen2.5:72b"}))
    assert caught.value.code == "unknown_model"
    assert [r.path for r in fake.requests] == ["/api/tags"]  # never sent to /api/chat
    unlisted = make_provider("ollama", fake.url, allow_unlisted_models=True)
    chunks = collect(unlisted, request("ollama").model_copy(update={"model": "qwen2.5:72b"}))
    assert texts(chunks) == ["would answer"]


@pytest.mark.parametrize("cloud", ["gpt-oss:120b-cloud", "glm-4.6:cloud"])
def test_local_only_refuses_ollama_cloud_models(fake: FakeLLM, cloud: str) -> None:
    fake.ollama_models = ["llama3.2", cloud]
    fake.add(cloud, {"steps": [{"text": ["sent to ollama.com"]}]})
    settings = Settings(llm={"mode": "local-only", "default_provider": "ollama", "providers": {
        "ollama": vendor_config("ollama", fake.url, fast_model=cloud)}})
    reg = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    with pytest.raises(ProviderUnavailable) as caught:
        plan(reg, f"ollama:{cloud}")
    assert caught.value.code == "local_only"
    provider = reg.get("ollama")
    asyncio.run(provider.refresh_models())  # type: ignore[attr-defined]
    assert cloud not in [m.id for m in provider.models()] and provider.fast_model() is None
    [status] = [s for s in reg.status() if s.name == "ollama"]
    assert status.available and any(cloud in p for p in status.problems)
    with pytest.raises(ProviderError):
        collect(provider, request("ollama").model_copy(update={"model": cloud}))
    assert not [r for r in fake.requests if r.path == "/api/chat"]
    normal = ProviderRegistry(Settings(llm={"providers": {"ollama": vendor_config("ollama", fake.url)}}),
                              BUILTIN_PROVIDERS)
    assert plan(normal, f"ollama:{cloud}")[0].model.id == cloud  # outside local-only: the operator pulled it


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_tags_lock_belongs_to_the_loop_that_uses_it(fake: FakeLLM, transport: str) -> None:
    fake.ollama_models = ["llama3.2"]
    provider = make_provider("ollama", fake.url, transport=transport)

    async def refresh_twice() -> None:
        provider._pulled_at = None  # type: ignore[attr-defined]  # stale: both refreshes contend for the lock
        await asyncio.gather(provider.refresh_models(), provider.refresh_models())  # type: ignore[attr-defined]
        await provider.aclose()

    asyncio.run(refresh_twice())
    asyncio.run(refresh_twice())  # another loop, as in a forked worker child
    assert [m.id for m in provider.models()] == ["llama3.2"]


def test_a_model_named_without_its_tag_is_the_latest_the_server_lists(fake: FakeLLM) -> None:
    fake.ollama_models = ["qwen2.5:latest"]
    fake.add("qwen2.5", {"steps": [{"text": ["served"]}]})
    provider = make_provider("ollama", fake.url)
    asyncio.run(provider.refresh_models())  # type: ignore[attr-defined]
    assert provider.model_info("qwen2.5").id == "qwen2.5"  # the list is fresh, and it is on it
    assert texts(collect(provider, request("ollama").model_copy(update={"model": "qwen2.5"}))) == ["served"]


@pytest.mark.parametrize("configured", [None, 32768])
def test_every_request_asks_for_the_context_window_routing_counts_on(fake: FakeLLM, configured: int | None) -> None:
    # Without num_ctx Ollama answers from its own default window (2048 or 4096 tokens) and cuts
    # a longer prompt from the front, where the system prompt and the tool instructions are.
    fake.add("tiny", {"native_tools": False, "loop": True, "steps": [{"text": ["ok"]}]})
    provider = make_provider("ollama", fake.url, model="tiny", context_tokens=configured)
    collect(provider, request("ollama").model_copy(update={"model": "tiny"}))  # native tools refused, then markers
    window = provider.model_info("tiny").context_tokens
    assert window == (configured or 8192)
    chats = [r.body for r in fake.requests if r.path == "/api/chat"]
    assert len(chats) == 2 and all(body["options"]["num_ctx"] == window for body in chats)
