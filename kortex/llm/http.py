"""HTTP plumbing the vendor adapters share: one client per provider made lazily on the streaming
loop, timeouts from configuration, transport failures and error statuses translated into
``ProviderError``, retries with backoff around one streamed call, and the checks of a
provider's configuration (API key, models) made when it is created.

Translation (here for httpx; ``kortex/llm/transport.py`` does the same for aiohttp, the default
``llm.http_transport``)::

    connect error / connect or pool timeout  -> code "connect_failed",     retryable
    read timeout                             -> code "read_timeout",       retryable
    reset, incomplete body, remote protocol  -> code "stream_interrupted", retryable
    request we cannot send (bad header, URL) -> code "request_invalid",    not retryable
    HTTP 408/409/429/5xx/529                 -> retryable, Retry-After kept
    other HTTP 4xx                           -> not retryable (auth, bad request, unknown model)

Messages are ours (``kortex.llm.failures``); what the network or the vendor said is kept in
``ProviderError.detail`` for the logs, scrubbed, and never includes a request header.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from kortex.config import ProviderSettings, Settings
from kortex.errors import ConfigError, ProviderError, ProviderUnavailable
from kortex.llm import catalog
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    Provider,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
    UsageChunk,
    WarningChunk,
)
from kortex.llm.failures import failure
from kortex.llm.retry import RETRYABLE_STATUS, RetryPolicy, parse_retry_after
from kortex.llm.wire import dumps

if TYPE_CHECKING:
    from kortex.llm.transport import AiohttpClient

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 16 * 1024
#: how long the rest of a body is read once the answer is complete (for connection reuse)
DRAIN_SECONDS = 1.0
sleep = asyncio.sleep  # the backoff wait (tests record it instead of waiting)
_CODES = {401: "provider_auth", 403: "provider_auth", 404: "provider_not_found", 429: "rate_limited",
          529: "provider_overloaded", 503: "provider_overloaded"}


def clean_api_key(raw: str | None, provider: str, where: str) -> str | None:
    """The key without surrounding whitespace (secret files end in a newline); None when empty.
    A key with whitespace or control characters inside is refused here, when the provider is
    created: sent as a header it fails every call with an error that quotes it."""
    key = (raw or "").strip()
    if not key:
        return None
    if not all("!" <= ch <= "~" for ch in key):
        raise ProviderUnavailable(f"the API key ({where}) contains whitespace, control or non-ASCII characters; "
                                  "check the secret it comes from", provider=provider, code="provider_config")
    return key


def make_transport(kind: str, limits: httpx.Limits) -> httpx.AsyncBaseTransport | None:
    """The transport under an httpx client: None, httpx's own pool (``aiohttp`` does not use
    httpx at all, see ``VendorClient``)."""
    if kind == "httpx":
        return None
    raise ConfigError(f"unknown llm.http_transport {kind!r}")


class StreamBody(Protocol):
    """A response body being streamed, as the decoders read it: httpx's ``Response`` or
    ``transport.Body`` (aiohttp)."""

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


class VendorClient:
    """The HTTP client of one provider: aiohttp's (``transport.AiohttpClient``) or httpx's,
    as ``llm.http_transport`` says. Made on first use by the loop that streams, and made again
    when used from another loop (a forked worker child inherits the object, not the loop)."""

    def __init__(self, *, provider: str, base_url: str, headers: dict[str, str], config: ProviderSettings,
                 transport: str = "httpx") -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._headers = headers
        self._config = config
        self._timeout = httpx.Timeout(config.timeout, connect=config.connect_timeout, pool=config.timeout)
        self._limits = httpx.Limits(max_connections=config.max_connections,
                                    max_keepalive_connections=min(64, config.max_connections))
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aiohttp: AiohttpClient | None = None

    def _aio(self) -> AiohttpClient | None:
        """The aiohttp client when that is the transport, else None (httpx)."""
        if self._aiohttp is None and self._transport == "aiohttp":
            try:
                from kortex.llm.transport import AiohttpClient
            except ImportError as exc:  # pragma: no cover - aiohttp is a dependency; a broken install says so
                raise ConfigError("llm.http_transport = 'aiohttp' needs the aiohttp package") from exc
            config = self._config
            self._aiohttp = AiohttpClient(provider=self.provider, base_url=self.base_url, headers=self._headers,
                                          timeout=config.timeout, connect_timeout=config.connect_timeout,
                                          max_connections=config.max_connections, max_error_body=MAX_ERROR_BODY)
        return self._aiohttp

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout, limits=self._limits,
                transport=make_transport(self._transport, self._limits), follow_redirects=False)
            self._loop = loop
        return self._http

    def post_stream(self, path: str, body: dict[str, Any], *,
                    model: str) -> AbstractAsyncContextManager[StreamBody]:
        """POST ``body`` and hand over the response body once its status is good; errors are
        translated, including those raised while the caller reads the body."""
        aio = self._aio()
        if aio is not None:
            return aio.post_stream(path, dumps(body), model=model)
        return self._httpx_post_stream(path, dumps(body), model=model)

    @asynccontextmanager
    async def _httpx_post_stream(self, path: str, content: bytes, *, model: str) -> AsyncIterator[StreamBody]:
        try:
            async with self.client().stream("POST", path, content=content,
                                            headers={"content-type": "application/json"}) as response:
                if response.status_code >= 400:
                    raise await status_error(response, self.provider, model)
                yield response
        except httpx.LocalProtocolError as exc:
            # Its text (and its cause's) quotes the refused header, the API key as likely as not:
            # the chain is cut so no traceback in a log can show it.
            raise transport_error(exc, self.provider, model) from None
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.provider, model) from exc
        except httpx.InvalidURL as exc:
            raise failure("request_invalid", provider=self.provider, model=model, detail="invalid URL") from exc

    async def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        aio = self._aio()
        if aio is not None:
            return await aio.get_json(path, timeout=timeout)
        try:
            response = await self.client().get(path, timeout=timeout or httpx.USE_CLIENT_DEFAULT)
            if response.status_code >= 400:
                raise await status_error(response, self.provider, "")
            return response.json()
        except httpx.LocalProtocolError as exc:
            raise transport_error(exc, self.provider, "") from None
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.provider, "") from exc
        except httpx.InvalidURL as exc:
            raise failure("request_invalid", provider=self.provider, detail="invalid URL") from exc
        except ValueError as exc:
            raise failure("stream_invalid", provider=self.provider,
                          detail="the server answered with something that is not JSON") from exc

    async def aclose(self) -> None:
        if self._aiohttp is not None:
            await self._aiohttp.aclose()
        client, self._http = self._http, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()


def transport_error(exc: httpx.HTTPError, provider: str, model: str) -> ProviderError:
    """Never the request in the text: a protocol error quotes the header it refused, and headers
    carry the API key. Only network errors keep their text (addresses, errno) as detail."""
    name = exc.__class__.__name__
    if isinstance(exc, httpx.LocalProtocolError | httpx.UnsupportedProtocol):
        # Our request cannot be sent as it is (a bad header value, a bad URL scheme): trying
        # again sends the same thing.
        return failure("request_invalid", provider=provider, model=model, detail=name)
    if isinstance(exc, httpx.ProtocolError):
        return failure("stream_interrupted", provider=provider, model=model, retryable=True, detail=name)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        code = "connect_failed"
    elif isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        code = "read_timeout"
    elif isinstance(exc, httpx.TransportError):
        code = "stream_interrupted"
    else:
        return failure("provider", provider=provider, model=model, detail=name)
    text = str(exc).strip()
    return failure(code, provider=provider, model=model, retryable=True, detail=f"{name}: {text}" if text else name)


async def status_error(response: httpx.Response, provider: str, model: str) -> ProviderError:
    body = bytearray()
    try:
        async for part in response.aiter_bytes():
            body += part
            if len(body) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    return status_failure(response.status_code, response.reason_phrase, response.headers,
                          bytes(body[:MAX_ERROR_BODY]), provider, model)


def status_failure(status: int, reason: str, headers: Mapping[str, str], body: bytes, provider: str,
                   model: str) -> ProviderError:
    """An HTTP error status as a ``ProviderError``, whichever client read it; ``headers`` must
    be case-insensitive (httpx's and aiohttp's are)."""
    detail = vendor_message(body) or reason or "error"
    retryable = status in RETRYABLE_STATUS
    code = _CODES.get(status) or ("provider_server_error" if status >= 500 else "provider_rejected")
    return failure(code, provider=provider, model=model, status=status, retryable=retryable, detail=detail,
                   retry_after=parse_retry_after(headers) if retryable else None)


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


async def drain(rest: AsyncIterator[object], seconds: float | None = None) -> None:
    """Read what is left of a body once the answer is complete, so the connection can be
    reused; briefly, and whatever goes wrong (a reset, a proxy holding the connection open)
    costs only that connection: the answer is whole already."""
    try:
        async with asyncio.timeout(DRAIN_SECONDS if seconds is None else seconds):
            async for _ in rest:
                pass
    except Exception as exc:  # noqa: BLE001 - nothing after the final chunk can change the answer
        log.debug("ignored after a complete answer: %s", exc.__class__.__name__)


class HTTPProvider(Provider):
    """A provider reached over HTTP: ``stream`` retries ``_stream_once`` on retryable failures
    while nothing has been produced yet (a retry after output would repeat it).

    The models on offer are the vendor's catalogue (``catalogue``) with configured prices, plus
    the configured ``model``/``fast_model`` and priced ids; ``problems`` says what is wrong with
    the configuration without making the provider unusable (shown by ``/v1/llm/providers``).
    """

    catalogue: tuple[ModelInfo, ...] = ()

    def __init__(self, name: str, config: ProviderSettings, settings: Settings) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        self.retry = RetryPolicy.of(config)
        if config.model and not catalog.valid_id(config.model):
            raise ProviderUnavailable("model is not a valid model id (printable characters, no spaces)",
                                      provider=name, code="provider_config")
        self._models: tuple[ModelInfo, ...] = ()
        self.problems: list[str] = []
        if self.catalogue:  # a vendor with a price list (Ollama lists what its server has)
            self._models, self.problems = catalog.offered(self.catalogue, config)
        for problem in self.problems:
            log.warning("llm.providers.%s: %s", name, problem)

    def models(self) -> Sequence[ModelInfo]:
        return self._models

    def fast_model(self) -> ModelInfo | None:
        fast = catalog.fast_model(self.models(), self.config)
        if not fast:
            return None
        try:
            return self.model_info(fast)
        except ProviderError:  # a fast model the provider cannot use means no fast model, not no provider
            return None

    def unknown_model(self, model_id: str) -> ModelInfo:
        if self.config.allow_unlisted_models:
            # The operator allowed any id: priced from configuration, else free (documented).
            return catalog.unlisted(model_id, self.config)
        # The id is the caller's own input (checked printable and short before it gets here).
        raise ProviderError(f"model {model_id!r} is not offered by {self.name}", provider=self.name,
                            model=model_id, code="unknown_model",
                            detail="not in the catalogue, model, fast_model or prices; allow_unlisted_models "
                                   "accepts any id")

    async def _stream_once(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        raise NotImplementedError
        yield  # pragma: no cover - marks this as an async generator

    async def stream(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        retry, waited = 0, 0.0
        spent = TokenUsage()  # billed to tries that failed and were tried again
        warned: set[tuple[str, str]] = set()  # a warning is said once, not once per try
        while True:
            produced = done = False
            running = TokenUsage()
            try:
                async with aclosing(self._stream_once(request)) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, UsageChunk):
                            running = chunk.usage
                            yield UsageChunk(usage=spent + running)
                            continue
                        if isinstance(chunk, WarningChunk):
                            if (chunk.code, chunk.message) in warned:
                                continue
                            warned.add((chunk.code, chunk.message))
                        elif isinstance(chunk, DoneChunk):
                            done = True
                            chunk = chunk.model_copy(update={"usage": spent + chunk.usage})
                        elif isinstance(chunk, TextChunk | ToolCallChunk):
                            produced = True
                        yield chunk
                return
            except ProviderError as exc:
                error, cause = exc, exc.__cause__
            except Exception as exc:  # a frame no check foresaw, or a bug: still this provider's failure
                if not done:
                    log.exception("%s: unexpected failure while streaming", self.name)
                error = failure("stream_invalid", detail=f"{exc.__class__.__name__}: {exc}")
                cause = exc
            if done:  # the answer and its usage are whole; what broke afterwards changes nothing
                log.debug("%s: ignored after the final chunk: %s", self.name, error.code)
                return
            error.provider = error.provider or self.name
            error.model = error.model or request.model or ""
            error.usage = spent + running.most(error.usage)
            wait = None if produced or not error.retryable else self.retry.next_wait(retry, error.retry_after, waited)
            if wait is None:
                log.warning("%s:%s failed: %s (%s)", self.name, error.model, error.code, error.detail or error.message)
                raise error from cause
            log.warning("%s:%s: %s (%s); retry %d in %.2fs", self.name, error.model, error.code,
                        error.detail or error.message, retry + 1, wait)
            # Nothing was produced yet: the client hears why it waits, the router counts it.
            status = f" (HTTP {error.status})" if error.status else ""
            yield WarningChunk(code="provider_retry", message=(
                f"{self.name}:{error.model} failed with {error.code}{status}; retry {retry + 1} in {wait:.1f}s"))
            await sleep(wait)
            spent = error.usage
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
