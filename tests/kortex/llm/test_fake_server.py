"""The vendors' own Python clients accept what the fake server streams: so the fake speaks
the real formats, and the adapters tested against it are tested against the real formats."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from kortex.testing.fakellm import FakeLLM

ARGS = {"product": "checkout", "time_range": "last 30m"}
SCRIPT = {"steps": [{"text": ["Checking ", "the logs."], "usage": {"input_tokens": 50, "output_tokens": 20},
                     "tool_calls": [{"id": "toolu_01", "name": "get_logs", "arguments": ARGS, "fragments": 6}]},
                    {"text": ["Deploy v2.14.0 ", "exhausted the pool."], "stop_reason": "max_tokens"}]}
TOOL = {"name": "get_logs", "description": "Read logs",
        "input_schema": {"type": "object", "properties": {"product": {"type": "string"}}}}


@pytest.fixture
def served(fake: FakeLLM) -> FakeLLM:
    fake.add("scripted-model", SCRIPT)
    fake.default = "scripted-model"
    return fake


def test_the_anthropic_sdk_parses_text_tool_use_and_usage(served: FakeLLM) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="test-key", max_retries=0)
    messages: list = [{"role": "user", "content": "why?"}]
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=256, messages=messages, tools=[TOOL]) as stream:
        deltas = [e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        message = stream.get_final_message()
    assert deltas == ["Checking ", "the logs."]
    assert message.stop_reason == "tool_use" and message.usage.input_tokens == 50 and message.usage.output_tokens == 20
    text, tool = message.content
    assert text.text == "Checking the logs." and (tool.id, tool.name, tool.input) == ("toolu_01", "get_logs", ARGS)
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "{}"}]}]
    final = client.messages.create(model="claude-sonnet-4-6", max_tokens=256, messages=messages, stream=True)
    events = list(final)
    assert [e.type for e in events][0] == "message_start" and events[-1].type == "message_stop"
    assert any(e.type == "message_delta" and e.delta.stop_reason == "max_tokens" for e in events)


def test_the_anthropic_sdk_sees_our_errors_as_the_apis(served: FakeLLM) -> None:
    served.add("limited", {"steps": [{"faults": [{"status": 429, "retry_after": 3, "message": "slow down"}]}]})
    client = anthropic.Anthropic(base_url=served.url, api_key="test-key", max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as caught:
        client.messages.create(model="limited", max_tokens=10, messages=[{"role": "user", "content": "q"}], stream=True)
    assert caught.value.body["error"]["type"] == "rate_limit_error"
    assert caught.value.response.headers["retry-after"] == "3"
    served.add("broken", {"steps": [{"text": ["half"], "stream_error": {"type": "overloaded_error",
                                                                        "message": "Overloaded"}}]})
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        list(client.messages.create(model="broken", max_tokens=10, messages=[{"role": "user", "content": "q"}],
                                    stream=True))


def test_the_openai_sdk_assembles_tool_calls_and_reads_usage(served: FakeLLM) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="test-key", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_logs", "parameters": TOOL["input_schema"]}}]
    with client.chat.completions.stream(model="gpt-4o", messages=[{"role": "user", "content": "why?"}], tools=tools,
                                        stream_options={"include_usage": True}) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta" and e.delta]  # the API opens with ""
        completion = stream.get_final_completion()
    choice = completion.choices[0]
    assert deltas == ["Checking ", "the logs."] and choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id == "toolu_01" and call.function.name == "get_logs"
    assert json.loads(call.function.arguments) == ARGS  # assembled from six fragments
    assert completion.usage.prompt_tokens == 50 and completion.usage.completion_tokens == 20
    follow = [{"role": "user", "content": "why?"}, choice.message.model_dump(exclude_none=True),
              {"role": "tool", "tool_call_id": "toolu_01", "content": "{}"}]
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=follow, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Deploy v2.14.0 exhausted the pool."
    assert chunks[-1].choices[0].finish_reason == "length"


def test_the_openai_sdk_sees_our_errors_as_the_apis(served: FakeLLM) -> None:
    served.add("limited", {"steps": [{"faults": [{"status": 429, "retry_after": 1}]}]})
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="test-key", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="limited", messages=[{"role": "user", "content": "q"}], stream=True)
    bad = [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "nope", "content": "{}"}]
    with pytest.raises(openai.BadRequestError, match="tool"):  # the fake checks call/result pairing like the API
        client.chat.completions.create(model="gpt-4o", messages=bad, stream=True)


def test_the_ollama_client_streams_chat_with_tools_and_lists_models(served: FakeLLM) -> None:
    served.ollama_models = ["llama3.2:latest"]
    client = ollama.Client(host=served.url)
    tools = [{"type": "function", "function": {"name": "get_logs", "description": "d",
                                               "parameters": TOOL["input_schema"]}}]
    parts = list(client.chat(model="llama3.2", messages=[{"role": "user", "content": "why?"}], tools=tools,
                             stream=True))
    assert "".join(p.message.content or "" for p in parts) == "Checking the logs."
    [call] = [c for p in parts for c in p.message.tool_calls or []]
    assert call.function.name == "get_logs" and dict(call.function.arguments) == ARGS
    assert parts[-1].done and parts[-1].done_reason == "stop" and parts[-1].eval_count == 20
    assert [m.model for m in client.list().models] == ["llama3.2:latest"]
    served.add("tiny", {"native_tools": False, "steps": [{"text": ["x"]}]})
    with pytest.raises(ollama.ResponseError, match="does not support tools") as caught:
        list(client.chat(model="tiny", messages=[{"role": "user", "content": "q"}], tools=tools, stream=True))
    assert caught.value.status_code == 400


def test_the_fake_runs_as_its_own_process_for_benchmarks(tmp_path) -> None:
    import subprocess
    import sys

    from kortex.llm.base import TextChunk
    from tests.kortex.llm.conftest import collect, make_provider, request

    (tmp_path / "bench.json").write_text(json.dumps({"loop": True, "steps": [{"text": ["a", "b", "c"]}]}))
    proc = subprocess.Popen([sys.executable, "-m", "kortex.testing.fakellm", "--scripts", str(tmp_path),
                             "--default", "bench"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        chunks = collect(make_provider("openai", url), request("openai"))
        assert [c.text for c in chunks if isinstance(c, TextChunk)] == ["a", "b", "c"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_pacing_schedules_text_like_a_model_and_old_scripts_stay_unpaced() -> None:
    from kortex.testing.fakellm import FakeStep

    step = FakeStep(text=["t"] * 50, first_token_ms=300, tokens_per_s=60, piece_tokens=4)
    assert step.paced and step.text_due_s(0) == pytest.approx(0.3)
    assert step.text_due_s(1) == pytest.approx(0.3 + 4 / 60)
    assert step.text_due_s(49) == pytest.approx(0.3 + 49 * 4 / 60)  # 200 tokens at 60/s after the first
    only_first = FakeStep(text=["a", "b"], first_token_ms=50)
    assert only_first.paced and only_first.text_due_s(1) == pytest.approx(0.05)
    plain = FakeStep.model_validate({"text": ["a"], "delay_ms": 5})  # a script written before pacing existed
    assert not plain.paced and plain.text_due_s(3) == 0


def test_a_paced_stream_waits_on_the_schedule_for_text_only(served: FakeLLM) -> None:
    offsets: list[float] = []

    async def record(started: float, offset: float) -> None:
        offsets.append(offset)  # no real sleep: the schedule is what is checked, not the clock

    served._pause_until = record  # type: ignore[method-assign]
    served.add("paced", {"steps": [{"text": ["one ", "two ", "three"], "first_token_ms": 300, "tokens_per_s": 60,
                                    "piece_tokens": 4,
                                    "tool_calls": [{"id": "toolu_9", "name": "get_logs", "arguments": ARGS}]}]})
    client = anthropic.Anthropic(base_url=served.url, api_key="test-key", max_retries=0)
    with client.messages.stream(model="paced", max_tokens=64, messages=[{"role": "user", "content": "q"}],
                                tools=[TOOL]) as stream:
        deltas = [e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        message = stream.get_final_message()
    assert deltas == ["one ", "two ", "three"] and message.content[1].input == ARGS
    assert offsets == pytest.approx([0.3, 0.3 + 4 / 60, 0.3 + 8 / 60])
