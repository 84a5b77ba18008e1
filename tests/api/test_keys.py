"""Managing API keys over HTTP: only keys that may manage keys do; secrets are shown once; a
revoked key stops working at once; a tenant keeps an admin key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from kortex.storage.schema import decisions
from tests.conftest import Harness


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(harness.settings, dispatch=lambda handoff: None, embedded_worker=False)) as c:
        yield c


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_an_admin_issues_lists_and_revokes_keys_and_a_revoked_key_fails_at_once(client, harness) -> None:
    tenant = harness.tenant("acme")
    admin = harness.api_key(tenant)
    made = client.post("/v1/keys", json={"name": "ci bot"}, headers=auth(admin))
    assert made.status_code == 201 and made.json()["role"] == "chat" and made.json()["name"] == "ci bot"
    new_key, key_id = made.json()["key"], made.json()["key_id"]
    assert made.headers["location"] == f"/v1/keys/{key_id}" and new_key.split("_")[1] == key_id
    assert client.post("/v1/sessions", json={}, headers=auth(new_key)).status_code == 201  # it works
    listed = client.get("/v1/keys", headers=auth(admin)).json()["keys"]
    assert [(k["key_id"], k["role"], k["revoked_at"]) for k in listed][-1] == (key_id, "chat", None)
    assert all("key" not in k for k in listed) and new_key.split("_")[2] not in str(listed)

    revoked = client.delete(f"/v1/keys/{key_id}", headers=auth(admin))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    refused = client.post("/v1/sessions", json={}, headers=auth(new_key))  # it was in the auth cache
    assert refused.status_code == 401
    assert client.delete(f"/v1/keys/{key_id}", headers=auth(admin)).json() == revoked.json()
    with harness.k.db.connect() as conn:
        kinds = [r.kind for r in conn.execute(select(decisions.c.kind).where(decisions.c.tenant_id == tenant)
                                              .order_by(decisions.c.created_at))]
    assert kinds == ["key_created", "key_revoked"]


def test_only_keys_that_manage_keys_may_and_only_their_own_tenants(client, harness) -> None:
    acme, other = harness.tenant("acme"), harness.tenant("other")
    admin, other_admin = harness.api_key(acme), harness.api_key(other)
    for role in ("chat", "operator", "ingest"):
        key = harness.api_key(acme, role=role)
        assert client.get("/v1/keys", headers=auth(key)).status_code == 403
        assert client.post("/v1/keys", json={"role": "admin"}, headers=auth(key)).status_code == 403
    theirs = client.get("/v1/keys", headers=auth(other_admin)).json()["keys"]
    assert client.delete(f"/v1/keys/{theirs[0]['key_id']}", headers=auth(admin)).status_code == 404
    assert client.post("/v1/keys", json={"role": "root"}, headers=auth(admin)).status_code == 422


def test_the_last_admin_key_cannot_be_revoked(client, harness) -> None:
    tenant = harness.tenant("acme")
    admin = harness.api_key(tenant)
    own = admin.split("_")[1]
    last = client.delete(f"/v1/keys/{own}", headers=auth(admin))
    assert last.status_code == 409 and last.json()["error"]["code"] == "last_admin_key"
    second = client.post("/v1/keys", json={"role": "admin", "name": "rotation"}, headers=auth(admin)).json()
    assert client.delete(f"/v1/keys/{own}", headers=auth(second["key"])).status_code == 200  # rotated
    assert client.get("/v1/keys", headers=auth(admin)).status_code == 401
    assert client.get("/v1/keys", headers=auth(second["key"])).status_code == 200


def test_a_key_is_rotated_in_one_step_even_the_last_admin_key(client, harness) -> None:
    tenant = harness.tenant("acme")
    admin = harness.api_key(tenant)
    own = admin.split("_")[1]
    rotated = client.post(f"/v1/keys/{own}/rotate", headers=auth(admin))
    assert rotated.status_code == 201 and rotated.json()["role"] == "admin" and rotated.json()["key_id"] != own
    assert client.get("/v1/keys", headers=auth(admin)).status_code == 401  # the old one is gone at once
    new = rotated.json()["key"]
    listed = {k["key_id"]: k["revoked_at"] for k in client.get("/v1/keys", headers=auth(new)).json()["keys"]}
    assert listed[own] is not None and listed[rotated.json()["key_id"]] is None
    again = client.post(f"/v1/keys/{own}/rotate", headers=auth(new))
    assert again.status_code == 409 and again.json()["error"]["code"] == "key_revoked"
