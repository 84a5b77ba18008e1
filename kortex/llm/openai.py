"""OpenAI Chat Completions (``POST /v1/chat/completions``, streamed as SSE) over raw HTTP.

Works against any OpenAI-compatible server through ``base_url``; its models must be listed in
the configuration (``model``, ``fast_model``, ``prices``) unless ``allow_unlisted_models`` is
set. Streamed ``tool_calls`` deltas are assembled by ``index`` (servers that omit it: a
fragment with an ``id`` opens a call, one without continues the last; servers that send every
call at one index: a new ``id`` there opens a call); usage arrives in the last chunk
(``include_usage``), possibly together with ``finish_reason``.

A body that ends without ``[DONE]`` is accepted once ``finish_reason`` came, unless a usage
chunk was still owed: api.openai.com always sends one for ``include_usage``, and so does any
server whose chunks carry ``"usage": null`` (the API's documented way of saying one will
follow). Without it the answer would be costed at nothing; the body was cut. A compatible
server that shows no sign of honouring ``include_usage`` is taken at its word that the body is
whole. A call whose usage never came (no sign of it, or ``null`` keys and then ``[DONE]``) is
billed an estimate, marked so (``TokenUsage.estimate``: the prompt as sent and the answer, at
four characters a token): costed at nothing, it would pass every budget and cost ceiling.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Any

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm import catalog
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    StopReason,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
    UsageChunk,
)
from kortex.llm.convert import CallAssembler, from_user_turn, paired, result_text, wire_id
from kortex.llm.failures import failure
from kortex.llm.http import SSEProvider
from kortex.llm.vendor import VendorClient, api_path, clean_api_key
from kortex.llm.wire import SSEvent
from kortex.messages import AssistantMessage, ToolMessage, UserMessage
from kortex.redaction import request_secrets

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_STOP: dict[str, StopReason] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                                "function_call": "tool_use", "content_filter": "end_turn"}
# Reasoning models accept only the default temperature.
_FIXED_TEMPERATURE = ("gpt-5", "o1", "o3", "o4")


class OpenAIProvider(SSEProvider):
    catalogue = catalog.OPENAI

    def __init__(self, name: str, config: ProviderSettings, settings: Settings, api_key: str | None) -> None:
        super().__init__(name, config, settings)
        base = config.base_url or DEFAULT_BASE_URL
        headers = {"accept": "text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.secrets = request_secrets(headers)  # the key may come from OPENAI_API_KEY
        self.http = VendorClient(provider=name, base_url=base, headers=headers, config=config,
                                 transport=settings.llm.http_transport)
        self.path = api_path(base, "/v1/chat/completions")
        self.official = "api.openai.com" in base

    def body(self, request: CompletionRequest) -> dict[str, Any]:
        model = request.model or self.default_model().id
        messages: list[dict[str, Any]] = [{"role": "system", "content": request.system}] if request.system else []
        messages += to_messages(request)
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                                "stream_options": {"include_usage": True}}
        # api.openai.com wants max_completion_tokens (reasoning models reject max_tokens);
        # compatible servers widely know only max_tokens.
        body["max_completion_tokens" if self.official else "max_tokens"] = request.max_tokens
        if not model.startswith(_FIXED_TEMPERATURE):
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.input_schema}}
                             for t in request.tools]
        if request.stop:
            body["stop"] = list(request.stop)
        return body

    def decoder(self, model: str) -> Decoder:
        return Decoder(self.name, model, usage_owed=self.official)

    async def _stream_once(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        async with aclosing(super()._stream_once(request)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, DoneChunk) and chunk.usage.estimated:
                    # The decoder estimated the answer it read; the prompt is known only here.
                    prompt = TokenUsage.estimate(input_chars=prompt_chars(self.body(request)))
                    chunk = chunk.model_copy(update={"usage": chunk.usage + prompt})
                yield chunk


def prompt_chars(body: dict[str, Any]) -> int:
    """Characters of the prompt a body sends: its messages and tool schemas as JSON (the
    punctuation stands in for the chat template the server wraps them in)."""
    return len(json.dumps([body.get("messages") or [], body.get("tools") or []], ensure_ascii=False,
                          separators=(",", ":")))


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in paired(from_user_turn(request.messages)):
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            if not message.content.strip() and not message.tool_calls:
                continue
            item: dict[str, Any] = {"role": "assistant", "content": message.content if message.content.strip() else None}
            if message.tool_calls:
                item["tool_calls"] = [
                    {"id": wire_id(c.id), "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                    for c in message.tool_calls]
            out.append(item)
        elif isinstance(message, ToolMessage):
            # No is_error flag in this API: error results say {"error": ...} in their content.
            out.append({"role": "tool", "tool_call_id": wire_id(message.result.call_id),
                        "content": result_text(message.result)})
    return out


class Decoder:
    """Turns one stream's chunks into ours; tool calls are whole once the choice finishes. Every
    field is type-checked: a frame of the wrong shape is ``stream_invalid``, never a crash."""

    def __init__(self, provider: str, model: str, *, usage_owed: bool = False) -> None:
        self.provider = provider
        self.model = model
        self.finished = False
        self.stop: str | None = None
        self._calls = CallAssembler()
        self._last_key: int | None = None
        self._slots: dict[int, int] = {}  # a wire index -> the key of the call it names now
        self._next_key = 0  # keys in the order calls opened (finish_all sorts by key)
        self.usage = TokenUsage()
        self.usage_owed = usage_owed  # the server will send a usage chunk (see the module docstring)
        self.usage_seen = False
        self.output_chars = 0  # text and tool calls received: what an answer without usage is billed by

    def _invalid(self, what: str) -> ProviderError:
        return failure("stream_invalid", provider=self.provider, model=self.model, usage=self.usage, detail=what)

    def _dict(self, value: Any, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._invalid(f"{what} is not an object")
        return value

    def _list(self, value: Any, what: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._invalid(f"{what} is not a list")
        return value

    def _text(self, value: Any, what: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._invalid(f"{what} is not a string")
        return value

    def at_end(self) -> Iterator[StreamChunk]:
        if self.stop is None:
            raise failure("stream_truncated", provider=self.provider, model=self.model, retryable=True,
                          usage=self.usage, detail="the stream ended before the model finished")
        if self.usage_owed and not self.usage_seen:
            raise failure("stream_truncated", provider=self.provider, model=self.model, retryable=True,
                          usage=self.usage, detail="the stream ended after finish_reason, before its usage chunk")
        yield from self.finish()  # a server that omits [DONE] after a complete answer

    def feed(self, event: SSEvent) -> Iterator[StreamChunk]:
        if event.data.strip() == "[DONE]":
            if self.stop is None:
                raise failure("stream_truncated", provider=self.provider, model=self.model, retryable=True,
                              usage=self.usage, detail="[DONE] before a finish_reason")
            yield from self.finish()
            return
        try:
            data = event.json()
        except ValueError as exc:
            raise self._invalid("an event that is not JSON") from exc
        data = self._dict(data, "a chunk")
        if data.get("error"):
            error = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
            kind = str(error.get("type") or error.get("code") or "error")
            raise failure("provider_stream_error", provider=self.provider, model=self.model, usage=self.usage,
                          retryable=kind in ("server_error", "rate_limit_exceeded", "overloaded"),
                          detail=f"{kind}: {error.get('message') or 'stream error'}")
        model = data.get("model")
        self.model = model if isinstance(model, str) and model else self.model
        if "usage" in data:
            self.usage_owed = True  # the key, null before the last chunk: include_usage is honoured
            usage = data["usage"]
            if usage is not None:
                self.usage = self._usage(self._dict(usage, "usage"))
                self.usage_seen = True
                yield UsageChunk(usage=self.usage)
        for choice in self._list(data.get("choices"), "choices"):
            choice = self._dict(choice, "a choice")
            if choice.get("index", 0) not in (0, None):
                continue  # we ask for one choice
            delta = self._dict(choice.get("delta"), "delta")
            text = self._text(delta.get("content"), "delta.content") or self._text(delta.get("refusal"),
                                                                                 "delta.refusal")
            if text:
                self.output_chars += len(text)
                yield TextChunk(text=text)
            for part in self._list(delta.get("tool_calls"), "delta.tool_calls"):
                self._tool_part(self._dict(part, "a tool call delta"))
            finish = choice.get("finish_reason")
            if finish:
                self.stop = self._text(finish, "finish_reason")

    def _tool_part(self, part: dict[str, Any]) -> None:
        call_id = self._text(part.get("id"), "tool_calls.id")
        function = self._dict(part.get("function"), "tool_calls.function")
        name = self._text(function.get("name"), "function.name")
        arguments = self._text(function.get("arguments"), "function.arguments")
        self.output_chars += len(name) + len(arguments)
        index = part.get("index")
        if index is None:
            # Servers that send no index: an id opens a call, a fragment without one continues
            # the last (a null index is read the same way).
            last = self._last_key
            opens = last is None or bool(call_id and call_id != self._calls.id_of(last))
            key = self._new_key() if opens else last
        elif isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            key = self._slots.get(index)
            # Some compatible servers send every call at index 0: another id there is another
            # call (merged, two calls' arguments would make one call of invalid JSON). A
            # fragment without an id, or repeating it, continues the call.
            if key is None or (call_id and self._calls.id_of(key) not in ("", call_id)):
                key = self._slots[index] = self._new_key()
        else:
            raise self._invalid("tool_calls.index is not a non-negative integer")
        assert key is not None
        self._calls.start(key, call_id, name)
        self._calls.update(key, call_id=call_id, name=name)
        if arguments:
            self._calls.append(key, arguments)
        self._last_key = key

    def _new_key(self) -> int:
        self._next_key += 1
        return self._next_key - 1

    def _usage(self, usage: dict[str, Any]) -> TokenUsage:
        def count(value: Any) -> int:
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        details = usage.get("prompt_tokens_details")
        cached = count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        prompt = count(usage.get("prompt_tokens"))
        return TokenUsage(input_tokens=prompt, output_tokens=count(usage.get("completion_tokens")),
                          cache_read_tokens=min(cached, prompt))  # part of prompt_tokens, billed lower

    def finish(self) -> Iterator[StreamChunk]:
        self.finished = True
        if not self.usage_seen:
            self.usage = TokenUsage.estimate(output_chars=self.output_chars)  # the provider adds the prompt
        calls = self._calls.finish_all()
        for call in calls:
            yield ToolCallChunk(call=call)
        stop = _STOP.get(self.stop or "stop", "end_turn")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some compatible servers say "stop" after tool calls
        yield DoneChunk(stop_reason=stop, usage=self.usage, model=self.model)


def create(name: str, config: ProviderSettings, settings: Settings) -> OpenAIProvider:
    if config.api_key:
        key = clean_api_key(config.api_key.get_secret_value(), name, f"llm.providers.{name}.api_key")
    else:
        key = clean_api_key(os.environ.get("OPENAI_API_KEY"), name, "OPENAI_API_KEY")
    if not key and "api.openai.com" in (config.base_url or DEFAULT_BASE_URL):
        # api.openai.com needs a key; a compatible server elsewhere may not.
        raise ProviderUnavailable("no API key: set OPENAI_API_KEY or llm.providers.openai.api_key", provider=name)
    return OpenAIProvider(name, config, settings, key)
