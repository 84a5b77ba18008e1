"""Each list parameter and body at its limit and one past it (from a bounds audit): the limit's
value is accepted, one more is refused, 422 (413 for a body past the API's size)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import MAX_BODY_BYTES, create_app
from kortex.timeparse import utcnow
from tests.api.conftest import bearer
from tests.conftest import Harness


@pytest.fixture
def env(harness: Harness) -> Iterator[tuple[TestClient, Harness, dict[str, str]]]:
    app = create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, harness, bearer(harness.api_key(harness.tenant("bounds")))


def _log(n: int) -> dict[str, Any]:
    return {"ts": (utcnow() - timedelta(minutes=1)).isoformat(), "product": "checkout", "level": "info",
            "message": f"line {n}"}


def test_list_and_body_limits_hold_at_the_edge(env: tuple[TestClient, Harness, dict[str, str]]) -> None:
    client, h, key = env
    sid = client.post("/v1/sessions", json={}, headers=key).json()["id"]
    for url, top in (("/v1/sessions", 200), (f"/v1/sessions/{sid}/messages", 500), ("/v1/proposals", 200)):
        assert client.get(url, params={"limit": top}, headers=key).status_code == 200, url
        assert client.get(url, params={"limit": top + 1}, headers=key).status_code == 422, url
        assert client.get(url, params={"limit": 0}, headers=key).status_code == 422, url
    cap = h.settings.turn.max_message_chars
    assert client.post(f"/v1/sessions/{sid}/messages", json={"content": "x" * (cap + 1)},
                       headers=key).status_code == 422
    ok = client.post(f"/v1/sessions/{sid}/messages", json={"content": "x" * cap}, headers=key)
    assert ok.status_code == 202, ok.text
    # ingest: 5000 items is the most a batch holds (and 1 MiB the most a body does)
    assert client.post("/v1/ingest/logs", json={"items": [_log(n) for n in range(5001)]},
                       headers=key).status_code in (413, 422)
    assert client.post("/v1/ingest/logs", json={"items": [_log(n) for n in range(5000)]},
                       headers=key).status_code == 200
    body = json.dumps({"items": [{**_log(0), "message": "m" * (MAX_BODY_BYTES - 150)}]})
    assert client.post("/v1/ingest/logs", content=body + " " * (MAX_BODY_BYTES - len(body) + 1),
                       headers={**key, "content-type": "application/json"}).status_code == 413
    refs = [f"INC-{n}" for n in range(1001)]
    assert client.post("/v1/postmortems", json={"incident_ids": refs}, headers=key).status_code == 422
