"""An event stream ends when the key that opened it is revoked, wherever the revocation came from:
a key is checked when a request comes in, but a stream stays open as long as its turn runs (a
post-mortem job's feed up to an hour). Over a real socket (api/revocation.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.main import create_app
from kortex import keys
from tests.api.test_stream_slots import serve
from tests.conftest import Harness

pytestmark = pytest.mark.timeout(60)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def server(harness_factory: Any) -> Iterator[tuple[str, Any, Harness]]:
    # Keepalives every 30 s: a stream that ends soon after the revocation was ended by it.
    h = harness_factory(turn={"heartbeat": 30.0})
    app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with serve(app) as url:
        yield url, app, h


class Reader:
    """Reads a stream's lines on a thread of its own, so that the test can see it end."""

    def __init__(self, client: httpx.Client, path: str, key: str, stack: contextlib.ExitStack) -> None:
        self.response = stack.enter_context(client.stream("GET", path, headers=auth(key)))
        assert self.response.status_code == 200, self.response.read()
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            for line in self.response.iter_lines():
                self.lines.append(line)

    def ended_within(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive()


def _queued_turn(url: str, key: str) -> str:
    sid = httpx.post(f"{url}/v1/sessions", json={"model": "scripted:text_only"}, headers=auth(key)).json()["id"]
    posted = httpx.post(f"{url}/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key))
    return str(posted.json()["events_url"])  # never driven: its stream stays open


def test_a_turn_stream_ends_when_its_key_is_revoked_elsewhere_and_other_keys_streams_go_on(server) -> None:
    url, app, h = server
    tenant = h.tenant("acme")
    h.api_key(tenant)  # the tenant's admin key stays
    doomed, kept = h.api_key(tenant, role="chat"), h.api_key(tenant, role="chat")
    with httpx.Client(base_url=url, timeout=30) as client, contextlib.ExitStack() as stack:
        path = _queued_turn(url, doomed)
        revoked_stream = Reader(client, path, doomed, stack)
        other_stream = Reader(client, _queued_turn(url, kept), kept, stack)
        assert len(app.state.open_streams) == 2
        # Out of band, as `kortex admin revoke-key` does from another process: only the
        # revocation epoch in Redis tells this API process.
        keys.revoke_key(h.k, tenant, doomed.split("_")[1], by="test")

        assert revoked_stream.ended_within(10), "the revoked key's stream is still open"
        assert revoked_stream.lines[0].startswith("retry:")
        assert not any(line.startswith("event:") for line in revoked_stream.lines)
        assert not other_stream.ended_within(1.5)  # the other key's stream stays open
        assert len(app.state.open_streams) == 1
        assert client.get(path, headers=auth(doomed)).status_code == 401  # its reconnection is refused


def test_a_post_mortem_feed_ends_when_its_key_is_revoked_through_the_api(server) -> None:
    url, app, h = server
    tenant = h.tenant("acme")
    h.seed(tenant, "incident-archive")
    admin, reader = h.api_key(tenant), h.api_key(tenant, role="chat")
    job = httpx.post(f"{url}/v1/postmortems", json={"incident_ids": ["INC-1101"]}, headers=auth(admin))
    assert job.status_code == 202, job.text
    feed = f"/v1/postmortems/{job.json()['job_id']}/events"
    with httpx.Client(base_url=url, timeout=30) as client, contextlib.ExitStack() as stack:
        stream = Reader(client, feed, reader, stack)  # the job's items are never run: it stays open
        assert not stream.ended_within(1.5)
        assert client.delete(f"/v1/keys/{reader.split('_')[1]}", headers=auth(admin)).status_code == 200

        assert stream.ended_within(10), "the revoked key's feed is still open"
        assert client.get(feed, headers=auth(reader)).status_code == 401
        assert len(app.state.open_streams) == 0
