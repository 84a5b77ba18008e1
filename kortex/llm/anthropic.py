"""Anthropic Messages API (``POST /v1/messages``, streamed as SSE) over raw HTTP.

Our conversation becomes ``messages`` with ``text``, ``tool_use`` and ``tool_result`` content
blocks; the stream's ``input_json_delta`` fragments are assembled here into whole tool calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
_STOP: dict[str, StopReason] = {"end_turn": "end_turn", "tool_use": "tool_use", "max_tokens": "max_tokens",
                                "stop_sequence": "stop_sequence", "model_context_window_exceeded": "max_tokens",
                                "pause_turn": "end_turn", "refusal": "end_turn"}
# Stream `error` event types worth another try (the HTTP status of a stream is already 200).
_RETRYABLE_ERRORS = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


class AnthropicProvider(SSEProvider):
    catalogue = catalog.ANTHROPIC

    def __init__(self, name: str, config: ProviderSettings, settings: Settings, api_key: str) -> None:
        super().__init__(name, config, settings)
        base = config.base_url or DEFAULT_BASE_URL
        headers = {"x-api-key": api_key, "anthropic-version": API_VERSION, "accept": "text/event-stream"}
        self.secrets = request_secrets(headers)  # the key may come from ANTHROPIC_API_KEY
        self.http = VendorClient(provider=name, base_url=base, config=config, transport=settings.llm.http_transport,
                                 headers=headers)
        self.path = api_path(base, "/v1/messages")

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

    def decoder(self, model: str) -> Decoder:
        return Decoder(self.name, model)


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    """Alternating user/assistant messages; the results of one step's calls travel together in
    the next user message as ``tool_result`` blocks keyed by ``tool_use_id``."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in paired(from_user_turn(request.messages)):
        if isinstance(message, UserMessage):
            # The API refuses empty and whitespace-only text blocks.
            add("user", [{"type": "text", "text": message.content if message.content.strip() else "(empty)"}])
        elif isinstance(message, AssistantMessage):
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": message.content}] if message.content.strip() else [])
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
    """Turns one stream's SSE events into our chunks. Every field is type-checked: a frame of
    the wrong shape is a ``stream_invalid`` failure, never a crash."""

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.finished = False
        self._tools = CallAssembler()
        self._stop: StopReason = "end_turn"
        self.usage = TokenUsage()

    def at_end(self) -> Iterator[StreamChunk]:
        raise failure("stream_truncated", provider=self.provider, model=self.model, retryable=True, usage=self.usage,
                      detail="the stream ended before message_stop")
        yield  # pragma: no cover - a generator, as the protocol asks

    def _invalid(self, what: str) -> ProviderError:
        return failure("stream_invalid", provider=self.provider, model=self.model, usage=self.usage, detail=what)

    def _dict(self, value: Any, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self._invalid(f"{what} is not an object")
        return value

    def _index(self, data: dict[str, Any]) -> int:
        index = data.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise self._invalid(f"{data.get('type')} without an integer index")
        return index

    def feed(self, event: SSEvent) -> Iterator[StreamChunk]:
        if event.event == "ping":
            return
        try:
            data = event.json()
        except ValueError as exc:
            raise self._invalid("an event that is not JSON") from exc
        data = self._dict(data, "an event")
        kind = data.get("type", event.event)
        if kind == "content_block_delta":
            delta = self._dict(data.get("delta"), "content_block_delta.delta")
            if delta.get("type") == "text_delta":
                text = delta.get("text")
                if not isinstance(text, str | None):
                    raise self._invalid("text_delta.text is not a string")
                if text:
                    yield TextChunk(text=text)
            elif delta.get("type") == "input_json_delta":
                index = self._index(data)
                part = delta.get("partial_json")
                if not isinstance(part, str | None):
                    raise self._invalid("input_json_delta.partial_json is not a string")
                if index in self._tools and part:
                    self._tools.append(index, part)
            # thinking, signature and citation deltas are not part of our answer
        elif kind == "content_block_start":
            block = self._dict(data.get("content_block"), "content_block_start.content_block")
            if block.get("type") == "tool_use":
                initial = self._dict(block.get("input"), "tool_use.input")
                self._tools.start(self._index(data), str(block.get("id") or ""), str(block.get("name") or ""),
                                  initial)
            elif block.get("type") == "text":
                text = block.get("text")
                if not isinstance(text, str | None):
                    raise self._invalid("a text block's text is not a string")
                if text:
                    yield TextChunk(text=text)
        elif kind == "content_block_stop":
            call = self._tools.finish(self._index(data))
            if call is not None:
                yield ToolCallChunk(call=call)
        elif kind == "message_start":
            message = self._dict(data.get("message"), "message_start.message")
            model = message.get("model")
            self.model = model if isinstance(model, str) and model else self.model
            if self._usage(self._dict(message.get("usage"), "message_start.usage")):
                yield UsageChunk(usage=self.usage)  # the prompt is billed from here on
        elif kind == "message_delta":
            stop = self._dict(data.get("delta"), "message_delta.delta").get("stop_reason")
            if isinstance(stop, str) and stop:
                self._stop = _STOP.get(stop, "end_turn")
            if self._usage(self._dict(data.get("usage"), "message_delta.usage")):
                yield UsageChunk(usage=self.usage)
        elif kind == "message_stop":
            self.finished = True
            for call in self._tools.finish_all():  # blocks never stopped: the message still ended
                yield ToolCallChunk(call=call)
            yield DoneChunk(stop_reason=self._stop, model=self.model, usage=self.usage)
        elif kind == "error":
            error = self._dict(data.get("error"), "error.error")
            etype = str(error.get("type") or "error")
            raise failure("provider_overloaded" if etype == "overloaded_error" else "provider_stream_error",
                          provider=self.provider, model=self.model, retryable=etype in _RETRYABLE_ERRORS,
                          usage=self.usage, detail=f"{etype}: {error.get('message') or 'stream error'}")

    def _usage(self, usage: dict[str, Any]) -> bool:
        """Counts on message_delta are cumulative. ``input_tokens`` excludes the prompt-cache
        reads and writes, which are billed input too (at their own prices)."""
        def count(key: str) -> int | None:
            value = usage.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

        plain, read, write, out = (count(k) for k in ("input_tokens", "cache_read_input_tokens",
                                                      "cache_creation_input_tokens", "output_tokens"))
        if plain is None and read is None and write is None and out is None:
            return False
        current = self.usage
        if plain is not None or read is not None or write is not None:
            read = read if read is not None else current.cache_read_tokens
            write = write if write is not None else current.cache_write_tokens
            plain = plain if plain is not None else current.input_tokens - current.cache_read_tokens - \
                current.cache_write_tokens
            current = TokenUsage(input_tokens=plain + read + write, output_tokens=current.output_tokens,
                                 cache_read_tokens=read, cache_write_tokens=write)
        if out is not None:
            current = current.model_copy(update={"output_tokens": out})
        self.usage = current.most(self.usage)
        return True


def create(name: str, config: ProviderSettings, settings: Settings) -> AnthropicProvider:
    if config.api_key:
        key = clean_api_key(config.api_key.get_secret_value(), name, f"llm.providers.{name}.api_key")
    else:
        key = clean_api_key(os.environ.get("ANTHROPIC_API_KEY"), name, "ANTHROPIC_API_KEY")
    if not key:
        raise ProviderUnavailable("no API key: set ANTHROPIC_API_KEY or llm.providers.anthropic.api_key",
                                  provider=name)
    return AnthropicProvider(name, config, settings, key)
