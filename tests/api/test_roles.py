"""API key roles (kortex/access.py): only operators decide on proposals, ingest keys only
ingest, and every /v1 route is behind a key of the right role."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.access import ROLES, Permission
from tests.api.conftest import bearer
from tests.api.test_proposals import _propose
from tests.conftest import Harness

LOG = {"items": [{"product": "checkout", "ts": "2026-11-22T10:00:00Z", "level": "error", "message": "boom"}]}


def _v1_operations(app: Any) -> list[tuple[str, str]]:
    """Every /v1 method and path, ids filled in (from the OpenAPI document: FastAPI 0.165's
    ``app.routes`` lists an included router as one entry, not its routes)."""
    return [(method.upper(), re.sub(r"\{[a-z_]+\}", "0", path.replace("{kind}", "logs")))
            for path, operations in app.openapi()["paths"].items() if path.startswith("/v1/")
            for method in operations if method in ("get", "post", "put", "patch", "delete")]


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
        operations = _v1_operations(app)
        assert len(operations) > 20
        for method, url in operations:
            assert client.request(method, url).status_code == 401, (method, url)


def test_unknown_roles_are_refused(harness: Harness) -> None:
    from kortex.errors import InvalidInput

    with pytest.raises(InvalidInput, match="unknown role"):
        harness.api_key(harness.tenant("acme"), "root")
    assert ROLES["admin"] == frozenset(Permission)


def test_the_key_is_checked_before_the_body_is_read(client: TestClient, harness: Harness,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import api.deps

    ingest = harness.api_key(harness.tenant("acme"), "ingest")
    bogus = "kx_000000000000_" + "A" * 40
    json_type = {"Content-Type": "application/json", "X-Request-ID": "req-7"}
    posts = [url for method, url in _v1_operations(client.app) if method in ("POST", "PUT", "PATCH")]
    assert len(posts) > 10
    for url in [*posts, "/v1/no-such-route"]:  # nor is a stranger told which paths exist
        for headers in ({}, bearer(bogus), {"Authorization": "Basic " + bogus}):
            refused = client.post(url, content=b"not json", headers={**json_type, **headers})
            assert refused.status_code == 401, (url, headers, refused.text)
            assert refused.json()["error"]["code"] == "unauthorized"
            assert refused.headers["WWW-Authenticate"] == "Bearer" and refused.headers["X-Request-ID"] == "req-7"
    lookups: list[str] = []
    real = api.deps.authenticate
    monkeypatch.setattr(api.deps, "authenticate", lambda k, key: lookups.append(key) or real(k, key))
    bad_body = client.post("/v1/ingest/logs", content=b"not json", headers={**json_type, **bearer(ingest)})
    assert bad_body.status_code == 422 and bad_body.json()["error"]["code"] == "validation"
    assert lookups == [ingest]  # verified once for the whole request, then cached
    assert client.post("/v1/ingest/logs", json=LOG, headers=bearer(ingest)).status_code == 200
    assert client.get("/v1/tools", headers=bearer(ingest)).status_code == 403  # roles as before
    assert lookups == [ingest]
    too_large = client.post("/v1/ingest/logs", content=b"x" * (1024 * 1024 + 1), headers=json_type)
    assert too_large.status_code == 413  # the body limit still comes first


def test_a_v1_route_without_a_permission_gives_a_valid_key_nothing(harness: Harness) -> None:
    """The key checked before the body (api/main.py AuthFirst) is no caller to such a route."""
    from fastapi import Depends

    from api.deps import current_tenant

    app = create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)

    @app.get("/v1/unguarded")
    async def unguarded(tenant: Any = Depends(current_tenant)) -> dict[str, str]:  # noqa: B008 (FastAPI's way)
        return {"tenant": tenant.id}

    key = harness.api_key(harness.tenant("acme"), "admin")
    with TestClient(app) as client:
        assert client.get("/v1/unguarded", headers=bearer(key)).status_code == 401
