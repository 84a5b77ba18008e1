"""Compressed answers from Prometheus and Loki (kortex/telemetry/http.py), against a real HTTP
server on 127.0.0.1: Kortex asks for gzip or deflate only and decodes them itself a bounded piece
at a time, so a small compressed answer that decodes to far more than the cap (a "bomb") is
refused, or cut, like any answer over the cap, without its decoded bytes ever being in memory.
A body that is not what its Content-Encoding says, or in an encoding Kortex does not decode, is
an upstream error naming the source."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from kortex.errors import UpstreamError
from kortex.telemetry.http import BoundedClient
from kortex.telemetry.loki import LokiLogs
from kortex.telemetry.prometheus import PrometheusMetrics
from tests.kortex.telemetry.test_http import KINDS, Send, Server, ask, ask_in_thread

MiB = 1024 * 1024
#: how much a bomb decodes to: far past any cap
BOMB_SIZE = 200 * MiB
#: zlib's wbits for each encoding's framing: gzip, zlib ("deflate" as the RFC says) and raw
#: deflate (what some servers send as "deflate")
WBITS = {"gzip": 31, "deflate": 15, "raw-deflate": -15}
HEADER = {"gzip": "gzip", "deflate": "deflate", "raw-deflate": "deflate"}
METRICS = b'{"status":"success","data":["queue_depth","up"]}'


def compress(data: bytes, encoding: str) -> bytes:
    return zlib.compress(data, 6, WBITS[encoding])


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """BOMB_SIZE zeros in each encoding (about 200 KB each), made once for the module."""
    made = {}
    zeros = bytes(MiB)
    for encoding in ("gzip", "deflate"):
        packer = zlib.compressobj(9, zlib.DEFLATED, WBITS[encoding])
        made[encoding] = b"".join([packer.compress(zeros) for _ in range(BOMB_SIZE // MiB)] + [packer.flush()])
        assert len(made[encoding]) < BOMB_SIZE // 500
    return made


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Send, threading.Event], None]], Server]]:
    servers: list[Server] = []

    def start(respond: Callable[[Send, threading.Event], None]) -> Server:
        servers.append(Server(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def encoded(status: bytes, body: bytes, encoding: str | None) -> Callable[[Send, threading.Event], None]:
    """An answer whose (already encoded) ``body`` is sent chunked, 64 KiB at a time, with
    ``Content-Encoding: encoding`` (none when None)."""

    def respond(send: Send, stop: threading.Event) -> None:
        header = f"content-encoding: {encoding}\r\n" if encoding is not None else ""
        send(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n"
             + header.encode() + b"\r\n")
        for at in range(0, len(body), 65536):
            piece = body[at:at + 65536]
            send(b"%x\r\n" % len(piece) + piece + b"\r\n")
        send(b"0\r\n\r\n")

    return respond


def source(kind: str, url: str, *, max_bytes: int | None = None, timeout: float = 10.0,
           bearer_token: str | None = None) -> PrometheusMetrics | LokiLogs:
    cap: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
    if kind == "prometheus":
        return PrometheusMetrics(url, single_tenant=True, timeout=timeout, bearer_token=bearer_token, **cap)
    return LokiLogs(url, timeout=timeout, bearer_token=bearer_token, **cap)


def peak_while(call: Callable[[], Any]) -> tuple[BaseException | None, int]:
    """What ``call`` raised (None if nothing) and the most memory traced while it ran."""
    tracemalloc.start()
    try:
        try:
            call()
            error: BaseException | None = None
        except Exception as exc:  # handed to the test
            error = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return error, peak


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compression_bomb_is_refused_as_over_the_cap_without_decoding_it(
        kind: str, encoding: str, serve: Any, bombs: dict[str, bytes]) -> None:
    server = serve(encoded(b"200 OK", bombs[encoding], encoding))
    src = source(kind, server.url, max_bytes=MiB)
    try:
        error, peak = peak_while(lambda: ask(src))
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert f"{kind}'s answer is larger than 1 MiB" in error.message
    assert peak < 4 * MiB, f"{peak / MiB:.1f} MiB held for a 1 MiB cap"


def test_a_compression_bomb_at_the_real_cap_holds_no_more_than_the_cap(serve: Any, bombs: dict[str, bytes]) -> None:
    server = serve(encoded(b"200 OK", bombs["gzip"], "gzip"))
    src = source("prometheus", server.url)
    try:
        error, peak = peak_while(lambda: ask(src))
    finally:
        src.close()
    assert isinstance(error, UpstreamError) and "larger than 32 MiB" in error.message, error
    assert peak < 40 * MiB, f"{peak / MiB:.1f} MiB held for a 32 MiB cap"


@pytest.mark.parametrize("kind", KINDS)
def test_a_compressed_error_bomb_is_cut_and_the_status_still_reported(
        kind: str, serve: Any, bombs: dict[str, bytes]) -> None:
    server = serve(encoded(b"500 Internal Server Error", bombs["gzip"], "gzip"))
    src = source(kind, server.url)
    try:
        error, peak = peak_while(lambda: ask(src))
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert error.message.startswith("upstream: 500") and "error body over 64 KiB, not read whole" in error.message
    assert peak < MiB, f"{peak / MiB:.1f} MiB held for a 64 KiB error cap"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", None])
def test_a_compressed_answer_under_the_cap_decodes_and_only_gzip_or_deflate_is_asked_for(
        encoding: str | None, serve: Any) -> None:
    body = compress(METRICS, encoding) if encoding else METRICS
    server = serve(encoded(b"200 OK", body, HEADER[encoding] if encoding else None))
    src = PrometheusMetrics(server.url, single_tenant=True)
    try:
        assert src.list_metrics("t", "checkout") == ["queue_depth", "up"]
    finally:
        src.close()
    head = server.heads[0].lower()
    assert b"\r\naccept-encoding: gzip, deflate\r\n" in head, head


def test_a_large_compressed_log_page_decodes_whole(serve: Any) -> None:
    """Many raw reads, each decoding to more than it is: the pieces add up to the answer."""
    answer = {"status": "success", "data": {"resultType": "streams", "result": [
        {"stream": {"product": "checkout", "level": "info"},
         "values": [[str(1767225600000000000 + i), f"line {i} " + "x" * 200] for i in range(20_000)]}]}}
    raw = json.dumps(answer).encode()
    server = serve(encoded(b"200 OK", compress(raw, "gzip"), "gzip"))
    client = BoundedClient("loki", server.url, timeout=10.0)
    try:
        got = client.get("/loki/api/v1/query_range", params={})
    finally:
        client.close()
    assert got.status == 200 and got.body == raw


@pytest.mark.parametrize(("size", "fits"), [(1000, True), (1001, False)])
def test_the_cap_counts_decoded_bytes_exactly(size: int, fits: bool, serve: Any) -> None:
    data = b"a" * size
    server = serve(encoded(b"200 OK", compress(data, "gzip"), "gzip"))
    client = BoundedClient("prometheus", server.url, timeout=10.0, max_bytes=1000)
    try:
        if fits:
            assert client.get("/", params={}).body == data
        else:
            with pytest.raises(UpstreamError, match="larger than 1000 bytes"):
                client.get("/", params={})
    finally:
        client.close()


def test_a_compressed_error_body_over_the_cap_keeps_its_beginning(serve: Any) -> None:
    data = b'{"status":"error","error":"too many series"}' + b" " * 5000
    server = serve(encoded(b"422 Unprocessable Entity", compress(data, "gzip"), "gzip"))
    client = BoundedClient("prometheus", server.url, timeout=10.0, max_error_bytes=1024)
    try:
        answer = client.get("/", params={})
    finally:
        client.close()
    assert answer.status == 422 and answer.cut_at == 1024 and answer.body == data[:1024]


def test_gzip_members_one_after_another_decode_as_one_body(serve: Any) -> None:
    half = len(METRICS) // 2
    body = compress(METRICS[:half], "gzip") + compress(METRICS[half:], "gzip")
    server = serve(encoded(b"200 OK", body, "gzip"))
    src = PrometheusMetrics(server.url, single_tenant=True)
    try:
        assert src.list_metrics("t", "checkout") == ["queue_depth", "up"]
    finally:
        src.close()


def corrupt(encoding: str) -> bytes:
    good = compress(METRICS * 50, encoding)
    return good[:12] + bytes(b ^ 0x5A for b in good[12:40]) + good[40:]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("body", "encoding"), [
    (corrupt("gzip"), "gzip"),
    (compress(METRICS * 50, "gzip")[:-30], "gzip"),  # cut short
    (b"this is not gzip at all, just text", "gzip"),
    (corrupt("deflate"), "deflate"),
], ids=["corrupt-gzip", "truncated-gzip", "plain-text-as-gzip", "corrupt-deflate"])
def test_a_corrupt_compressed_body_is_an_upstream_error_naming_the_source(
        kind: str, body: bytes, encoding: str, serve: Any) -> None:
    server = serve(encoded(b"200 OK", body, encoding))
    src = source(kind, server.url)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert error.message.startswith(f"{kind}'s answer is not valid {encoding}"), error.message


def test_a_corrupt_compressed_error_body_still_names_the_source_and_status(serve: Any) -> None:
    server = serve(encoded(b"503 Service Unavailable", corrupt("gzip"), "gzip"))
    src = source("loki", server.url)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert error.message.startswith("loki's answer (503 Service Unavailable) is not valid gzip"), error.message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip"])
def test_an_encoding_kortex_does_not_decode_is_refused_by_name(kind: str, encoding: str, serve: Any) -> None:
    server = serve(encoded(b"200 OK", compress(METRICS, "gzip"), encoding))
    src = source(kind, server.url)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert error.message.startswith(f"{kind} answered in Content-Encoding {encoding!r}, which Kortex does not "
                                    "decode"), error.message


@pytest.mark.parametrize("kind", KINDS)
def test_a_compressed_error_that_quotes_the_refused_token_never_shows_it(kind: str, serve: Any) -> None:
    token = "corp-obs-7f3a9b2c1d"
    body = json.dumps({"status": "error", "errorType": "auth", "error": f"bad token {token} for this org"}).encode()
    server = serve(encoded(b"401 Unauthorized", compress(body, "gzip"), "gzip"))
    src = source(kind, server.url, bearer_token=token)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError) and "401" in error.message, error
    assert "bad token" in error.message and token not in error.message and token[:6] not in error.message


@pytest.mark.parametrize("kind", KINDS)
def test_a_dripping_compressed_answer_still_ends_at_the_timeout(kind: str, serve: Any) -> None:
    """Each drip is a flushed piece of the gzip stream: it decodes as it comes, and the time
    limit is still checked between reads."""

    def drip(send: Send, stop: threading.Event) -> None:
        packer = zlib.compressobj(6, zlib.DEFLATED, WBITS["gzip"])
        send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
             b"transfer-encoding: chunked\r\n\r\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.wait(0.05):
            piece = packer.compress(b" ") + packer.flush(zlib.Z_SYNC_FLUSH)
            send(b"%x\r\n" % len(piece) + piece + b"\r\n")

    server = serve(drip)
    src = source(kind, server.url, timeout=0.5)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert "still sending" in error.message and f"telemetry.{kind}.timeout" in error.message
    assert server.hung_up.wait(5) and not server.finished.is_set()


#: a gzip member holding nothing: 20 bytes on the wire that decode to none
EMPTY_MEMBER = zlib.compress(b"", 6, WBITS["gzip"])


def test_a_compressed_body_that_decodes_to_nothing_is_capped_by_its_bytes_on_the_wire(serve: Any) -> None:
    total = 8 * MiB
    server = serve(encoded(b"200 OK", EMPTY_MEMBER * (total // len(EMPTY_MEMBER)), "gzip"))
    src = source("prometheus", server.url, max_bytes=MiB)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError) and "prometheus's answer is larger than 1 MiB" in error.message, error
    assert server.hung_up.wait(5) and not server.finished.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_a_compressed_drip_that_decodes_to_nothing_still_ends_at_the_timeout(kind: str, serve: Any) -> None:
    """Through a transport without the deadline on its socket waits (a caller's, or httpx's
    behind a proxy): only the check between reads stops it, and it must run for reads that
    decode to nothing too."""

    def drip(send: Send, stop: threading.Event) -> None:
        send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
             b"transfer-encoding: chunked\r\n\r\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.wait(0.05):
            send(b"%x\r\n" % len(EMPTY_MEMBER) + EMPTY_MEMBER + b"\r\n")

    server = serve(drip)
    transport = httpx.HTTPTransport()
    src = (PrometheusMetrics(server.url, single_tenant=True, timeout=0.5, transport=transport) if kind == "prometheus"
           else LokiLogs(server.url, timeout=0.5, transport=transport))
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert "still sending" in error.message and f"telemetry.{kind}.timeout" in error.message
    assert server.hung_up.wait(5) and not server.finished.is_set()
