"""Anthropic Messages API (``POST /v1/messages``, streamed as SSE) over raw HTTP.

Our conversation becomes ``messages`` with ``text``, ``tool_use`` and ``tool_result`` content
blocks; the stream's ``input_json_delta`` fragments are assembled here into whole tool calls.
"""

from __future__ import annotations

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

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_STOP: dict[str, StopReason] = {"end_turn": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens",
                                "stop_sequence": "stop_sequence", "model_context_window_exceeded": "max_tokens",
                                "pause_turn": "end_turn", "refusal": "end_turn"}
# Stream `error` event types worth another try (the HTTP status of a stream is already 200).
_RETRYABLE_ERRORS = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


class AnthropicProvider(HTTPProvider):
    def __init__(self, name: str, config: ProviderSettings, settings: Settings, api_key: str) -> None:
        super().__init__(name, config, settings)
        base = config.base_url or DEFAULT_BASE_URL
        self.http = VendorClient(provider=name, base_url=base, config=config, transport=settings.llm.http_transport,
                                 headers={"x-api-key": api_key, "anthropic-version": API_VERSION,
                                          "accept": "text/event-stream"})
        self.path = api_path(base, "/v1/messages")
        self._models = catalog.priced(catalog.ANTHROPIC, config)

    def models(self) -> Sequence[ModelInfo]:
        return self._models

    def body(self, request: CompletionRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or self.default_model().id,
            "max_tokens": request.max_tokens,
            "messages": to_messages(request),
            "stream": True,
            "temperature": min(request.temperature, 1.0),  # Anthropic's range is 0..1
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                             for t in request.tools]
        if request.stop:
            body["stop_sequences"] = list(request.stop)
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
        raise ProviderError("the stream ended before message_stop", provider=self.name, model=model,
                            retryable=True, code="stream_truncated")


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    """Alternating user/assistant messages; the results of one step's calls travel together in
    the next user message as ``tool_result`` blocks keyed by ``tool_use_id``."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in from_user_turn(request.messages):
        if isinstance(message, UserMessage):
            add("user", [{"type": "text", "text": message.content}])
        elif isinstance(message, AssistantMessage):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
            blocks += [{"type": "tool_use", "id": wire_id(c.id), "name": c.name, "input": c.arguments}
                       for c in message.tool_calls]
            if blocks:  # an empty assistant message is rejected; it carries nothing anyway
                add("assistant", blocks)
        elif isinstance(message, ToolMessage):
            result = message.result
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": wire_id(result.call_id),
                                     "content": result_text(result)}
            if result.is_error:
                block["is_error"] = True
            add("user", [block])
    return out


class Decoder:
    """Turns one stream's SSE events into our chunks."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.finished = False
        self._tools: dict[int, tuple[str, str, list[str], dict[str, Any]]] = {}
        self._stop: StopReason = "end_turn"
        self._input = 0
        self._output = 0

    def feed(self, event: SSEvent) -> Iterator[StreamChunk]:
        kind = event.event
        if kind == "ping":
            return
        try:
            data = event.json()
        except ValueError as exc:
            raise ProviderError("the stream sent an event that is not JSON", provider=self.provider,
                                model=self.model, code="stream_invalid") from exc
        kind = data.get("type", kind) if isinstance(data, dict) else kind
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                if delta.get("text"):
                    yield TextChunk(text=delta["text"])
            elif delta.get("type") == "input_json_delta":
                tool = self._tools.get(data.get("index", -1))
                if tool is not None:
                    tool[2].append(delta.get("partial_json") or "")
            # thinking, signature and citation deltas are not part of our answer
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                self._tools[data.get("index", -1)] = (str(block.get("id") or ""), str(block.get("name") or ""), [],
                                                      block.get("input") or {})
            elif block.get("type") == "text" and block.get("text"):
                yield TextChunk(text=block["text"])
        elif kind == "content_block_stop":
            tool = self._tools.pop(data.get("index", -1), None)
            if tool is not None:
                call_id, name, parts, initial = tool
                yield ToolCallChunk(call=parse_arguments(call_id, name, "".join(parts) if parts else initial))
        elif kind == "message_start":
            message = data.get("message") or {}
            self.model = message.get("model") or self.model
            self._usage(message.get("usage") or {})
        elif kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason")
            if stop:
                self._stop = _STOP.get(stop, "end_turn")
            self._usage(data.get("usage") or {})
        elif kind == "message_stop":
            self.finished = True
            yield DoneChunk(stop_reason=self._stop, model=self.model,
                            usage=TokenUsage(input_tokens=self._input, output_tokens=self._output))
        elif kind == "error":
            error = data.get("error") or {}
            etype = str(error.get("type") or "error")
            raise ProviderError(f"{etype}: {error.get('message') or 'stream error'}"[:300], provider=self.provider,
                                model=self.model, retryable=etype in _RETRYABLE_ERRORS,
                                code="provider_overloaded" if etype == "overloaded_error" else "provider_stream_error")

    def _usage(self, usage: dict[str, Any]) -> None:
        # Counts on message_delta are cumulative; cache reads and writes are billed input too.
        inputs = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
        if any(isinstance(v, int) for v in inputs):
            self._input = max(self._input, sum(v for v in inputs if isinstance(v, int)))
        if isinstance(usage.get("output_tokens"), int):
            self._output = max(self._output, usage["output_tokens"])


def create(name: str, config: ProviderSettings, settings: Settings) -> AnthropicProvider:
    key = config.api_key.get_secret_value() if config.api_key else os.environ.get("ANTHROPIC_API_KEY")
    if not key:
        raise ProviderUnavailable("no API key: set ANTHROPIC_API_KEY or llm.providers.anthropic.api_key",
                                  provider=name)
    return AnthropicProvider(name, config, settings, key)
