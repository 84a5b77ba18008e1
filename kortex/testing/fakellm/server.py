"""A small HTTP/1.1 server (asyncio streams, keep-alive, chunked bodies) that answers the
Anthropic, OpenAI and Ollama endpoints from scripts. Written by hand rather than on a web
framework so it can fail the way networks do: reset a connection mid-body, end a body early,
stall between chunks.

Run it in a thread (``with FakeLLM(scripts) as fake: ... fake.url``) or as a process
(``python -m kortex.testing.fakellm``) when its CPU must not count as the client's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kortex.testing.fakellm.formats import FORMATS, Ollama, Piece
from kortex.testing.fakellm.script import FakeScript, FakeStep

log = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024
MAX_BODY = 32 * 1024 * 1024
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 529: "Overloaded"}


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the fake received it (tests read these to check what an adapter sent)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    streams_completed: int = 0
    client_disconnects: int = 0  # the client went away before the body was complete
    counters: dict[tuple[str, str, int], int] = field(default_factory=dict)


class FakeLLM:
    def __init__(self, scripts: Mapping[str, FakeScript | dict[str, Any]] | None = None, *, default: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, ollama_models: Iterable[str] = (),
                 keep_requests: int = 1000) -> None:
        self._lock = threading.Lock()
        self.scripts: dict[str, FakeScript] = {}
        for name, script in (scripts or {}).items():
            self.add(name, script)
        self.default = default
        self.host = host
        self.port = port
        self.ollama_models = list(ollama_models)
        self.requests: deque[Recorded] = deque(maxlen=keep_requests)
        self.stats = Stats()
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    # -- scripts --------------------------------------------------------------------------

    def add(self, name: str, script: FakeScript | dict[str, Any]) -> None:
        with self._lock:
            self.scripts[name] = script if isinstance(script, FakeScript) else FakeScript.model_validate(script)

    def script_for(self, model: str) -> FakeScript | None:
        with self._lock:
            return self.scripts.get(model) or (self.scripts.get(self.default) if self.default else None)

    def _take_fault(self, key: tuple[str, str, int], step: FakeStep) -> Any:
        with self._lock:
            used = self.stats.counters.get(key, 0)
            if used < len(step.faults):
                self.stats.counters[key] = used + 1
                return step.faults[used]
        return None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- running --------------------------------------------------------------------------

    async def start_async(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=MAX_HEAD,
                                                  backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start_async()
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    def start(self) -> FakeLLM:
        """Serve from a background thread; returns once the port is bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as exc:  # surface bind errors to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._close())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-llm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Open connections (keep-alive, or a stream pausing between pieces) would outlive the loop.
        tasks = list(self._tasks)
        for task, writer in list(self._tasks.items()):
            writer.transport.abort()
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = self._thread = None

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP -----------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks[task] = writer
        with self._lock:
            self.stats.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _version = (request_line.split(" ") + ["", ""])[:3]
                headers = {}
                for line in lines:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                if length > MAX_BODY:
                    await self._reply(writer, 413, b'{"error":"too large"}', close=True)
                    return
                raw = await reader.readexactly(length) if length else b""
                try:
                    keep = await self._handle(method, path.split("?", 1)[0], headers, raw, writer)
                except (ConnectionError, asyncio.CancelledError):
                    raise
                except Exception as exc:  # a bug in the fake must show up as a failure, not a hang
                    log.exception("fake LLM server failed")
                    await self._reply(writer, 500, json.dumps({"error": f"fake: {exc!r}"}).encode(), close=True)
                    return
                if not keep:
                    return
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # Only the server's shutdown cancels; ending normally keeps Python 3.11's
            # asyncio.streams from raising in its done-callback.
            return
        finally:
            self._tasks.pop(task, None)
            if not writer.transport.is_closing():
                writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, status: int, body: bytes, *,
                     content_type: str = "application/json", extra: dict[str, str] | None = None,
                     close: bool = False) -> None:
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"content-type: {content_type}",
                f"content-length: {len(body)}", f"connection: {'close' if close else 'keep-alive'}"]
        head += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()

    async def _handle(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                      writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must not be reused."""
        with self._lock:
            self.stats.requests += 1
        if path == "/api/tags" and method == "GET":
            self.requests.append(Recorded(method, path, headers, None))
            await self._reply(writer, 200, Ollama.tags(self.ollama_models or sorted(self.scripts)))
            return True
        wire = FORMATS.get(path)
        if wire is None or method != "POST":
            await self._reply(writer, 404, b'{"error":"not found"}')
            return True
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await self._reply(writer, 400, wire.error(400, "the body is not JSON"))
            return True
        self.requests.append(Recorded(method, path, headers, body))
        problem = wire.check(headers, body)
        if problem is not None:
            await self._reply(writer, problem[0], wire.error(*problem))
            return True
        model = str(body.get("model") or "")
        script = self.script_for(model)
        conv = wire.conversation(body)
        step = script.step(conv.step) if script else None
        if script is None or step is None:
            await self._reply(writer, 404 if script is None else 400,
                              wire.error(404 if script is None else 400,
                                         f"fake: no script for model {model!r} at step {conv.step}"))
            return True
        if wire is Ollama and body.get("tools") and not script.native_tools:
            refusal = f"registry.ollama.ai/library/{model} does not support tools"
            await self._reply(writer, 400, wire.error(400, refusal))
            return True
        fault = self._take_fault((model, conv.first_user, conv.step), step)
        if fault is not None and fault.disconnect:
            _reset(writer)
            return False
        if fault is not None:
            extra = {"retry-after": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            await self._reply(writer, fault.status, wire.error(fault.status, fault.message, fault.kind), extra=extra)
            return True
        if body.get("stream") is False:
            await self._reply(writer, 400, wire.error(400, "fake: only streaming is scripted"))
            return True
        return await self._stream(writer, wire.content_type, wire.render(step, model, body, conv), step)

    async def _stream(self, writer: asyncio.StreamWriter, content_type: str, pieces: list[Piece],
                      step: FakeStep) -> bool:
        head = (f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncache-control: no-cache\r\n"
                "transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")
        delay = step.delay_ms / 1000.0
        texts = 0
        started = asyncio.get_running_loop().time()
        try:
            writer.write(head.encode())
            for piece in pieces:
                if piece.text and step.disconnect_after is not None and texts >= step.disconnect_after:
                    _reset(writer)
                    return False
                if piece.text and step.truncate_after is not None and texts >= step.truncate_after:
                    if step.truncate_partial:  # the body ends in the middle of a frame
                        half = piece.data[:max(1, len(piece.data) // 2)]
                        writer.write(b"%x\r\n%s\r\n" % (len(half), half))
                    break
                if piece.text and step.paced:
                    await writer.drain()  # what is due now (headers, message_start) goes out first
                    await self._pause_until(started, step.text_due_s(texts))
                if delay:
                    await writer.drain()
                    await asyncio.sleep(delay)
                await self._write(writer, piece.data, step.split_bytes if piece.text else None)
                texts += piece.text
                if delay or step.paced or writer.transport.get_write_buffer_size() > 65536:
                    await writer.drain()
            if step.after_end == "reset":
                await writer.drain()
                _reset(writer)
                return False
            if step.after_end == "stall":  # everything sent, but the body does not end yet
                await writer.drain()
                await asyncio.sleep(step.stall_ms / 1000.0)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            with self._lock:
                self.stats.client_disconnects += 1
            return False
        with self._lock:
            self.stats.streams_completed += 1
        return True

    @staticmethod
    async def _pause_until(started: float, offset: float) -> None:
        """Sleep until ``offset`` seconds after ``started`` (loop time); tests replace it."""
        wait = started + offset - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, data: bytes, split: int | None) -> None:
        """One frame, as one HTTP chunk or in slices of ``split`` bytes sent apart."""
        if not split:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            return
        for at in range(0, len(data), split):
            part = data[at:at + split]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.001)  # so the client's reads see the slices, not their sum


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset, as a crashing proxy or a dropped link looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
