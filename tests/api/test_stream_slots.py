"""The per-tenant cap on open event streams, over a real socket (TestClient buffers whole
responses, so it cannot hold a stream open)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from api.main import create_app
from tests.conftest import Harness


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` under uvicorn on a free port, in a thread; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A stream its client left open (a reader thread still in it) is cut after a second, as
    # `kortex api` cuts them after its own grace: the server must be gone before the test's
    # database is, or it lingers into the next tests.
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                        timeout_graceful_shutdown=1))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "uvicorn did not stop"


@pytest.fixture
def server(harness_factory: Any) -> Iterator[tuple[str, Any, Harness]]:
    h = harness_factory(turn={"heartbeat": 0.1, "max_streams_per_tenant": 2})
    app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with serve(app) as url:
        yield url, app, h


def _turn(url: str, key: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    sid = httpx.post(f"{url}/v1/sessions", json={"model": "scripted:text_only"}, headers=headers).json()["id"]
    posted = httpx.post(f"{url}/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=headers)
    return str(posted.json()["events_url"])  # never driven: its stream stays open on keepalives


def _wait(predicate: Any) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_tenant_past_its_open_stream_cap_gets_429_and_a_closed_stream_frees_its_slot(server) -> None:
    url, app, h = server
    key_a, key_b = h.api_key(h.tenant("a")), h.api_key(h.tenant("b"))
    events_a, events_b = _turn(url, key_a), _turn(url, key_b)
    slots = app.state.stream_slots
    tenant_a = h.tenant("a")
    with httpx.Client(base_url=url, timeout=10) as client, contextlib.ExitStack() as stack:
        readers: list[Iterator[str]] = []  # kept alive: a collected reader closes its stream

        def open_stream(key: str, path: str) -> httpx.Response:
            response = stack.enter_context(client.stream("GET", path, headers={"Authorization": f"Bearer {key}"}))
            if response.status_code == 200:
                readers.append(response.iter_lines())
                assert next(readers[-1]).startswith("retry:")
            return response

        first = open_stream(key_a, events_a)
        second = open_stream(key_a, events_a)
        assert first.status_code == second.status_code == 200 and slots.open(tenant_a) == 2
        refused = client.get(events_a, headers={"Authorization": f"Bearer {key_a}"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
        assert open_stream(key_b, events_b).status_code == 200  # another tenant is not affected

        first.close()
        _wait(lambda: slots.open(tenant_a) == 1)  # the server noticed the client leave
        assert open_stream(key_a, events_a).status_code == 200
    _wait(lambda: slots.open(tenant_a) == 0 and slots.open(h.tenant("b")) == 0)


def _gauge(url: str) -> float:
    scraped = httpx.get(f"{url}/metrics").text
    return float(next(line.split()[-1] for line in scraped.splitlines()
                      if line.startswith("kortex_sse_streams_open")))


def test_post_mortem_feeds_share_the_tenants_stream_cap_and_are_counted_open(server) -> None:
    url, app, h = server
    tenant = h.tenant("a")
    h.seed(tenant, "incident-archive")
    key = h.api_key(tenant)
    auth = {"Authorization": f"Bearer {key}"}
    job = httpx.post(f"{url}/v1/postmortems", json={"incident_ids": ["INC-1101"]}, headers=auth)
    assert job.status_code == 202, job.text
    feed, events = f"/v1/postmortems/{job.json()['job_id']}/events", _turn(url, key)
    before = _gauge(url)
    with httpx.Client(base_url=url, timeout=10) as client, contextlib.ExitStack() as stack:
        first = stack.enter_context(client.stream("GET", feed, headers=auth))  # never run: stays open
        assert first.status_code == 200 and _gauge(url) == before + 1
        turn = stack.enter_context(client.stream("GET", events, headers=auth))
        assert turn.status_code == 200  # the cap is 2: one feed and one turn stream
        for path in (feed, events):
            refused = client.get(path, headers=auth)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited", path
        assert _gauge(url) == before + 2
        first.close()
        _wait(lambda: app.state.stream_slots.open(tenant) == 1)
        second = stack.enter_context(client.stream("GET", feed, headers=auth))
        assert second.status_code == 200
    _wait(lambda: app.state.stream_slots.open(tenant) == 0 and _gauge(url) == before)
