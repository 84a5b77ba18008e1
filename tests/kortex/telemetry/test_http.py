"""Prometheus and Loki answers are bounded in time and size (kortex/telemetry/http.py), against
a real HTTP server on 127.0.0.1 that misbehaves on purpose: it drips its answer, or sends far
more than any answer should hold. Each test checks the call ends with an upstream error and
that the server saw Kortex hang up before it had sent everything (the thread and the connection
are released, and the body was never held in memory)."""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from kortex.errors import UpstreamError
from kortex.telemetry.loki import LokiLogs
from kortex.telemetry.prometheus import PrometheusMetrics
from kortex.telemetry.sources import LogQuery
from tests.conftest import Harness

Send = Callable[[bytes], None]
#: how long a misbehaving answer would go on if nobody hung up: far past any wait below
DRIP_FOR = 60.0
CHUNK = b" " * 65536


class Server:
    """Accepts connections, reads each request's head, then runs ``respond(send, stop)`` on it.
    ``hung_up`` is set when a send fails because the client closed the connection, ``finished``
    when a response was sent whole; ``sent`` counts the bytes that went out, ``heads`` holds each
    request's head as received."""

    def __init__(self, respond: Callable[[Send, threading.Event], None]) -> None:
        self.respond = respond
        self.stop = threading.Event()
        self.hung_up = threading.Event()
        self.finished = threading.Event()
        self.sent = 0
        self.connections = 0
        self.heads: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        self.connections += 1

        def send(data: bytes) -> None:
            conn.sendall(data)
            self.sent += len(data)

        with conn:
            while True:  # one request after another while the client keeps the connection
                head = b""
                while b"\r\n\r\n" not in head:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    head += data
                self.heads.append(head)
                try:
                    self.respond(send, self.stop)
                except OSError:  # ECONNRESET / EPIPE: the client is gone
                    self.hung_up.set()
                    return
                self.finished.set()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Send, threading.Event], None]], Server]]:
    servers: list[Server] = []

    def start(respond: Callable[[Send, threading.Event], None]) -> Server:
        servers.append(Server(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def drip_body(send: Send, stop: threading.Event) -> None:
    """A 200 whose chunked body comes a byte every 50 ms (each read is quick: no read timeout)."""
    send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{\r\n")
    deadline = time.monotonic() + DRIP_FOR
    while time.monotonic() < deadline and not stop.wait(0.05):
        send(b"1\r\n \r\n")


def drip_headers(send: Send, stop: threading.Event) -> None:
    """A status line, then one header that never ends, a byte every 50 ms."""
    send(b"HTTP/1.1 200 OK\r\nx-slow: ")
    deadline = time.monotonic() + DRIP_FOR
    while time.monotonic() < deadline and not stop.wait(0.05):
        send(b"a")


def endless(status: bytes, *, declared: int | None, total: int) -> Callable[[Send, threading.Event], None]:
    """An answer of ``total`` bytes of spaces, chunked or (``declared``) with a Content-Length."""

    def respond(send: Send, stop: threading.Event) -> None:
        framing = f"content-length: {declared}" if declared is not None else "transfer-encoding: chunked"
        send(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n" + framing.encode() + b"\r\n\r\n")
        for _ in range(total // len(CHUNK)):
            send(CHUNK if declared is not None else b"10000\r\n" + CHUNK + b"\r\n")
        if declared is None:
            send(b"0\r\n\r\n")

    return respond


def source(kind: str, url: str, timeout: float = 10.0) -> PrometheusMetrics | LokiLogs:
    if kind == "prometheus":
        return PrometheusMetrics(url, single_tenant=True, timeout=timeout)
    return LokiLogs(url, timeout=timeout)


def ask(src: PrometheusMetrics | LokiLogs) -> Any:
    if isinstance(src, PrometheusMetrics):
        return src.list_metrics("t", "checkout")
    return src.query_logs("t", LogQuery(product="checkout", start=datetime(2026, 1, 1, tzinfo=UTC),
                                         end=datetime(2026, 1, 2, tzinfo=UTC)))


def ask_in_thread(src: PrometheusMetrics | LokiLogs, wait: float = 10.0) -> BaseException | None:
    """What ``ask`` raised, from a thread given ``wait`` seconds (far less than DRIP_FOR):
    a call still running then fails the test instead of hanging it."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            ask(src)
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(wait)
    assert not thread.is_alive(), f"the call was still running after {wait}s"
    return outcome[0]


KINDS = ["prometheus", "loki"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_dripping_answer_ends_at_the_timeout_and_the_connection_is_closed(kind: str, serve: Any) -> None:
    server = serve(drip_body)
    src = source(kind, server.url, timeout=0.5)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert "still sending" in error.message and f"telemetry.{kind}.timeout" in error.message
    assert server.hung_up.wait(5) and not server.finished.is_set()


@pytest.mark.parametrize("kind", KINDS)
def test_headers_sent_a_byte_at_a_time_do_not_stretch_the_timeout(kind: str, serve: Any) -> None:
    server = serve(drip_headers)
    src = source(kind, server.url, timeout=0.5)
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError), error
    assert "did not answer within 0.5s" in error.message
    assert server.hung_up.wait(5) and not server.finished.is_set()


@pytest.mark.parametrize(("kind", "tool", "args"), [
    ("prometheus", "get_metrics", {"product": "checkout", "metric_name": "up", "time_range": "last 1h"}),
    ("loki", "get_logs", {"product": "checkout", "time_range": "last 1h"}),
])
def test_an_abandoned_tool_call_stops_reading_at_its_deadline(harness: Harness, serve: Any, kind: str, tool: str,
                                                              args: dict[str, Any]) -> None:
    """The source's own timeout is long; the tool's is short: the source stops at the tool
    call's deadline, so the thread the pipeline abandoned ends and is no longer counted stuck."""
    server = serve(drip_body)
    src = source(kind, server.url, timeout=DRIP_FOR)
    if kind == "prometheus":
        harness.k.sources.metrics = src  # type: ignore[assignment]
    else:
        harness.k.sources.logs = src  # type: ignore[assignment]
    harness.k.pipeline.timeouts[tool] = 0.5
    try:
        result = harness.call(harness.tenant("acme"), tool, args)
        assert result.error_code == "timeout", result.content
        assert server.hung_up.wait(10) and not server.finished.is_set()
        waited = time.monotonic() + 10
        while harness.k.pipeline.stuck_calls and time.monotonic() < waited:
            time.sleep(0.01)
        assert harness.k.pipeline.stuck_calls == 0
    finally:
        src.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_oversize_answer_is_refused_without_holding_it(kind: str, serve: Any) -> None:
    total = 64 * 1024 * 1024  # twice the cap, and more than the socket buffers between us hold
    server = serve(endless(b"200 OK", declared=None, total=total))
    src = source(kind, server.url)
    tracemalloc.start()
    try:
        with pytest.raises(UpstreamError, match="larger than 32 MiB"):
            ask(src)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        src.close()
    assert server.hung_up.wait(5) and not server.finished.is_set() and server.sent < total
    assert peak < 40 * 1024 * 1024  # at most the cap, not the whole answer


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_declared_oversize_is_not_read_at_all(kind: str, serve: Any) -> None:
    total = 40 * 1024 * 1024
    server = serve(endless(b"200 OK", declared=1 << 30, total=total))
    src = source(kind, server.url)
    try:
        with pytest.raises(UpstreamError, match="larger than 32 MiB"):
            ask(src)
    finally:
        src.close()
    assert server.hung_up.wait(5) and not server.finished.is_set() and server.sent < total


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_error_body_is_cut_and_the_status_still_reported(kind: str, serve: Any) -> None:
    total = 50 * 1024 * 1024
    server = serve(endless(b"400 Bad Request", declared=total, total=total))
    src = source(kind, server.url)
    tracemalloc.start()
    try:
        with pytest.raises(UpstreamError, match=r"upstream: 400 .*error body over 64 KiB, not read whole"):
            ask(src)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        src.close()
    assert server.hung_up.wait(5) and not server.finished.is_set() and server.sent < total
    assert peak < 8 * 1024 * 1024


def test_well_behaved_answers_still_come_back_over_a_kept_connection(serve: Any) -> None:
    """The deadline transport changes nothing for a server that answers: both calls succeed, on
    one connection (the deadline of the first does not linger on it)."""
    body = b'{"status":"success","data":["up","queue_depth"]}'

    def respond(send: Send, stop: threading.Event) -> None:
        send(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)

    server = serve(respond)
    src = PrometheusMetrics(server.url, single_tenant=True, timeout=0.5)
    try:
        assert src.list_metrics("t", "checkout") == ["queue_depth", "up"]
        time.sleep(0.6)  # past the first request's deadline
        assert src.list_metrics("t", "checkout") == ["queue_depth", "up"]
    finally:
        src.close()
    assert server.finished.is_set() and server.connections == 1


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_that_quotes_the_refused_token_never_shows_it(kind: str, serve: Any) -> None:
    token = "corp-obs-7f3a9b2c1d"  # no shape a pattern would know

    def refuse(send: Send, stop: threading.Event) -> None:
        body = json.dumps({"status": "error", "errorType": "auth",
                           "error": f"bad token {token} for this org"}).encode()
        send(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: "
             + str(len(body)).encode() + b"\r\n\r\n" + body)

    server = serve(refuse)
    src = (PrometheusMetrics(server.url, single_tenant=True, bearer_token=token) if kind == "prometheus"
           else LokiLogs(server.url, bearer_token=token))
    try:
        error = ask_in_thread(src)
    finally:
        src.close()
    assert isinstance(error, UpstreamError) and "401" in error.message, error
    assert token not in error.message and token[:6] not in error.message
