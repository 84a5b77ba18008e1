"""The HTTP client a vendor adapter talks through: one per provider, made lazily on the
streaming loop, on httpx or aiohttp (``llm.http_transport``), with timeouts and pool limits from
configuration; the checks of an API key; and reading the rest of a finished body so the
connection is reused. What goes wrong on the wire becomes a ``ProviderError`` through
``kortex/llm/failures.py``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from kortex.config import ProviderSettings
from kortex.errors import ConfigError, ProviderUnavailable
from kortex.llm.failures import MAX_ERROR_BODY, failure, status_error, transport_error
from kortex.llm.wire import dumps

if TYPE_CHECKING:
    from kortex.llm.transport import AiohttpClient

log = logging.getLogger(__name__)

#: how long the rest of a body is read once the answer is complete (for connection reuse)
DRAIN_SECONDS = 1.0


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


def api_path(base_url: str, path: str) -> str:
    """The request path under ``base_url``, which may or may not end in ``/v1`` (both spellings
    are common in configuration: ``https://api.openai.com`` and ``https://api.openai.com/v1``)."""
    if base_url.rstrip("/").endswith("/v1") and path.startswith("/v1/"):
        return path[3:]
    return path
