"""The in-process stream store of the embedded mode: fakeredis over one shared server, so every
client in the process (worker threads, the demo, the API) sees the same streams."""

from __future__ import annotations

import threading

import fakeredis

_server: fakeredis.FakeServer | None = None
_lock = threading.Lock()


def embedded_server() -> fakeredis.FakeServer:
    global _server
    with _lock:
        if _server is None:
            _server = fakeredis.FakeServer()
        return _server


def embedded_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=embedded_server(), decode_responses=True)


def embedded_async_redis() -> fakeredis.FakeAsyncRedis:
    return fakeredis.FakeAsyncRedis(server=embedded_server(), decode_responses=True)
