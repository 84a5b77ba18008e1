"""Provider HTTP on aiohttp directly (``llm.http_transport = "aiohttp"``, the default).

httpx on top of aiohttp cost an httpx request and response per call and three more async
generators per streamed read, and aiohttp's ``trust_env`` sent every request through the
thread pool twice (for the proxy, and for ``~/.netrc``, which httpx never reads). py-spy on
``bench/providers.py`` with paced streams: those took about 40% of the process's busy samples.
Here a body is aiohttp's own ``StreamReader``, read with ``iter_any``; the session is made per
event loop with its headers and timeouts, and the environment's proxy is read once per session.

Failures become the same ``ProviderError`` codes as on httpx (the table in
``kortex/llm/http.py``); this module is the only place aiohttp exceptions are caught.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from kortex.errors import ProviderError
from kortex.llm.failures import failure, status_failure
from kortex.redaction import request_secrets

#: what a transport failure can be raised as, from aiohttp's connector, parser or stream
NETWORK_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)
_JSON = {"content-type": "application/json"}
KEEPALIVE_SECONDS = 5.0  # httpx's keep-alive expiry


def network_failure(exc: BaseException, provider: str, model: str) -> ProviderError:
    """The code of an aiohttp failure, as ``transport_error`` in ``http.py`` has it for httpx.
    Only network errors keep their text (addresses, errno) as detail; no aiohttp text quotes a
    request header, but protocol errors are named only, as on httpx."""
    name = exc.__class__.__name__
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return failure("request_invalid", provider=provider, model=model, detail="invalid URL")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return failure("stream_interrupted", provider=provider, model=model, retryable=True, detail=name)
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        code = "connect_failed"  # a pool wait or a connect that ran out of time, refused, DNS
    elif isinstance(exc, TimeoutError):  # SocketTimeoutError: nothing arrived for the read timeout
        code = "read_timeout"
    else:  # a reset, an OS error mid-body, a malformed response
        code = "stream_interrupted"
    text = str(exc).strip()
    return failure(code, provider=provider, model=model, retryable=True, detail=f"{name}: {text}" if text else name)


def unsendable(exc: BaseException, provider: str, model: str) -> ProviderError:
    """aiohttp refuses a request it cannot send (a header value with a newline, a URL yarl cannot
    parse) with a bare ValueError or TypeError whose text quotes the value, which may be the API
    key: only the kind of failure is kept, and the caller cuts the chain (``from None``)."""
    return failure("request_invalid", provider=provider, model=model,
                   detail=f"the request cannot be sent ({exc.__class__.__name__})")


async def _status_error(response: aiohttp.ClientResponse, provider: str, model: str, limit: int) -> ProviderError:
    body = bytearray()
    try:
        while len(body) < limit:
            part = await response.content.readany()
            if not part:
                break
            body += part
    except NETWORK_ERRORS:
        pass  # the status says enough
    return status_failure(response.status, response.reason or "", response.headers, bytes(body[:limit]),
                          provider, model, secrets=request_secrets(response.request_info.headers))


def _stop_socket_timer(response: aiohttp.ClientResponse) -> bool:
    """Turn off aiohttp's read timeout for the rest of this response; False if it cannot be
    (then it stays on). It is a timer cancelled and made again for every read: with a model's
    paced stream, one per text piece, 5-15% of a stream's CPU (bench/providers.py). The
    connection's next request sets its own again."""
    protocol = getattr(response.connection, "protocol", None)
    if protocol is None or not isinstance(getattr(type(protocol), "read_timeout", None), property):
        return False
    # The timer the last read started still runs and fires unless more data comes first: it
    # says the same as Body's would, at the same moment.
    protocol.read_timeout = None
    return True


class Body:
    """A response body being streamed: ``aiter_bytes`` yields what each read brought, whatever
    its size (the decoders in ``wire.py`` split lines themselves).

    The read timeout of the body is kept here, lazily: one timer per ``timeout`` seconds,
    which fails the read (``SocketTimeoutError``, as aiohttp's own would) once the reader has
    waited that long for data. Time the caller spends elsewhere does not count (aiohttp stops
    its timer too while unread data fills the buffer)."""

    __slots__ = ("_content", "_loop", "_timeout", "_timer", "_waiting_since")

    def __init__(self, response: aiohttp.ClientResponse, timeout: float | None) -> None:
        self._content = response.content
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout if timeout and _stop_socket_timer(response) else None
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        timeout = self._timeout
        if timeout is None:
            data = await self._content.readany()
        else:
            now = self._waiting_since = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_at(now + timeout, self._check)
            try:
                data = await self._content.readany()
            finally:
                self._waiting_since = None
        if not data:
            raise StopAsyncIteration
        return data

    def _check(self) -> None:
        self._timer = None
        since, timeout = self._waiting_since, self._timeout
        if since is None or timeout is None:
            return  # not waiting: the next read starts a timer
        due = since + timeout
        if self._loop.time() >= due:
            self._content.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
        else:
            self._timer = self._loop.call_at(due, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AiohttpClient:
    """The aiohttp session of one provider. Made on first use by the loop that streams, and made
    again when used from another loop (a forked worker child inherits the object, not the loop)."""

    def __init__(self, *, provider: str, base_url: str, headers: Mapping[str, str], timeout: float,
                 connect_timeout: float, max_connections: int, max_error_body: int) -> None:
        self.provider = provider
        self.base_url = base_url.rstrip("/")
        self._headers = dict(headers)
        # connect: waiting for a pooled connection and making one (httpx's pool timeout);
        # sock_connect: the TCP/TLS connect itself; sock_read: silence between two reads, until
        # the response headers (a streamed body keeps its own, see Body).
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=connect_timeout,
                                              sock_read=timeout)
        self._read_timeout = timeout
        self._max_connections = max_connections
        self._max_error_body = max_error_body
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._urls: dict[str, URL] = {}
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None

    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or self._loop is not loop or session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                             keepalive_timeout=KEEPALIVE_SECONDS)
            session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout, trust_env=False,
                auto_decompress=True)  # gzip/deflate asked for and decoded, as httpx does
            self._session, self._loop = session, loop
            self._proxy, self._proxy_auth = self._env_proxy()
        return session

    def _env_proxy(self) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """HTTPS_PROXY and friends (NO_PROXY honoured), read when the session is made, as httpx
        reads them when its client is made."""
        try:
            return get_env_proxy_for_url(URL(self.base_url))
        except (LookupError, ValueError):
            return None, None

    def url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = URL(self.base_url + path)
            if len(self._urls) < 64:  # a few fixed paths per vendor
                self._urls[path] = url
        return url

    @asynccontextmanager
    async def post_stream(self, path: str, content: bytes, *, model: str) -> AsyncIterator[Body]:
        """POST ``content`` (JSON) and hand over the body once the status is good; errors are
        translated, including those raised while the caller reads the body. Leaving closes the
        connection unless the body was read to its end (then it goes back to the pool): a
        cancelled reader ends the HTTP stream at once."""
        try:
            response = await self.session().post(self.url(path), data=content, headers=_JSON,
                                                  allow_redirects=False, proxy=self._proxy,
                                                  proxy_auth=self._proxy_auth)
        except NETWORK_ERRORS as exc:
            raise network_failure(exc, self.provider, model) from exc
        except Exception as exc:
            raise unsendable(exc, self.provider, model) from None
        body: Body | None = None
        try:
            if response.status >= 400:
                raise await _status_error(response, self.provider, model, self._max_error_body)
            body = Body(response, self._read_timeout)
            yield body
        except NETWORK_ERRORS as exc:
            raise network_failure(exc, self.provider, model) from exc
        finally:
            if body is not None:
                body.close()
            if response.content.at_eof():
                response.release()  # read to its end: the connection goes back to the pool
            else:
                response.close()  # abandoned mid-body (done early, failed, cancelled): not reusable

    async def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout,
                                       sock_read=timeout) if timeout else self._timeout
        try:
            async with self.session().get(self.url(path), allow_redirects=False, timeout=limits, proxy=self._proxy,
                                          proxy_auth=self._proxy_auth) as response:
                if response.status >= 400:
                    raise await _status_error(response, self.provider, "", self._max_error_body)
                body = await response.read()
        except ProviderError:
            raise
        except NETWORK_ERRORS as exc:
            raise network_failure(exc, self.provider, "") from exc
        except Exception as exc:
            raise unsendable(exc, self.provider, "") from None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise failure("stream_invalid", provider=self.provider,
                          detail="the server answered with something that is not JSON") from exc

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and self._loop is asyncio.get_running_loop():
            await session.close()
