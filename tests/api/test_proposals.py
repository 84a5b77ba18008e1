"""/v1/proposals over HTTP: list, read, confirm, reject; 404 across tenants, 409, 410."""

from __future__ import annotations

import uuid
from datetime import timedelta

from fastapi.testclient import TestClient

from kortex.proposals import NewProposal
from kortex.timeparse import utcnow
from tests.api.conftest import bearer
from tests.conftest import Harness

NEW = NewProposal(action="restart", product="checkout", params={"host": "checkout-7d9f-1"},
                  rationale="the host leaks connections", blast_radius="one host", reversible=True)


def _propose(h: Harness, tenant: str, minutes_ago: float = 0) -> str:
    return h.k.proposals.propose(tenant, NEW, session_id=None, turn_id=str(uuid.uuid4()), call_id="c",
                                 now=utcnow() - timedelta(minutes=minutes_ago)).id


def test_confirm_twice_is_idempotent_and_the_opposite_decision_conflicts(client: TestClient,
                                                                         harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    pid = _propose(harness, tenant)
    listed = client.get("/v1/proposals?status=pending", headers=bearer(key)).json()["proposals"]
    assert [p["id"] for p in listed] == [pid] and listed[0]["status"] == "pending"
    first = client.post(f"/v1/proposals/{pid}/confirm", json={"note": "approved in #ops"}, headers=bearer(key))
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    body = first.json()
    assert body["status"] == "confirmed" and body["note"] == "approved in #ops"
    assert body["decided_by"] == f"api_key:{key.split('_')[1]}" and key.split("_")[2] not in str(body)
    assert body["execution_status"] == "recorded"
    again = client.post(f"/v1/proposals/{pid}/confirm", headers=bearer(key))
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["decided_at"] == body["decided_at"]
    opposite = client.post(f"/v1/proposals/{pid}/reject", headers=bearer(key))
    assert opposite.status_code == 409 and opposite.json()["error"]["code"] == "proposal_decided"
    assert client.get(f"/v1/proposals/{pid}", headers=bearer(key)).json()["status"] == "confirmed"
    assert client.get("/v1/proposals?status=pending", headers=bearer(key)).json()["proposals"] == []


def test_reject_then_confirm_conflicts(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    pid = _propose(harness, tenant)
    rejected = client.post(f"/v1/proposals/{pid}/reject", json={"note": "too risky"}, headers=bearer(key))
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    assert rejected.json()["execution_status"] is None
    assert client.post(f"/v1/proposals/{pid}/confirm", headers=bearer(key)).status_code == 409


def test_an_expired_proposal_is_gone(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    key = harness.api_key(tenant)
    pid = _propose(harness, tenant, minutes_ago=10.5)
    late = client.post(f"/v1/proposals/{pid}/confirm", headers=bearer(key))
    assert late.status_code == 410 and late.json()["error"]["code"] == "proposal_expired"
    assert "propose again" in late.json()["error"]["message"]
    assert client.post(f"/v1/proposals/{pid}/reject", headers=bearer(key)).status_code == 410
    assert client.get(f"/v1/proposals/{pid}", headers=bearer(key)).json()["status"] == "expired"
    expired = client.get("/v1/proposals?status=expired", headers=bearer(key)).json()["proposals"]
    assert [p["id"] for p in expired] == [pid]


def test_another_tenants_proposal_is_not_found(client: TestClient, harness: Harness) -> None:
    tenant = harness.tenant("acme")
    pid = _propose(harness, tenant)
    intruder = harness.api_key(harness.tenant("intruder"))
    for response in (client.get(f"/v1/proposals/{pid}", headers=bearer(intruder)),
                     client.post(f"/v1/proposals/{pid}/confirm", headers=bearer(intruder)),
                     client.post(f"/v1/proposals/{pid}/reject", headers=bearer(intruder))):
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert client.get("/v1/proposals", headers=bearer(intruder)).json()["proposals"] == []
    assert harness.k.proposals.get(tenant, pid).status == "pending"
    owner = harness.api_key(tenant)
    assert client.post("/v1/proposals/not-a-uuid/confirm", headers=bearer(owner)).status_code == 404
    assert client.post(f"/v1/proposals/{pid}/confirm", json={"note": "x" * 1001},
                       headers=bearer(owner)).status_code == 422
    assert client.post(f"/v1/proposals/{pid}/confirm", headers={"Authorization": "Bearer nope"}).status_code == 401
