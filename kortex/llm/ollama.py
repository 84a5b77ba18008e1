"""Ollama (``POST /api/chat``, streamed as NDJSON): the local provider; models come from
``GET /api/tags``. Models that refuse native ``tools`` get prompt-injected pseudo-tools
(rfc-005 §4.3) with a visible warning.

A caller may name only a model this server serves (``/api/tags``) or the configuration names,
unless ``allow_unlisted_models`` is set. Cloud models (``...:cloud``, ``...-cloud`` tags) run on
ollama.com, not here, and so does everything sent to an endpoint off this network (ollama.com
itself, with an ``api_key``): their requests leave the network (``leaves_network``), so the
conversation is scrubbed of credentials first, and local-only mode refuses them."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any
from urllib.parse import urlsplit

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.ids import new_call_id
from kortex.llm import catalog, pseudotools
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    StopReason,
    StreamChunk,
    TextChunk,
    Tier,
    TokenUsage,
    ToolCallChunk,
    UsageChunk,
    WarningChunk,
)
from kortex.llm.convert import MAX_CALLS, from_user_turn, paired, parse_arguments, result_text
from kortex.llm.failures import failure
from kortex.llm.http import HTTPProvider
from kortex.llm.vendor import VendorClient, clean_api_key, drain
from kortex.llm.wire import ndjson_lines
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://127.0.0.1:11434"
DEFAULT_CONTEXT = 8192
TAGS_TTL = 30.0
MAX_REMEMBERED = 256


def canonical(model_id: str) -> str:
    """Ollama's name for a model: without a tag it means ``:latest`` (``/api/tags`` lists tags)."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + ":latest"


def is_cloud_tag(model_id: str) -> bool:
    """Ollama's cloud models (``gpt-oss:120b-cloud``, ``glm-4.6:cloud``) are served by ollama.com."""
    tag = model_id.rsplit(":", 1)[-1].lower()
    return tag == "cloud" or tag.endswith("-cloud")


#: host names that name a private network, not the internet: special-use and private-use
#: suffixes (RFC 6761, 6762, 8375; ICANN's .internal) and the ones LANs commonly use
_PRIVATE_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa", ".intranet", ".corp", ".home",
                     ".private")


def endpoint_host(url: str) -> str:
    """The host of ``url`` (no port, no user info), lowercased; "" when it has none."""
    try:
        return (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return ""


def on_private_network(url: str) -> bool:
    """Whether ``url``'s host is this machine or on a private network: an address that is not
    global (loopback, private, link-local, shared as Tailscale's 100.64/10), ``localhost``, a
    name of one label (a container's or a LAN's, which only a local resolver knows) or a name
    under a private-use suffix. Any other name counts as the internet: whether a public-looking
    name resolves to a private address the name cannot say, and sending a conversation off the
    network unscrubbed is the mistake to avoid (such a server: name it by its address)."""
    host = endpoint_host(url)
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host or host.endswith(_PRIVATE_SUFFIXES)
    return not address.is_global


class OllamaProvider(HTTPProvider):
    local = True

    def __init__(self, name: str, config: ProviderSettings, settings: Settings) -> None:
        super().__init__(name, config, settings)
        self.local_only = settings.llm.local_only
        if self.local_only and config.model and is_cloud_tag(config.model):
            raise ProviderUnavailable(f"model {config.model!r} runs on ollama.com, which local-only mode forbids",
                                      provider=name, code="local_only")
        if self.local_only and config.fast_model and is_cloud_tag(config.fast_model):
            self.problems.append(f"fast_model {config.fast_model!r} runs on ollama.com, which local-only mode "
                                 "forbids; frugal mode has no fast model here")
            log.warning("llm.providers.%s: %s", name, self.problems[-1])
        endpoint = config.endpoint or config.base_url or os.environ.get("OLLAMA_HOST") or DEFAULT_ENDPOINT
        if "://" not in endpoint:  # OLLAMA_HOST is often written host:port
            endpoint = "http://" + endpoint
        self.endpoint = endpoint.rstrip("/")
        #: the server is off this network (ollama.com itself, a hosted Ollama): every request leaves it
        self.remote = not on_private_network(self.endpoint)
        if self.local_only and self.remote:
            host = endpoint_host(self.endpoint) or "(none)"
            raise ProviderUnavailable(f"endpoint host {host!r} is not on a private network, which local-only mode "
                                      "forbids (a server on yours: name it by its address)",
                                      provider=name, code="local_only")
        headers = {"accept": "application/x-ndjson"}
        # Ollama has no auth; a reverse proxy in front of it may
        key = clean_api_key(config.api_key.get_secret_value() if config.api_key else None, name,
                            f"llm.providers.{name}.api_key")
        if key:
            headers["authorization"] = f"Bearer {key}"
        self.http = VendorClient(provider=name, base_url=self.endpoint, headers=headers, config=config,
                                 transport=settings.llm.http_transport)
        self._pulled: tuple[str, ...] = ()
        self._pulled_at: float | None = None
        # An asyncio.Lock belongs to the loop that first waits on it; a forked worker child or
        # a second loop needs its own.
        self._refresh_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._no_native_tools: set[str] = set()

    def leaves_network(self, model_id: str | None = None) -> bool:
        return self.remote or (model_id is not None and is_cloud_tag(model_id))

    # -- models ---------------------------------------------------------------------------

    def _where(self, model_id: str) -> str:
        """Where a model runs, for its display name: never "local" for one that is not."""
        if is_cloud_tag(model_id):
            return "cloud: ollama.com"
        return f"remote: {endpoint_host(self.endpoint)}" if self.remote else "local"

    def _info(self, model_id: str) -> ModelInfo:
        tier: Tier = "fast" if model_id == self.config.fast_model else "balanced"
        # Free unless priced: a cloud model an operator pulled is billed by ollama.com.
        return catalog.with_price(ModelInfo(id=model_id, display_name=f"{model_id} ({self._where(model_id)})",
                                            tier=tier, context_tokens=self.context_tokens,
                                            supports_tools=model_id not in self._no_native_tools), self.config)

    @property
    def context_tokens(self) -> int:
        """The context window routing counts on, and the one each request asks Ollama for."""
        return self.config.context_tokens or DEFAULT_CONTEXT

    def _configured(self) -> list[str]:
        return [m for m in (self.config.model, self.config.fast_model, *self.config.prices) if m]

    def _allowed_here(self, model_id: str) -> bool:
        return catalog.valid_id(model_id) and not (self.local_only and is_cloud_tag(model_id))

    def models(self) -> Sequence[ModelInfo]:
        """The configured models first (the default leads), then whatever ``/api/tags`` listed;
        in local-only mode without the cloud ones."""
        ids = self._configured()
        ids += [m for m in self._pulled if m not in ids]
        return [self._info(m) for m in dict.fromkeys(ids) if self._allowed_here(m)]

    def model_info(self, model_id: str | None) -> ModelInfo:
        if model_id and self.local_only and is_cloud_tag(model_id):
            raise ProviderUnavailable(f"model {model_id!r} runs on ollama.com, which local-only mode forbids",
                                      provider=self.name, model=model_id, code="local_only")
        return super().model_info(model_id)

    def _listed(self, model_id: str, *, pulled_only: bool = False) -> bool:
        wanted = canonical(model_id)
        names = self._pulled if pulled_only else (*self._configured(), *self._pulled)
        return any(canonical(m) == wanted for m in names)

    def unknown_model(self, model_id: str) -> ModelInfo:
        if self._listed(model_id):
            return self._info(model_id)  # "llama3.2" is the "llama3.2:latest" the server lists
        if self.config.allow_unlisted_models:
            return self._info(model_id).model_copy(update={"caller_named": True})
        if self._tags_stale() and catalog.valid_id(model_id):
            # Not listed because the server was not asked lately: accepted for now, checked
            # against /api/tags before the call (this runs in code that cannot wait for it).
            return self._info(model_id)
        return super().unknown_model(model_id)

    def _tags_stale(self) -> bool:
        return self._pulled_at is None or time.monotonic() - self._pulled_at > TAGS_TTL

    async def refresh_models(self, timeout: float = 2.0) -> Sequence[ModelInfo]:
        """Ask ``/api/tags`` which models are pulled (cached for a short while)."""
        loop = asyncio.get_running_loop()
        if self._refresh_lock is None or self._refresh_lock[0] is not loop:
            self._refresh_lock = (loop, asyncio.Lock())
        async with self._refresh_lock[1]:
            if self._tags_stale():
                data = await self.http.get_json("/api/tags", timeout=timeout)
                models = data.get("models") if isinstance(data, dict) else None
                self._pulled = tuple(str(m.get("name") or m.get("model")) for m in
                                     (models if isinstance(models, list) else ())
                                     if isinstance(m, dict) and (m.get("name") or m.get("model")))
                self._pulled_at = time.monotonic()
        return self.models()

    async def _check_served(self, model: str) -> None:
        """A model the configuration does not name must be one this server lists."""
        self.model_info(model)  # local-only refuses cloud models, whoever names them
        if self.config.allow_unlisted_models or model in self._configured():
            return
        await self.refresh_models()  # a no-op while the list is fresh
        if not self._listed(model, pulled_only=True):
            raise ProviderError(f"model {model!r} is not offered by {self.name}", provider=self.name, model=model,
                                code="unknown_model", detail="not served by this Ollama (/api/tags)")

    def default_model(self) -> ModelInfo:
        models = self.models()
        if not models:
            raise ProviderError("no model configured: set llm.providers.ollama.model (or pull one)",
                                provider=self.name)
        return models[0]

    # -- streaming ------------------------------------------------------------------------

    async def _stream_once(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        if not request.model and not self.config.model and not self._pulled:
            try:
                await self.refresh_models()
            except ProviderError:
                pass  # default_model() below says what is missing
        model = request.model or self.default_model().id
        await self._check_served(model)
        pseudo = bool(request.tools) and (self.config.native_tools is False or model in self._no_native_tools)
        if request.tools and not pseudo:
            try:
                async with aclosing(self._chat(request, model, pseudo=False)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except ProviderError as exc:
                if not (exc.status == 400 and "does not support tools" in exc.detail):
                    raise
                if len(self._no_native_tools) < MAX_REMEMBERED:
                    self._no_native_tools.add(model)
                pseudo = True
        if pseudo:
            yield WarningChunk(code="pseudo_tools", message=(
                f"{self.name}:{model} has no native tool calling; tools are offered through prompt "
                "markers instead (best effort: the model may ignore or garble them)"))
        async with aclosing(self._chat(request, model, pseudo=pseudo)) as chunks:
            async for chunk in chunks:
                yield chunk

    def body(self, request: CompletionRequest, model: str, *, pseudo: bool) -> dict[str, Any]:
        system = pseudotools.system_prompt(request.system, request.tools) if pseudo else request.system
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages += pseudotools.to_plain_messages(request.messages) if pseudo else to_messages(request)
        # num_ctx always: left out, Ollama uses its own default window (2048 or 4096 tokens, by
        # version), smaller than the one routing assumes, and silently drops the start of a
        # longer prompt: the system prompt and the tool instructions.
        options: dict[str, Any] = {"temperature": request.temperature, "num_predict": request.max_tokens,
                                   "num_ctx": self.context_tokens}
        if request.stop:
            options["stop"] = list(request.stop)
        body: dict[str, Any] = {"model": model, "messages": messages, "stream": True, "options": options}
        if request.tools and not pseudo:
            body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.input_schema}}
                             for t in request.tools]
        return body

    async def _chat(self, request: CompletionRequest, model: str, *,
                    pseudo: bool) -> AsyncGenerator[StreamChunk, None]:
        parser = pseudotools.MarkerParser() if pseudo else None
        calls = 0
        body = self.body(request, model, pseudo=pseudo)

        def invalid(what: str) -> ProviderError:
            return failure("stream_invalid", provider=self.name, model=model, detail=what)

        def counted(chunk: StreamChunk) -> StreamChunk:
            nonlocal calls
            if isinstance(chunk, ToolCallChunk):
                calls += 1
                if calls > MAX_CALLS:
                    raise invalid(f"more than {MAX_CALLS} tool calls in one answer")
            return chunk

        async with self.http.post_stream("/api/chat", body, model=model) as response:
            async with aclosing(ndjson_lines(response.aiter_bytes())) as lines:
                async for line in lines:
                    if line.get("error"):
                        raise failure("provider_stream_error", provider=self.name, model=model,
                                      detail=str(line["error"]))
                    message = line.get("message") or {}
                    if not isinstance(message, dict):
                        raise invalid("message is not an object")
                    text = message.get("content")
                    if not isinstance(text, str | None):
                        raise invalid("message.content is not a string")
                    if text:
                        for chunk in _pieces(parser.feed(text)) if parser else (TextChunk(text=text),):
                            yield counted(chunk)
                    parts = message.get("tool_calls") or ()
                    if not isinstance(parts, list | tuple):
                        raise invalid("message.tool_calls is not a list")
                    for part in parts:
                        function = part.get("function") if isinstance(part, dict) else None
                        if not isinstance(function, dict) or not isinstance(function.get("arguments"),
                                                                            dict | str | None):
                            raise invalid("a tool call without a function object")
                        call_id = part.get("id")
                        yield counted(ToolCallChunk(call=parse_arguments(
                            call_id if isinstance(call_id, str) and call_id else new_call_id(),
                            str(function.get("name") or ""), function.get("arguments"))))
                    if line.get("done"):
                        if parser:
                            for chunk in _pieces(parser.finish()):
                                yield counted(chunk)
                        reason = line.get("done_reason")
                        stop: StopReason = "max_tokens" if reason == "length" else "tool_use" if calls else "end_turn"
                        usage = TokenUsage(input_tokens=_count(line.get("prompt_eval_count")),
                                           output_tokens=_count(line.get("eval_count")))
                        yield UsageChunk(usage=usage)
                        done_model = line.get("model")
                        yield DoneChunk(stop_reason=stop, usage=usage,
                                        model=done_model if isinstance(done_model, str) and done_model else model)
                        await drain(lines)  # briefly: the connection is reused only if the body ends
                        return
        raise failure("stream_truncated", provider=self.name, model=model, retryable=True,
                      detail="the stream ended before done")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _pieces(items: list[str | ToolCall]) -> list[StreamChunk]:
    return [TextChunk(text=i) if isinstance(i, str) else ToolCallChunk(call=i) for i in items if i]


def to_messages(request: CompletionRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in paired(from_user_turn(request.messages)):
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
