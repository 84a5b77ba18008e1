"""The conversation as each vendor must receive it: no whitespace-only text blocks, every tool
call answered right after it (the fake server refuses what the real APIs refuse)."""

from __future__ import annotations

import pytest

from kortex.llm.base import DoneChunk
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import VENDORS, collect, make_provider, model_of, request
from tests.kortex.llm.test_adapters import texts

CALL = ToolCall(id="call_1", name="get_logs", arguments={"product": "checkout"})
RESULT = ToolMessage(result=ToolResult(call_id="call_1", name="get_logs", content={"lines": []}))


def _answers(fake: FakeLLM, vendor: str, *history: object) -> dict:
    fake.add(model_of(vendor), {"steps": [{"text": ["fine"]}], "loop": True})
    chunks = collect(make_provider(vendor, fake.url), request(vendor, *history))
    assert texts(chunks) == ["fine"] and isinstance(chunks[-1], DoneChunk)
    return fake.requests[-1].body


@pytest.mark.parametrize("vendor", VENDORS)
def test_whitespace_only_assistant_text_is_not_sent_as_a_text_block(fake: FakeLLM, vendor: str) -> None:
    body = _answers(fake, vendor, UserMessage(content="why?"), AssistantMessage(content=" \n\t "),
                    UserMessage(content="and now?"),
                    AssistantMessage(content="\n\n", tool_calls=(CALL,)), RESULT)
    if vendor == "anthropic":
        blocks = [b for m in body["messages"] for b in m["content"] if b.get("type") == "text"]
        assert all(b["text"].strip() for b in blocks)
        assert body["messages"][1]["content"][0]["type"] == "tool_use"
    elif vendor == "openai":
        assistant = [m for m in body["messages"] if m["role"] == "assistant"]
        assert [m["content"] for m in assistant] == [None]  # the empty one dropped, the call's kept


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_call_left_without_a_result_is_answered_with_an_error_result(fake: FakeLLM, vendor: str) -> None:
    # A turn that failed while its tool ran leaves the call without a result; the next message
    # in the session must still be accepted.
    body = _answers(fake, vendor, UserMessage(content="why?"),
                    AssistantMessage(content="Checking.", tool_calls=(CALL,)),
                    UserMessage(content="still there?"))
    sent = str(body["messages"])
    assert "no_result" in sent and "still there?" in sent
    if vendor == "anthropic":
        first, *rest = body["messages"][2]["content"]
        assert first["type"] == "tool_result" and first["is_error"] and rest[-1]["text"] == "still there?"


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
def test_a_result_without_its_call_is_left_out(fake: FakeLLM, vendor: str) -> None:
    body = _answers(fake, vendor, UserMessage(content="why?"), AssistantMessage(content="Looked already."),
                    RESULT, UserMessage(content="so?"))
    assert "call_1" not in str(body["messages"])


def test_the_fake_refuses_what_anthropic_refuses(fake: FakeLLM) -> None:
    import httpx

    def post(messages: list) -> httpx.Response:
        return httpx.post(f"{fake.url}/v1/messages", json={"model": "m", "max_tokens": 5, "messages": messages},
                          headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})

    blank = post([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text", "text": " "}]},
                  {"role": "user", "content": "q2"}])
    assert blank.status_code == 400 and "non-whitespace" in blank.text
    dangling = post([{"role": "user", "content": "q"},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
                     {"role": "user", "content": [{"type": "text", "text": "q2"}]}])
    assert dangling.status_code == 400 and "without tool_result" in dangling.text
    openai_dangling = httpx.post(f"{fake.url}/v1/chat/completions", headers={"authorization": "Bearer k"}, json={
        "model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                   "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "x", "arguments": "{}"}}]},
                                   {"role": "user", "content": "q2"}]})
    assert openai_dangling.status_code == 400 and "c1" in openai_dangling.text
