"""An httpx transport on aiohttp's connection pool and HTTP parser (``llm.http_transport =
"aiohttp"``). The adapters keep httpx's API; the bytes move through aiohttp, which costs less
CPU per streamed chunk and does not slow down with hundreds of concurrent streams the way
httpcore's pool does (encode/httpx#3215; ``bench/providers.py`` measures both).

aiohttp's exceptions are mapped onto httpx's, so ``kortex/llm/http.py`` translates failures
the same way whichever transport is underneath.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx

_READ_SIZE = 64 * 1024


def _translate(exc: BaseException) -> httpx.TransportError:
    message = str(exc) or exc.__class__.__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientOSError | ConnectionError):
        return httpx.ReadError(message)
    return httpx.TransportError(message)


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while True:
                data = await self._response.content.readany()  # whatever arrived, no fixed size
                if not data:
                    return
                yield data
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise _translate(exc) from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()  # the connection goes back to the pool
        else:
            self._response.close()  # abandoned mid-body: the connection cannot be reused


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, limits: httpx.Limits | None = None) -> None:
        self._limits = limits or httpx.Limits()
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            limits = self._limits
            connector = aiohttp.TCPConnector(limit=limits.max_connections or 0, limit_per_host=0,
                                             keepalive_timeout=limits.keepalive_expiry or 5.0)
            # trust_env: HTTPS_PROXY and friends apply, as they do for httpx's own transport
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=True,
                                                  skip_auto_headers=("User-Agent", "Accept-Encoding"),
                                                  timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        try:
            response = await self._client().request(
                request.method, str(request.url), headers=list(request.headers.multi_items()),
                data=body or None, allow_redirects=False, compress=None,
                timeout=aiohttp.ClientTimeout(total=None, connect=timeout.get("pool"),
                                              sock_connect=timeout.get("connect"), sock_read=timeout.get("read")))
        except aiohttp.InvalidURL as exc:
            raise httpx.UnsupportedProtocol("invalid URL") from exc
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise _translate(exc) from exc
        except Exception as exc:
            # aiohttp refuses a request it cannot send (a header value with a newline, ...) with a
            # bare ValueError or TypeError whose text quotes the value, which may be the API key:
            # say only what kind of failure it was.
            raise httpx.LocalProtocolError(f"the request cannot be sent ({exc.__class__.__name__})") from exc
        return httpx.Response(status_code=response.status, headers=list(response.raw_headers),
                              stream=_Body(response), request=request,
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": (response.reason or "").encode()})

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
