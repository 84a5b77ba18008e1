"""Bounded HTTP reads for the remote telemetry sources (Prometheus, Loki): every answer is
read within a total time limit and up to a byte cap, and the connection is closed when either
runs out.

httpx's own timeout bounds each wait for the network, not a whole answer: a server sending a
byte every half second keeps a call going for as long as it likes, and the tool pipeline cannot
kill the thread it abandons (past 32 of them it refuses every call). And ``response.json()``
holds the whole body in memory, however large. So answers are streamed here instead:

- the time limit is the tool call's deadline (set by the pipeline around the call, see
  ``kortex.tools.pipeline``) or the source's configured timeout, whichever comes first, and it
  covers connecting, the headers and the body. Every socket wait of our transport is cut to
  what is left of it, so even headers sent a byte at a time cannot stretch it; with any other
  transport (a caller's, or httpx's own behind an environment proxy) the body is still checked
  after each read, and a read waits no longer than the whole limit.
- the byte cap is ``DATA_CAP`` for answers and ``ERROR_CAP`` for error answers (status >= 400),
  whose first words say what went wrong; a ``Content-Length`` over the cap ends the call before
  any of the body is read. The cap counts both the bytes on the wire and the decoded ones, and
  no step decodes more than the cap allows: Kortex asks for gzip or deflate only and decodes
  them itself (``_Inflater``), a bounded piece at a time, so a small compressed answer that
  would decode to gigabytes (a "bomb") holds at most the cap (and the piece being decoded, 256
  KiB at most) before it is refused (an error body: cut) like any answer over the cap. httpx's
  own decoding (its ``iter_bytes``) would turn one 64 KiB read into all it decodes to, a
  thousand times more. An answer in any other encoding, or whose compressed body is corrupt or
  cut short, is an ``UpstreamError`` naming the source, before or instead of reading on.

An upstream may quote the credential it was sent (an error saying which token it refused), and
what a source quotes of an answer reaches the model. ``BoundedClient.without_secrets`` takes
the client's credentials out of text in every spelling an answer may use (see ``spellings``);
error bodies go through it as bytes before anything reads them, and the sources pass whatever
they quote of a decoded answer through it too.
"""

from __future__ import annotations

import json
import time
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpcore
import httpx

from kortex.errors import UpstreamError
from kortex.redaction import REDACTED, request_secrets, without_secrets

# The pipeline sets it around every tool call (pipeline deadline + DB_GRACE) for the database's
# statement timeouts; it is the only channel from ``ctx.deadline`` to a source, whose methods see
# the tenant and the query only. The grace suits HTTP too: the pipeline answers "timeout" first,
# and the source gives up a moment later rather than racing it with an upstream error.
from kortex.storage.db import call_deadline

#: an answer's body: bounded queries (MAX_BUCKETS points, a page of MAX_LOG_PAGE lines, a
#: tenant's metric names) come nowhere near it unless something upstream is wrong
DATA_CAP = 32 * 1024 * 1024
#: an error answer's body: Prometheus and Loki say what went wrong in its first lines
ERROR_CAP = 64 * 1024

#: what Kortex asks sources for: the encodings ``_Inflater`` decodes (identity is implied). httpx
#: would offer br and zstd too wherever their packages are installed.
ACCEPT_ENCODING = "gzip, deflate"
#: Content-Encoding values and the zlib framing each names. gzip's wbits also take a zlib stream
#: (httpx does the same), and "deflate" may be a zlib stream (RFC 9110) or a raw one (see ``_Inflater``).
_ENCODINGS = {"gzip": zlib.MAX_WBITS | 32, "x-gzip": zlib.MAX_WBITS | 32, "deflate": zlib.MAX_WBITS}
#: the most one step decodes: zlib builds its output in blocks and copies them into one at the end,
#: so a step holds twice what it gives
_PIECE = 256 * 1024

#: the monotonic time at which the request in flight on this thread must be over
_deadline: ContextVar[float | None] = ContextVar("kortex_http_deadline", default=None)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 and n % (1024 * 1024) == 0 else f"{n // 1024} KiB"


#: Go's encoding/json escapes these (HTML-safe output, Prometheus' and Loki's own errors); in
#: both cases of hex, as other encoders write them
_GO_ESCAPES = (("&", ("\\u0026",)), ("<", ("\\u003c", "\\u003C")), (">", ("\\u003e", "\\u003E")))


def spellings(secret: str) -> set[str]:
    """``secret`` as an answer may spell it: as sent; as JSON writes it (escaped, ASCII or not);
    with "/" as "\\/" (PHP, Jackson, many gateways; base64 tokens hold "/"); with Go's escapes
    of ``& < >``; both of the last two at once; and percent-encoded (a quoted URL)."""
    found = {secret, quote(secret, safe=""), quote(secret)}
    for escaped in {json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}:
        forms = {escaped}
        for char, escapes in _GO_ESCAPES:
            if char in escaped:
                forms |= {form.replace(char, e) for form in forms for e in escapes}
        found |= forms | {form.replace("/", "\\/") for form in forms}
    return {s for s in found if s}


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    body: bytes
    #: the cap an error body went past (``body`` then holds at most its beginning), or None
    cut_at: int | None = None

    @property
    def cut_note(self) -> str:
        """Words for an error message: why the body said less than it might have; or ""."""
        return "" if self.cut_at is None else f" (error body over {_size(self.cut_at)}, not read whole)"

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (or was cut)."""
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class BoundedClient:
    """GET requests against one base URL, each answer bounded in time and size; every failure is
    an ``UpstreamError`` naming the source (``name``) and, for a limit, which one was hit."""

    def __init__(self, name: str, base_url: str, *, timeout: float, headers: dict[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None, max_bytes: int = DATA_CAP,
                 max_error_bytes: int = ERROR_CAP) -> None:
        self.name = name
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_error_bytes = max_error_bytes
        # An error body may quote the credential it refused: taken out, in every spelling,
        # before anything reads the body (and from what the sources quote of other answers).
        sent = request_secrets(headers or {})
        self._secrets = tuple(sorted({form for s in sent for form in spellings(s)}, key=len, reverse=True))
        sending = httpx.Headers(headers or {})
        sending["Accept-Encoding"] = ACCEPT_ENCODING  # what _read decodes, and nothing else
        self._client = httpx.Client(base_url=base_url, timeout=timeout, headers=sending,
                                    transport=deadline_transport() if transport is None else transport)

    def close(self) -> None:
        self._client.close()

    def without_secrets(self, text: str) -> str:
        """``text`` (from an answer, decoded or not) with each credential this client sends
        replaced, in every spelling of ``spellings``: for whatever a source quotes of an answer
        into an error or a result. Whole words only; the raw error bodies, which may be cut
        inside one, are cleaned further as they are read."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def get(self, path: str, *, params: Any, headers: dict[str, str] | None = None) -> Answer:
        start = time.monotonic()
        limit, which = self.timeout, f"telemetry.{self.name}.timeout"
        bound = call_deadline()
        if bound is not None and bound - start < limit:
            limit, which = bound - start, "the tool call's deadline"
        if limit <= 0:
            raise UpstreamError(f"{self.name} was not asked: the tool call's deadline has passed")
        deadline = start + limit
        token = _deadline.set(deadline)
        try:
            # Leaving the block closes the response; one not read to its end closes its connection.
            with self._client.stream("GET", path, params=params, headers=headers, timeout=limit) as response:
                return self._read(response, deadline, f"{limit:.1f}s ({which})")
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"{self.name} did not answer within {limit:.1f}s ({which})") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.name} is unreachable: {exc.__class__.__name__}") from exc
        finally:
            _deadline.reset(token)

    def _read(self, response: httpx.Response, deadline: float, limit: str) -> Answer:
        error = response.status_code >= 400
        cap = self.max_error_bytes if error else self.max_bytes
        if response.is_stream_consumed:  # an in-memory transport's (httpx.MockTransport): read, and decoded, whole
            inflater, reads = None, iter((response.content,))
        else:
            inflater, reads = self._inflater(response), response.iter_raw()
        declared = response.headers.get("content-length", "")
        chunks: list[bytes] = []
        size = 0
        if not (declared.isdigit() and int(declared) > cap):
            try:
                read = 0  # bytes on the wire: decoded ones may be fewer, or none at all
                for data in reads:
                    read += len(data)
                    for chunk in (data,) if inflater is None else inflater.pieces(data, cap + 1 - size):
                        chunks.append(chunk)
                        size += len(chunk)
                    if size > cap or read > cap:
                        break
                    if time.monotonic() >= deadline:
                        raise self._too_slow(limit)
                else:
                    if inflater is not None:
                        inflater.finish()
                    body = b"".join(chunks)
                    return Answer(response.status_code, response.reason_phrase, self._clean(body) if error else body)
            except httpx.TimeoutException as exc:
                raise self._too_slow(limit) from exc
            except zlib.error as exc:
                status = f" ({response.status_code} {response.reason_phrase})" if error else ""
                encoding = inflater.encoding if inflater is not None else "its encoding"  # only _Inflater raises it
                raise UpstreamError(f"{self.name}'s answer{status} is not valid {encoding}: {exc}; the connection "
                                    "was closed") from exc
        if error:  # the status says enough; the start of the body, if read, says more
            return Answer(response.status_code, response.reason_phrase, self._clean(b"".join(chunks)[:cap]),
                          cut_at=cap)
        raise UpstreamError(f"{self.name}'s answer is larger than {_size(cap)}, the most Kortex reads; the "
                            "connection was closed. Narrow the query (a shorter time range, more labels)")

    def _inflater(self, response: httpx.Response) -> _Inflater | None:
        """The decoder for the answer's Content-Encoding (None for none); an ``UpstreamError``
        for an encoding Kortex does not decode, before any of the body is read."""
        codings = [c.strip().lower() for c in response.headers.get_list("content-encoding", split_commas=True)]
        codings = [c for c in codings if c not in ("", "identity")]
        if not codings:
            return None
        if len(codings) == 1 and codings[0] in _ENCODINGS:
            return _Inflater(codings[0])
        # br or zstd (never asked for), or encodings stacked: decoded by nothing that bounds them
        status = f" {response.status_code} {response.reason_phrase}" if response.status_code >= 400 else ""
        encoding = self.without_secrets(repr(response.headers.get("content-encoding", "")))
        raise UpstreamError(f"{self.name} answered{status} in Content-Encoding {encoding}, which Kortex does not "
                            f"decode (it asks for {ACCEPT_ENCODING} or none); the connection was closed")

    def _clean(self, body: bytes) -> bytes:
        if not self._secrets:
            return body
        return without_secrets(body.decode("utf-8", errors="replace"), self._secrets).encode()

    def _too_slow(self, limit: str) -> UpstreamError:
        return UpstreamError(f"{self.name} was still sending its answer when its time limit of {limit} ran out; "
                             "the connection was closed")


class _Inflater:
    """A gzip or deflate body decoded a bounded piece at a time: ``read(n)`` gives at most n
    bytes, and whatever the input would decode to beyond that stays compressed (zlib's
    ``unconsumed_tail``) until asked for. What zlib holds itself is its 32 KiB window.

    Every fault is a ``zlib.error``: a corrupt body, and one that ends inside its stream."""

    def __init__(self, encoding: str) -> None:
        self.encoding = "deflate" if encoding == "deflate" else "gzip"
        self._wbits = _ENCODINGS[encoding]
        self._zlib = zlib.decompressobj(self._wbits)
        self._input = b""  # fed and not yet decoded
        self._fed = False
        # "deflate" is a zlib stream by the RFC, a raw one from some servers: which one is known
        # from its first two bytes, the zlib header (httpx tells them apart the same way)
        self._framed = self.encoding == "gzip"

    def pieces(self, data: bytes, room: int) -> Iterator[bytes]:
        """``data`` (the next read of the body) and whatever earlier reads left undecoded,
        decoded in pieces of at most ``_PIECE`` bytes and ``room`` in all: what it decodes to
        beyond that stays compressed."""
        self.feed(data)
        while room > 0 and (piece := self.read(min(room, _PIECE))):
            room -= len(piece)
            yield piece

    def feed(self, data: bytes) -> None:
        """More of the body; to be drained with ``read`` before the next."""
        if data:
            self._fed = True
            self._input += data

    def read(self, room: int) -> bytes:
        """At most ``room`` (>= 1) decoded bytes; b"" once all that was fed is decoded."""
        if room < 1:  # zlib would take 0 for "no limit"
            raise ValueError("room must be at least 1")
        while True:
            if self._zlib.eof:
                rest = self._zlib.unused_data + self._input
                # gzip members may follow one another (RFC 1952, 2.2); bytes after a deflate
                # stream are dropped, as httpx does
                if not rest or self.encoding != "gzip":
                    self._input = b""
                    return b""
                self._zlib = zlib.decompressobj(self._wbits)
                self._input = rest
            if not self._framed:
                if len(self._input) < 2:
                    return b""
                self._framed = True
                try:
                    return self._inflate(room)
                except zlib.error:  # not a zlib header: a raw deflate stream
                    self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._inflate(room)
            if out or not (self._zlib.eof and self._zlib.unused_data):
                return out

    def _inflate(self, room: int) -> bytes:
        out = self._zlib.decompress(self._input, room)
        self._input = self._zlib.unconsumed_tail
        return out

    def finish(self) -> None:
        """After the last of the body: was the stream whole?"""
        if self._fed and not self._zlib.eof:
            raise zlib.error("the body ended inside its compressed stream")


def deadline_transport() -> httpx.BaseTransport | None:
    """httpx's default transport, whose socket waits end at the deadline of the request in
    flight (see ``_DeadlineBackend``). None (httpx's own choice) when the environment names a
    proxy: a transport given to the client would turn the proxy off."""
    if any(scheme != "no" for scheme in urllib.request.getproxies()):
        return None
    transport = httpx.HTTPTransport()
    # httpx (0.28) offers no argument for httpcore's network backend (encode/httpx#3749 adds
    # one), so it is swapped in on the pool, before any connection exists. Should httpx move
    # it, the body checks in BoundedClient still hold; the header-drip test notices the loss.
    pool: Any = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, httpcore.NetworkBackend):
        pool._network_backend = _DeadlineBackend(backend)
    return transport


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """A socket wait's timeout, cut to what is left before this thread's request deadline."""
    deadline = _deadline.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the request's time limit ran out")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                      _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Connections whose every wait (connect, TLS, each read and write) ends by the deadline of
    the request using them: a per-wait timeout alone restarts with every byte."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_tcp(host, port, _left(timeout, httpcore.ConnectTimeout),
                                                         local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._backend.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout),
                                                                 socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)
