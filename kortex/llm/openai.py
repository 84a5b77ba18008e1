"""OpenAI Chat Completions (``POST /v1/chat/completions``, streamed as SSE) over raw HTTP.

Works against any OpenAI-compatible server through ``base_url``. Streamed ``tool_calls``
deltas are assembled by ``index``; usage arrives in the last chunk (``include_usage``).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm import catalog
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    StopReason,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
)
from kortex.llm.convert import from_user_turn, parse_arguments, result_text, wire_id
from kortex.llm.http import HTTPProvider, VendorClient, api_path
from kortex.llm.wire import SSEvent, sse_events
from kortex.messages import AssistantMessage, ToolMessage, UserMessage

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_STOP: dict[str, StopReason] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                                "function_call": "tool_use", "content_filter": "end_turn"}
# Reasoning models accept only the default temperature.
_FIXED_TEMPERATURE = ("gpt-5", "o1", "o3", "o4")


class OpenAIProvider(HTTPProvider):
    def __init__(self, name: str, config: ProviderSettings, settings: Settings, api_key: str | None) -> None:
        super().__init__(name, config, settings)
        base = config.base_url or DEFAULT_BASE_URL
        headers = {"accept": "text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.http = VendorClient(provider=name, base_url=base, headers=headers, config=config,
                                 transport=settings.llm.http_transport)
        self.path = api_path(base, "/v1/chat/completions")
        self.official = "api.openai.com" in base
        self._models = catalog.priced(catalog.OPENAI, config)

    def models(self) -> Sequence[ModelInfo]:
        return self._models

    def unknown_model(self, model_id: str) -> ModelInfo:
        # A compatible server (vLLM, llama.cpp, LiteLLM, ...) names its own models; they cost
        # what the configuration says, nothing by default.
        if not self.official:
            return ModelInfo(id=model_id, display_name=model_id)
        return super().unknown_model(model_id)

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

    async def _stream_once(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        model = request.model or self.default_model().id
        decoder = Decoder(self.name, model)
        async with self.http.post_stream(self.path, self.body(request), model=model) as response:
            async for event in sse_events(response.aiter_bytes()):
                if decoder.finished:
                    continue  # read on to the end of the body, so the connection can be reused
                for chunk in decoder.feed(event):
                    yield chunk
        if decoder.finished:
            return
        if decoder.stop is not None:  # a server that omits [DONE] after a complete answer
            for chunk in decoder.finish():
                yield chunk
            return
        raise ProviderError("the stream ended before the model finished", provider=self.name, model=model,
                            retryable=True, code="stream_truncated")


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in from_user_turn(request.messages):
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            if not message.content and not message.tool_calls:
                continue
            item: dict[str, Any] = {"role": "assistant", "content": message.content or None}
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
    """Turns one stream's chunks into ours; tool calls are whole once the choice finishes."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.finished = False
        self.stop: str | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage = TokenUsage()

    def feed(self, event: SSEvent) -> Iterator[StreamChunk]:
        if event.data.strip() == "[DONE]":
            if self.stop is None:
                raise ProviderError("the stream ended before the model finished", provider=self.provider,
                                    model=self.model, retryable=True, code="stream_truncated")
            yield from self.finish()
            return
        try:
            data = event.json()
        except ValueError as exc:
            raise ProviderError("the stream sent an event that is not JSON", provider=self.provider,
                                model=self.model, code="stream_invalid") from exc
        if not isinstance(data, dict):
            return
        if data.get("error"):
            error = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
            kind = str(error.get("type") or error.get("code") or "error")
            raise ProviderError(f"{kind}: {error.get('message') or 'stream error'}"[:300], provider=self.provider,
                                model=self.model, code="provider_stream_error",
                                retryable=kind in ("server_error", "rate_limit_exceeded", "overloaded"))
        self.model = data.get("model") or self.model
        usage = data.get("usage")
        if isinstance(usage, dict):
            self._usage = TokenUsage(input_tokens=int(usage.get("prompt_tokens") or 0),
                                     output_tokens=int(usage.get("completion_tokens") or 0))
        for choice in data.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # we ask for one choice
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("refusal")
            if text:
                yield TextChunk(text=text)
            for part in delta.get("tool_calls") or ():
                call = self._calls.setdefault(int(part.get("index", len(self._calls))),
                                              {"id": "", "name": "", "arguments": []})
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["name"] = function.get("name") or call["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])
            if choice.get("finish_reason"):
                self.stop = choice["finish_reason"]

    def finish(self) -> Iterator[StreamChunk]:
        self.finished = True
        for index in sorted(self._calls):
            call = self._calls[index]
            yield ToolCallChunk(call=parse_arguments(call["id"], call["name"], "".join(call["arguments"])))
        stop = _STOP.get(self.stop or "stop", "end_turn")
        if self._calls and stop == "end_turn":
            stop = "tool_use"  # some compatible servers say "stop" after tool calls
        yield DoneChunk(stop_reason=stop, usage=self._usage, model=self.model)


def create(name: str, config: ProviderSettings, settings: Settings) -> OpenAIProvider:
    key = config.api_key.get_secret_value() if config.api_key else os.environ.get("OPENAI_API_KEY")
    if not key and "api.openai.com" in (config.base_url or DEFAULT_BASE_URL):
        # api.openai.com needs a key; a compatible server elsewhere may not.
        raise ProviderUnavailable("no API key: set OPENAI_API_KEY or llm.providers.openai.api_key", provider=name)
    return OpenAIProvider(name, config, settings, key)
