"""API key roles (kortex/access.py): only operators decide on proposals, ingest keys only
ingest, and every /v1 route is behind a key of the right role."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.access import ROLES, Permission
from tests.api.conftest import bearer
from tests.api.test_proposals import _propose
from tests.conftest import Harness

LOG = {"items": [{"product": "checkout", "ts": "2026-11-22T10:00:00Z", "level": "error", "message": "boom"}]}


def test_only_a_key_that_may_decide_confirms_or_rejects(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    chat, operator = harness.api_key(tenant, "chat"), harness.api_key(tenant, "operator")
    pid = _propose(harness, tenant)
    for verb in ("confirm", "reject"):
        refused = client.post(f"/v1/proposals/{pid}/{verb}", headers=bearer(chat))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        assert "operator" in refused.json()["error"]["message"]
    assert client.get(f"/v1/proposals/{pid}", headers=bearer(chat)).json()["status"] == "pending"  # may read
    confirmed = client.post(f"/v1/proposals/{pid}/confirm", headers=bearer(operator))
    assert confirmed.status_code == 200 and confirmed.json()["status"] == "confirmed"


def test_an_ingest_key_only_ingests_and_a_chat_key_cannot_ingest(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    ingest, chat = harness.api_key(tenant, "ingest"), harness.api_key(tenant, "chat")
    assert client.post("/v1/ingest/logs", json=LOG, headers=bearer(ingest)).status_code == 200
    assert client.post("/v1/ingest/logs", json=LOG, headers=bearer(chat)).status_code == 403
    for method, path in (("POST", "/v1/sessions"), ("GET", "/v1/tools"), ("GET", "/v1/llm/providers"),
                         ("GET", "/v1/proposals")):
        response = client.request(method, path, headers=bearer(ingest), json={} if method == "POST" else None)
        assert response.status_code == 403, path
    assert client.post("/v1/sessions", json={}, headers=bearer(chat)).status_code == 201


def test_every_v1_route_requires_a_key(harness: Harness) -> None:
    """Deny by default: a /v1 route added without a permission still answers 401, never data."""
    app = create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app) as client:
        for route in app.routes:
            path = getattr(route, "path", "")
            if not path.startswith("/v1/"):
                continue
            for method in sorted(getattr(route, "methods", ()) - {"HEAD"}):
                url = path.replace("{kind}", "logs")
                url = url.replace("{session_id}", "0").replace("{turn_id}", "0").replace("{proposal_id}", "0")
                assert client.request(method, url).status_code == 401, (method, path)


def test_unknown_roles_are_refused(harness: Harness) -> None:
    from kortex.errors import InvalidInput

    with pytest.raises(InvalidInput, match="unknown role"):
        harness.api_key(harness.tenant("acme"), "root")
    assert ROLES["admin"] == frozenset(Permission)
