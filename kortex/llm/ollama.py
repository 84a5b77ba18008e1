"""Ollama (``POST /api/chat``, streamed as NDJSON): the local provider; models come from
``GET /api/tags``. Models that refuse native ``tools`` get prompt-injected pseudo-tools
(rfc-005 §4.3) with a visible warning."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError
from kortex.ids import new_call_id
from kortex.llm import pseudotools
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
    WarningChunk,
)
from kortex.llm.convert import from_user_turn, parse_arguments, result_text
from kortex.llm.http import HTTPProvider, VendorClient
from kortex.llm.wire import ndjson_lines
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage

DEFAULT_ENDPOINT = "http://127.0.0.1:11434"
DEFAULT_CONTEXT = 8192
TAGS_TTL = 30.0
MAX_REMEMBERED = 256


class OllamaProvider(HTTPProvider):
    local = True

    def __init__(self, name: str, config: ProviderSettings, settings: Settings) -> None:
        super().__init__(name, config, settings)
        endpoint = config.endpoint or config.base_url or os.environ.get("OLLAMA_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:  # OLLAMA_HOST is often written host:port
            endpoint = "http://" + endpoint
        self.endpoint = endpoint.rstrip("/")
        headers = {"accept": "application/x-ndjson"}
        if config.api_key:  # Ollama has no auth; a reverse proxy in front of it may
            headers["authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self.http = VendorClient(provider=name, base_url=self.endpoint, headers=headers, config=config,
                                 transport=settings.llm.http_transport)
        self._pulled: tuple[str, ...] = ()
        self._pulled_at = 0.0
        self._refresh_lock: asyncio.Lock | None = None
        self._no_native_tools: set[str] = set()

    # -- models ---------------------------------------------------------------------------

    def _info(self, model_id: str) -> ModelInfo:
        tier = "fast" if model_id == self.config.fast_model else "balanced"
        return ModelInfo(id=model_id, display_name=f"{model_id} (local)", tier=tier,
                         context_tokens=self.config.context_tokens or DEFAULT_CONTEXT,
                         supports_tools=model_id not in self._no_native_tools)

    def models(self) -> Sequence[ModelInfo]:
        """The configured models first (the default leads), then whatever ``/api/tags`` listed."""
        ids = [m for m in (self.config.model, self.config.fast_model) if m]
        ids += [m for m in self._pulled if m not in ids]
        return [self._info(m) for m in ids]

    def unknown_model(self, model_id: str) -> ModelInfo:
        return self._info(model_id)  # any pulled (or soon pulled) model may be asked for

    async def refresh_models(self, timeout: float = 2.0) -> Sequence[ModelInfo]:
        """Ask ``/api/tags`` which models are pulled (cached for a short while)."""
        if self._refresh_lock is None:
            self._refresh_lock = asyncio.Lock()
        async with self._refresh_lock:
            if time.monotonic() - self._pulled_at > TAGS_TTL:
                data = await self.http.get_json("/api/tags", timeout=timeout)
                models = data.get("models") if isinstance(data, dict) else None
                self._pulled = tuple(str(m.get("name") or m.get("model")) for m in models or ()
                                     if isinstance(m, dict) and (m.get("name") or m.get("model")))
                self._pulled_at = time.monotonic()
        return self.models()

    def default_model(self) -> ModelInfo:
        models = self.models()
        if not models:
            raise ProviderError("no model configured: set llm.providers.ollama.model (or pull one)",
                                provider=self.name)
        return models[0]

    # -- streaming ------------------------------------------------------------------------

    async def _stream_once(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        if not request.model and not self.config.model and not self._pulled:
            try:
                await self.refresh_models()
            except ProviderError:
                pass  # default_model() below says what is missing
        model = request.model or self.default_model().id
        pseudo = bool(request.tools) and (self.config.native_tools is False or model in self._no_native_tools)
        if request.tools and not pseudo:
            try:
                async for chunk in self._chat(request, model, pseudo=False):
                    yield chunk
                return
            except ProviderError as exc:
                if not (exc.status == 400 and "does not support tools" in exc.message):
                    raise
                if len(self._no_native_tools) < MAX_REMEMBERED:
                    self._no_native_tools.add(model)
                pseudo = True
        if pseudo:
            yield WarningChunk(code="pseudo_tools", message=(
                f"{self.name}:{model} has no native tool calling; tools are offered through prompt "
                "markers instead (best effort: the model may ignore or garble them)"))
        async for chunk in self._chat(request, model, pseudo=pseudo):
            yield chunk

    def body(self, request: CompletionRequest, model: str, *, pseudo: bool) -> dict[str, Any]:
        system = pseudotools.system_prompt(request.system, request.tools) if pseudo else request.system
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages += pseudotools.to_plain_messages(request.messages) if pseudo else to_messages(request)
        options: dict[str, Any] = {"temperature": request.temperature, "num_predict": request.max_tokens}
        if request.stop:
            options["stop"] = list(request.stop)
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": True, "options": options}
        if request.tools and not pseudo:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.input_schema}}
                             for t in request.tools]
        return body

    async def _chat(self, request: CompletionRequest, model: str, *, pseudo: bool) -> AsyncIterator[StreamChunk]:
        parser = pseudotools.MarkerParser() if pseudo else None
        calls = 0
        finished = False
        body = self.body(request, model, pseudo=pseudo)
        async with self.http.post_stream("/api/chat", body, model=model) as response:
            async for line in ndjson_lines(response.aiter_bytes()):
                if finished:
                    continue  # read on to the end of the body, so the connection can be reused
                if line.get("error"):
                    raise ProviderError(str(line["error"])[:300], provider=self.name, model=model,
                                        code="provider_stream_error")
                message = line.get("message") or {}
                text = message.get("content")
                if text:
                    for chunk in _pieces(parser.feed(text)) if parser else (TextChunk(text=text),):
                        calls += isinstance(chunk, ToolCallChunk)
                        yield chunk
                for part in message.get("tool_calls") or ():
                    function = part.get("function") or {}
                    calls += 1
                    yield ToolCallChunk(call=parse_arguments(str(part.get("id") or new_call_id()),
                                                             str(function.get("name") or ""),
                                                             function.get("arguments")))
                if line.get("done"):
                    if parser:
                        for chunk in _pieces(parser.finish()):
                            calls += isinstance(chunk, ToolCallChunk)
                            yield chunk
                    reason = line.get("done_reason")
                    stop = "max_tokens" if reason == "length" else "tool_use" if calls else "end_turn"
                    finished = True
                    yield DoneChunk(stop_reason=stop, model=str(line.get("model") or model), usage=TokenUsage(
                        input_tokens=int(line.get("prompt_eval_count") or 0),
                        output_tokens=int(line.get("eval_count") or 0)))
        if finished:
            return
        raise ProviderError("the stream ended before done", provider=self.name, model=model, retryable=True,
                            code="stream_truncated")


def _pieces(items: list[str | ToolCall]) -> list[StreamChunk]:
    return [TextChunk(text=i) if isinstance(i, str) else ToolCallChunk(call=i) for i in items if i]


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in from_user_turn(request.messages):
        if isinstance(message, UserMessage):
            out.append({"role": "user", "content": message.content})
        elif isinstance(message, AssistantMessage):
            item: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                item["tool_calls"] = [{"function": {"name": c.name, "arguments": c.arguments}}
                                      for c in message.tool_calls]
            out.append(item)
        elif isinstance(message, ToolMessage):
            out.append({"role": "tool", "content": result_text(message.result), "tool_name": message.result.name})
    return out


def create(name: str, config: ProviderSettings, settings: Settings) -> OllamaProvider:
    return OllamaProvider(name, config, settings)
