"""`kortex ask --url` when its event stream breaks before the turn ends (the API restarting, a
proxy cutting a long response): the command opens the stream again from the last event it
read (Last-Event-ID), so the answer arrives whole, no event twice, and the command succeeds.
It used to exit 1 ("RemoteProtocolError: peer closed connection ...") with the turn still
running at the server, unseen."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kortex_cli.main import app
from tests.kortex_cli.test_remote import Api, api  # noqa: F401  (the module's real `kortex api`)

WORDS = [f"word{i} " for i in range(12)]
SCRIPT = {"steps": [{"text": WORDS, "delay_ms": 150}]}
CUT_AFTER_TEXTS = 3


class CuttingProxy(ThreadingHTTPServer):
    """Passes every request on to the API; the first event stream is cut after
    ``CUT_AFTER_TEXTS`` text events: mid-response (a chunk begun and never finished, as a process
    that dies leaves it) or, ``clean``, ended at an event's end without ``done`` (as a stopping
    API ends its streams)."""

    daemon_threads = True

    def __init__(self, upstream: str, clean: bool = False) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream, self.clean = upstream, clean
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.streams: list[str | None] = []  # the Last-Event-ID of each events request
        self.relayed_ids: list[str] = []  # ids of the events the cut stream passed on
        self.lock = threading.Lock()


class _Relay(BaseHTTPRequestHandler):
    server: CuttingProxy
    protocol_version = "HTTP/1.1"

    def _headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items()
                if k.lower() in ("authorization", "content-type", "idempotency-key", "accept", "last-event-id")}

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "GET" and self.path.endswith("/events"):
            self._events()
            return
        answer = httpx.request(self.command, self.server.upstream + self.path, content=body,
                               headers=self._headers(), timeout=60)
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def _events(self) -> None:
        with self.server.lock:
            first = not self.server.streams
            self.server.streams.append(self.headers.get("Last-Event-ID"))
        with httpx.stream("GET", self.server.upstream + self.path, headers=self._headers(),
                          timeout=httpx.Timeout(30, read=None)) as upstream:
            self.send_response(upstream.status_code)
            self.send_header("Content-Type", upstream.headers.get("content-type", "text/event-stream"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            texts, block = 0, list[str]()
            for line in upstream.iter_lines():
                block.append(line)
                if line != "":
                    continue
                raw = ("\n".join(block) + "\n").encode()
                block = []
                ids = [b[3:].strip() for b in raw.decode().splitlines() if b.startswith("id:")]
                if first and ids:
                    self.server.relayed_ids.append(ids[0])
                self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                self.wfile.flush()
                texts += raw.startswith(b"event: text") or b"\nevent: text" in raw
                if first and texts >= CUT_AFTER_TEXTS and self.server.clean:
                    self.wfile.write(b"0\r\n\r\n")  # the response's proper end, before the turn's
                    self.wfile.flush()
                    return
                if first and texts >= CUT_AFTER_TEXTS:
                    self.wfile.write(b"40\r\nevent: te")  # a chunk cut short, then the connection
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
            self.wfile.write(b"0\r\n\r\n")

    do_GET = do_POST = do_DELETE = _forward

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["cut", "clean"])
def proxy(api: Api, request: pytest.FixtureRequest) -> Iterator[CuttingProxy]:  # noqa: F811
    (Path(api.env["KORTEX_TESTING__SCRIPTS_DIR"]) / "resume.json").write_text(json.dumps(SCRIPT))
    server = CuttingProxy(api.url, clean=request.param == "clean")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_broken_event_stream_is_resumed_from_the_last_event_read(api: Api, proxy: CuttingProxy) -> None:  # noqa: F811
    result = CliRunner().invoke(app, ["ask", "hi", "--model", "scripted:resume", "--url", proxy.url,
                                      "--api-key", api.key, "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    text = "".join(e["data"]["delta"] for e in events if e["event"] == "text")
    assert text == "".join(WORDS)  # each word once, in order: nothing lost, nothing twice
    seqs = [e["data"]["seq"] for e in events if "seq" in e["data"]]
    assert seqs == sorted(set(seqs))
    assert events[-1]["event"] == "done" and events[-1]["data"]["status"] == "done"
    # Opened again from the last event the broken stream delivered, not from the start.
    assert len(proxy.streams) >= 2 and proxy.streams[0] is None
    assert proxy.streams[1] == proxy.relayed_ids[-1]
    assert "event stream broke" in result.stderr and "resuming" in result.stderr
    if proxy.clean:
        assert "(the stream ended before the turn did)" in result.stderr
