"""HTTP plumbing the vendor adapters share: one client per provider made lazily on the streaming
loop, timeouts from configuration, transport failures and error statuses translated into
``ProviderError``, and retries with backoff around one streamed call.

Translation (the only place httpx exceptions are caught)::

    connect error / connect or pool timeout  -> code "connect_failed",     retryable
    read timeout                             -> code "read_timeout",       retryable
    reset, incomplete body, protocol error   -> code "stream_interrupted", retryable
    HTTP 408/409/429/5xx/529                 -> retryable, Retry-After kept
    other HTTP 4xx                           -> not retryable (auth, bad request, unknown model)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx

from kortex.config import ProviderSettings, Settings
from kortex.errors import ConfigError, ProviderError
from kortex.llm import catalog
from kortex.llm.base import CompletionRequest, ModelInfo, Provider, StreamChunk, TextChunk, ToolCallChunk
from kortex.llm.retry import RETRYABLE_STATUS, RetryPolicy, parse_retry_after

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 16 * 1024
sleep = asyncio.sleep  # the backoff wait (tests record it instead of waiting)
_CODES = {401: "provider_auth", 403: "provider_auth", 404: "provider_not_found", 429: "rate_limited",
          529: "provider_overloaded", 503: "provider_overloaded"}


def make_transport(kind: str, limits: httpx.Limits) -> httpx.AsyncBaseTransport | None:
    """None means httpx's own pool; ``aiohttp`` puts aiohttp's connector underneath httpx."""
    if kind == "httpx":
        return None
    if kind == "aiohttp":
        try:
            from kortex.llm.transport import AiohttpTransport
        except ImportError as exc:  # aiohttp is an optional dependency
            raise ConfigError("llm.http_transport = 'aiohttp' needs the aiohttp package") from exc
        return AiohttpTransport(limits=limits)
    raise ConfigError(f"unknown llm.http_transport {kind!r}")


class VendorClient:
    """The HTTP client of one provider. Made on first use by the loop that streams, and made
    again when used from another loop (a forked worker child inherits the object, not the loop)."""

    def __init__(self, *, provider: str, base_url: str, headers: dict[str, str], config: ProviderSettings,
                 transport: str = "httpx") -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._headers = headers
        self._timeout = httpx.Timeout(config.timeout, connect=config.connect_timeout, pool=config.timeout)
        self._limits = httpx.Limits(max_connections=config.max_connections,
                                    max_keepalive_connections=min(64, config.max_connections))
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout, limits=self._limits,
                transport=make_transport(self._transport, self._limits), follow_redirects=False)
            self._loop = loop
        return self._http

    @asynccontextmanager
    async def post_stream(self, path: str, body: dict[str, Any], *, model: str) -> AsyncIterator[httpx.Response]:
        """POST ``body`` and hand over the response once its status is good; errors are translated,
        including those raised while the caller reads the body."""
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            async with self.client().stream("POST", path, content=content,
                                            headers={"content-type": "application/json"}) as response:
                if response.status_code >= 400:
                    raise await status_error(response, self.provider, model)
                yield response
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.provider, model) from exc

    async def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        try:
            response = await self.client().get(path, timeout=timeout or httpx.USE_CLIENT_DEFAULT)
            if response.status_code >= 400:
                raise await status_error(response, self.provider, "")
            return response.json()
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.provider, "") from exc
        except ValueError as exc:
            raise ProviderError("the server answered with something that is not JSON", provider=self.provider,
                                code="stream_invalid") from exc

    async def aclose(self) -> None:
        client, self._http = self._http, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()


def transport_error(exc: httpx.HTTPError, provider: str, model: str) -> ProviderError:
    # The message names the failure, never the request (headers carry the API key).
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        code, what = "connect_failed", "cannot connect"
    elif isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        code, what = "read_timeout", "the server stopped sending"
    elif isinstance(exc, httpx.TransportError):
        code, what = "stream_interrupted", "the connection broke"
    else:
        return ProviderError(f"HTTP failure: {exc.__class__.__name__}", provider=provider, model=model,
                             code="provider")
    detail = str(exc).strip()
    message = f"{what} ({exc.__class__.__name__}{': ' + detail[:200] if detail else ''})"
    return ProviderError(message, provider=provider, model=model, retryable=True, code=code)


async def status_error(response: httpx.Response, provider: str, model: str) -> ProviderError:
    status = response.status_code
    body = bytearray()
    try:
        async for part in response.aiter_bytes():
            body += part
            if len(body) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    message = vendor_message(bytes(body[:MAX_ERROR_BODY])) or response.reason_phrase or "error"
    retryable = status in RETRYABLE_STATUS
    code = _CODES.get(status) or ("provider_server_error" if status >= 500 else "provider_rejected")
    return ProviderError(message, provider=provider, model=model, status=status, retryable=retryable,
                         retry_after=parse_retry_after(response.headers) if retryable else None, code=code)


def vendor_message(body: bytes) -> str:
    """The human part of a vendor's error body (Anthropic ``error.message``, OpenAI
    ``error.message``, Ollama ``error``), bounded."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            kind, message = error.get("type"), error.get("message")
            if isinstance(message, str):
                return (f"{kind}: {message}" if isinstance(kind, str) and kind else message)[:300]
        elif isinstance(error, str):
            return error[:300]
    return text[:300]


class HTTPProvider(Provider):
    """A provider reached over HTTP: ``stream`` retries ``_stream_once`` on retryable failures
    while nothing has been produced yet (a retry after output would repeat it)."""

    def __init__(self, name: str, config: ProviderSettings, settings: Settings) -> None:
        self.name = name
        self.config = config
        self.retry = RetryPolicy.of(config)

    def fast_model(self) -> ModelInfo | None:
        fast = catalog.fast_model(self.models(), self.config)
        return self.model_info(fast) if fast else None

    async def _stream_once(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        raise NotImplementedError
        yield  # pragma: no cover - marks this as an async generator

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        retry, waited = 0, 0.0
        while True:
            produced = False
            try:
                async with aclosing(self._stream_once(request)) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, TextChunk | ToolCallChunk):
                            produced = True
                        yield chunk
                return
            except ProviderError as exc:
                if produced or not exc.retryable:
                    raise
                wait = self.retry.next_wait(retry, exc.retry_after, waited)
                if wait is None:
                    raise
                log.warning("%s: %s; retry %d in %.2fs", self.name, exc, retry + 1, wait)
                await sleep(wait)
                waited += wait
                retry += 1

    async def aclose(self) -> None:
        http: VendorClient | None = getattr(self, "http", None)
        if http is not None:
            await http.aclose()


def api_path(base_url: str, path: str) -> str:
    """The request path under ``base_url``, which may or may not end in ``/v1`` (both spellings
    are common in configuration: ``https://api.openai.com`` and ``https://api.openai.com/v1``)."""
    if base_url.rstrip("/").endswith("/v1") and path.startswith("/v1/"):
        return path[3:]
    return path
