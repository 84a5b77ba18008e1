"""What one tenant may hold in API keys: at most `[api_keys] max_active_per_tenant` unrevoked
(one more is a 409 until one is revoked; rotating keeps the count), and `GET /v1/keys` answers
a page at a time (rotations keep the revoked keys, so the list grows). Two creates racing for
the last place cannot both get it: each counts the keys under the tenant's lock.

Tenants are named afresh in each test: tests/integration/test_key_limits_pg.py runs these on
PostgreSQL and Redis, where the database outlives a test."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from kortex import keys
from kortex.errors import Conflict
from kortex.storage import tenants
from kortex.storage.schema import api_keys, decisions
from tests.api.conftest import bearer
from tests.conftest import Harness


@contextmanager
def served(h: Harness) -> Iterator[TestClient]:
    with TestClient(create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        yield client


def new_tenant(h: Harness) -> tuple[str, str]:
    """A fresh tenant and its admin key (one active key)."""
    tenant = h.tenant(f"keys-{uuid.uuid4().hex[:8]}")
    return tenant, h.api_key(tenant)


def created(h: Harness, tenant: str) -> int:
    with h.k.db.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(decisions).where(
            decisions.c.tenant_id == tenant, decisions.c.kind == "key_created")) or 0)


def test_a_tenant_holds_at_most_its_cap_of_active_keys(harness_factory: Callable[..., Harness]) -> None:
    h = harness_factory(api_keys={"max_active_per_tenant": 3})
    tenant, admin = new_tenant(h)
    with served(h) as client:
        made = [client.post("/v1/keys", json={"name": f"k{n}"}, headers=bearer(admin)) for n in range(2)]
        assert [m.status_code for m in made] == [201, 201]
        refused = client.post("/v1/keys", json={"name": "one too many"}, headers=bearer(admin))
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_keys" and "Retry-After" not in refused.headers
        assert error["details"] == {"limit": "max_active_per_tenant", "active": 3, "cap": 3}
        assert "3 active API keys" in error["message"] and "revoke one" in error["message"], error
        listed = client.get("/v1/keys", headers=bearer(admin)).json()["keys"]
        assert "one too many" not in [k["name"] for k in listed] and len(listed) == 3
        assert created(h, tenant) == 2  # and no audit row for the refused one
        # The command line issues keys through the same door.
        with pytest.raises(Conflict, match="3 active API keys"):
            keys.create_key(h.k, tenant, name="from the cli", by="cli")
        # Rotating at the cap replaces a key: the count stays.
        rotated = client.post(f"/v1/keys/{made[0].json()['key_id']}/rotate", headers=bearer(admin))
        assert rotated.status_code == 201, rotated.text
        assert client.post("/v1/keys", json={}, headers=bearer(admin)).status_code == 409
        # A revoked key frees its place.
        assert client.delete(f"/v1/keys/{made[1].json()['key_id']}", headers=bearer(admin)).status_code == 200
        assert client.post("/v1/keys", json={"name": "now"}, headers=bearer(admin)).status_code == 201
        assert client.post("/v1/keys", json={"name": "not now"}, headers=bearer(admin)).status_code == 409


def test_the_default_cap_is_a_hundred_active_keys(harness: Harness) -> None:
    """The audit's case: 120 of 120 POST /v1/keys succeeded."""
    _, admin = new_tenant(harness)
    with served(harness) as client:
        made = [client.post("/v1/keys", json={"name": f"k{n}"}, headers=bearer(admin)).status_code
                for n in range(120)]
    assert made == [201] * 99 + [409] * 21  # with the admin key, 100


def test_the_key_list_is_read_page_by_page_oldest_first(harness: Harness) -> None:
    tenant, admin = new_tenant(harness)
    with served(harness) as client:
        ids = [admin.split("_")[1]]
        for n in range(4):
            made = client.post("/v1/keys", json={"name": f"k{n}"}, headers=bearer(admin)).json()
            ids.append(made["key_id"])
        # A rotation keeps the revoked key listed, and its new key comes last.
        ids.append(client.post(f"/v1/keys/{ids[1]}/rotate", headers=bearer(admin)).json()["key_id"])
        seen: list[str] = []
        after: str | None = None
        while True:
            page = client.get("/v1/keys", params={"limit": 2, **({"after": after} if after else {})},
                              headers=bearer(admin))
            assert page.status_code == 200, page.text
            body = page.json()
            assert len(body["keys"]) <= 2
            seen += [k["key_id"] for k in body["keys"]]
            after = body["next_after"]
            if after is None:
                break
            assert after == seen[-1]
        assert seen == ids
        whole = client.get("/v1/keys", headers=bearer(admin)).json()
        assert [k["key_id"] for k in whole["keys"]] == ids and whole["next_after"] is None
        assert client.get("/v1/keys", params={"limit": 500}, headers=bearer(admin)).status_code == 200
        other_tenant, other_admin = new_tenant(harness)
        for refused in ({"limit": 0}, {"limit": 501}, {"after": "nothex"}, {"after": other_admin.split("_")[1]}):
            response = client.get("/v1/keys", params=refused, headers=bearer(admin))
            assert response.status_code == 422, (refused, response.text)
            assert response.json()["error"]["details"][0]["field"] == next(iter(refused))
    with harness.k.db.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(api_keys).where(api_keys.c.tenant_id == tenant)) == 6


def test_two_creates_racing_for_the_last_place_do_not_both_get_it(harness_factory: Callable[..., Harness],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness_factory(api_keys={"max_active_per_tenant": 3})
    tenant = h.tenant(f"keys-race-{uuid.uuid4().hex[:8]}")
    h.api_key(tenant)
    keys.create_key(h.k, tenant, name="second", by="test")
    both_counted = threading.Barrier(2, timeout=1)
    real = tenants.active_key_count

    def slow_count(conn: Any, tenant_id: str) -> int:
        counted = real(conn, tenant_id)
        try:  # hold the count open until the other create has counted too, if it can
            both_counted.wait()
        except threading.BrokenBarrierError:
            pass
        return counted

    monkeypatch.setattr(tenants, "active_key_count", slow_count)
    outcomes: list[object] = []

    def create(name: str) -> None:
        try:
            outcomes.append(keys.create_key(h.k, tenant, name=name, by="test")[0].name)
        except Conflict as exc:
            outcomes.append(exc.code)

    racers = [threading.Thread(target=create, args=(name,)) for name in ("left", "right")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(30)
    assert len(outcomes) == 2 and "too_many_keys" in outcomes, outcomes
    with h.k.db.connect() as conn:
        assert real(conn, tenant) == 3
