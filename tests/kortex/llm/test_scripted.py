"""The scripted provider replays steps by conversation position."""

from __future__ import annotations

import asyncio

import pytest

from kortex.errors import ProviderError
from kortex.llm.base import CompletionRequest, DoneChunk, TextChunk, ToolCallChunk
from kortex.llm.scripted import Script, ScriptedProvider
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage

SCRIPT = Script.model_validate({"steps": [
    {"text": ["a", "b"], "tool_calls": [{"name": "t", "arguments": {"x": 1}},
                                        {"name": "u", "arguments_raw": "{nope"}]},
    {"text": ["done"], "usage": {"input_tokens": 7, "output_tokens": 2}},
]})


def _collect(provider, messages):
    async def go():
        return [c async for c in provider.stream(CompletionRequest(model="s", messages=tuple(messages)))]
    return asyncio.run(go())


def test_plays_the_step_after_the_last_user_message() -> None:
    p = ScriptedProvider({"s": SCRIPT})
    first = _collect(p, [UserMessage(content="q")])
    assert [type(c) for c in first] == [TextChunk, TextChunk, ToolCallChunk, ToolCallChunk, DoneChunk]
    assert first[2].call.arguments == {"x": 1}
    assert first[3].call.arguments_error == "invalid_json"
    assert first[-1].stop_reason == "tool_use"
    history = [UserMessage(content="q"), AssistantMessage(content="ab", tool_calls=(ToolCall(id="1", name="t"),)),
               ToolMessage(result=ToolResult(call_id="1", name="t"))]
    second = _collect(p, history)
    assert second[0].text == "done" and second[-1].usage.input_tokens == 7 and second[-1].stop_reason == "end_turn"
    with pytest.raises(ProviderError):
        _collect(p, [*history, AssistantMessage(content="done")])


def test_unknown_scripts_and_bad_names_are_errors(tmp_path) -> None:
    p = ScriptedProvider(dirs=[tmp_path])
    with pytest.raises(ProviderError):
        p.script("missing")
    with pytest.raises(ProviderError):
        p.script("../etc/passwd")
    (tmp_path / "x.json").write_text('{"steps": [{"text": ["hi"]}]}')
    assert p.script("x").steps[0].text == ["hi"]
    assert "x" in [m.id for m in p.models()]


def test_raw_arguments_with_nan_or_an_overflowing_number_are_invalid_json() -> None:
    script = Script.model_validate({"steps": [{"tool_calls": [
        {"id": "nan", "name": "t", "arguments_raw": '{"x": NaN}'},
        {"id": "inf", "name": "t", "arguments_raw": '{"x": -Infinity}'},
        {"id": "big", "name": "t", "arguments_raw": '{"x": 1e400}'},
        {"id": "ok", "name": "t", "arguments_raw": '{"x": 1e300}'}]}]})
    chunks = _collect(ScriptedProvider({"s": script}), [UserMessage(content="q")])
    calls = {c.call.id: c.call for c in chunks if isinstance(c, ToolCallChunk)}
    assert [calls[i].arguments_error for i in ("nan", "inf", "big", "ok")] == ["invalid_json"] * 3 + [None]
    assert calls["ok"].arguments == {"x": 1e300}
