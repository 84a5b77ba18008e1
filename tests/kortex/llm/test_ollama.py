"""Ollama specifics: models from /api/tags, and the pseudo-tool fallback for models without
native tool calls (rfc-005 §4.3)."""

from __future__ import annotations

import asyncio

from kortex.llm.base import ToolCallChunk, WarningChunk
from kortex.messages import AssistantMessage, ToolMessage, ToolResult, UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import collect, make_provider, request
from tests.kortex.llm.test_adapters import texts


def test_models_come_from_api_tags_with_the_configured_ones_first(fake: FakeLLM) -> None:
    fake.ollama_models = ["qwen2.5:7b", "llama3.2"]
    provider = make_provider("ollama", fake.url, fast_model="llama3.2:1b")
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
    assert provider.model_info("anything:pulled-later").id == "anything:pulled-later"


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
