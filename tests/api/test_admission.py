"""Bad input is the caller's 4xx, never an outage, and costs no quota; quotas on session
creation and ingest answer 429 with Retry-After."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from tests.api.conftest import bearer
from tests.conftest import Harness


def _client(h: Harness) -> TestClient:
    return TestClient(create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False))


@pytest.fixture
def tight(harness_factory: Any) -> Iterator[tuple[TestClient, Harness]]:
    h = harness_factory(llm={"budget": {"turns_per_minute": 2, "sessions_per_minute": 3,
                                        "ingest_requests_per_minute": 2, "ingest_items_per_minute": 3}})
    with _client(h) as client:
        yield client, h


def _log(message: str) -> dict[str, Any]:
    from kortex.timeparse import utcnow

    return {"ts": utcnow().isoformat(), "product": "checkout", "level": "info", "message": message}


def assert_422(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert any(d.get("field") == field for d in error["details"]), error


def check_nul_and_range(client: TestClient, key: str) -> None:
    """Shared with the PostgreSQL run (tests/integration/test_admission.py)."""
    h = bearer(key)
    assert_422(client.post("/v1/sessions", json={"name": "a\x00b"}, headers=h), "name")
    sid = client.post("/v1/sessions", json={"name": "ok"}, headers=h).json()["id"]
    assert_422(client.post(f"/v1/sessions/{sid}/messages", json={"content": "why\x00"}, headers=h), "content")
    bad = client.post("/v1/ingest/logs", json={"items": [_log("fine"), _log("nul \x00 here")]}, headers=h)
    assert_422(bad, "message")
    assert bad.json()["error"]["details"][0]["index"] == 1
    assert_422(client.post("/v1/ingest/logs", json={"items": [{**_log("x"), "attrs\x00": 1}]}, headers=h),
               "attrs\x00")
    for after in ("99999999999.0.0", "1.99999999999999999999.0", "1.0.-3000000000"):
        assert_422(client.get(f"/v1/sessions/{sid}/messages", params={"after": after}, headers=h), "after")
    turn = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hello"}, headers=h).json()
    events = client.get(turn["events_url"], headers={**h, "Last-Event-ID": "18446744073709551615-18446744073709551615"})
    assert_422(events, "Last-Event-ID")


def check_more_bad_input(client: TestClient, h: Harness, tenant: str) -> None:
    """More of the same, shared with the PostgreSQL run: each of these was a 503 there (the NUL
    reached the database) or, with a trailing newline that ``$`` lets through, a 404."""
    from kortex.proposals import NewProposal

    key = h.api_key(tenant)
    pid = h.k.proposals.propose(tenant, NewProposal(action="restart", product="checkout", params={},
                                                    rationale="r", blast_radius="one host", reversible=True),
                                session_id=None, turn_id=str(uuid.uuid4()), call_id="c").id
    for verb in ("confirm", "reject"):
        assert_422(client.post(f"/v1/proposals/{pid}/{verb}", json={"note": "a\x00b"}, headers=bearer(key)), "note")
    assert client.get(f"/v1/proposals/{pid}", headers=bearer(key)).json()["status"] == "pending"
    job = client.post("/v1/postmortems", json={"filter": {"since": "1d", "product": "a\x00b"}}, headers=bearer(key))
    assert_422(job, "filter.product")
    assert_422(client.post("/v1/postmortems", json={"incident_ids": ["INC-1\n"]}, headers=bearer(key)), "incident_ids")
    assert_422(client.post("/v1/postmortems", json={"incident_ids": ["INC-1"], "model": "a\x00"}, headers=bearer(key)),
               "model")
    unknown = client.post("/v1/postmortems", json={"incident_ids": ["INC-1"], "model": "zz:zz"}, headers=bearer(key))
    assert_422(unknown, "model")
    sid = client.post("/v1/sessions", json={}, headers=bearer(key)).json()["id"]
    assert_422(client.post(f"/v1/sessions/{sid}/messages", json={"content": "  "}, headers=bearer(key)), "content")
    for key_id in ("a%00b", "%00", "0123456789ab%0A"):
        assert client.post(f"/v1/keys/{key_id}/rotate", headers=bearer(key)).status_code == 404


def test_nul_bytes_and_out_of_range_positions_are_422_naming_the_field(client: TestClient, harness: Harness) -> None:
    check_nul_and_range(client, harness.api_key(harness.tenant("acme")))
    check_more_bad_input(client, harness, harness.tenant("acme"))


def test_a_nul_in_a_post_mortem_jobs_idempotency_key_is_refused_naming_it(harness: Harness) -> None:
    # A header cannot carry NUL over HTTP/1.1 (uvicorn refuses it with 400), but another server
    # or a caller in process could pass it on.
    from kortex.errors import InvalidInput
    from kortex.postmortems import jobs

    with pytest.raises(InvalidInput) as refused:
        jobs.submit(harness.k, harness.tenant("acme"), jobs.JobRequest(incident_ids=["INC-1"]),
                    idempotency_key="a\x00b")
    assert refused.value.details == [{"field": "Idempotency-Key", "message": "contains a NUL character"}]


def test_refused_requests_do_not_use_up_the_turn_rate(tight: tuple[TestClient, Harness]) -> None:
    client, h = tight
    tenant = h.tenant("acme")
    key = h.api_key(tenant)
    sessions = [client.post("/v1/sessions", json={}, headers=bearer(key)).json()["id"] for _ in range(3)]
    for _ in range(5):  # all refused before they could start a turn
        assert client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": "\x00"},
                           headers=bearer(key)).status_code == 422
        assert client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": "hi"},
                           headers=bearer("kx_000000000000_" + "A" * 40)).status_code == 401
        assert client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": ""},
                           headers=bearer(key)).status_code == 422
    first = client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": "one"}, headers=bearer(key))
    assert first.status_code == 202
    busy = client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": "two"}, headers=bearer(key))
    assert busy.status_code == 409  # a turn in progress: refused, so not counted either
    assert client.post(f"/v1/sessions/{sessions[1]}/messages", json={"content": "two"},
                       headers=bearer(key)).status_code == 202
    third = client.post(f"/v1/sessions/{sessions[2]}/messages", json={"content": "three"}, headers=bearer(key))
    assert third.status_code == 429 and third.json()["error"]["details"] == {"limit": "turns_per_minute"}
    assert 1 <= int(third.headers["Retry-After"]) <= 60


def test_session_creation_has_a_per_tenant_quota(tight: tuple[TestClient, Harness]) -> None:
    client, h = tight
    key = h.api_key(h.tenant("acme"))
    other = h.api_key(h.tenant("other"))
    assert client.post("/v1/sessions", json={"name": "\x00"}, headers=bearer(key)).status_code == 422
    assert [client.post("/v1/sessions", json={}, headers=bearer(key)).status_code for _ in range(3)] == [201] * 3
    refused = client.post("/v1/sessions", json={}, headers=bearer(key))
    assert refused.status_code == 429 and refused.json()["error"]["details"] == {"limit": "sessions"}
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert client.post("/v1/sessions", json={}, headers=bearer(other)).status_code == 201  # per tenant


def test_ingest_has_per_tenant_quotas_in_requests_and_items(tight: tuple[TestClient, Harness]) -> None:
    client, h = tight
    key = h.api_key(h.tenant("acme"), role="ingest")
    assert client.post("/v1/ingest/logs", json={"items": [_log("\x00")]}, headers=bearer(key)).status_code == 422
    too_many = client.post("/v1/ingest/logs", json={"items": [_log(str(n)) for n in range(4)]}, headers=bearer(key))
    assert too_many.status_code == 429 and too_many.json()["error"]["details"] == {"limit": "ingest_items"}
    assert int(too_many.headers["Retry-After"]) >= 1
    ok = client.post("/v1/ingest/logs", json={"items": [_log("a"), _log("b")]}, headers=bearer(key))
    assert ok.status_code == 200 and ok.json()["accepted"] == 2
    assert client.post("/v1/ingest/logs", json={"items": [_log("c")]}, headers=bearer(key)).status_code == 200
    third = client.post("/v1/ingest/logs", json={"items": [_log("d")]}, headers=bearer(key))
    assert third.status_code == 429 and third.json()["error"]["details"] == {"limit": "ingest_requests"}


def test_a_spent_day_says_to_retry_at_midnight_utc(harness_factory: Any) -> None:
    from datetime import UTC, datetime, timedelta

    from kortex.storage.schema import tenant_spend
    from kortex.timeparse import utcnow

    h = harness_factory(llm={"budget": {"daily_usd_limit": 1000}})
    tenant = h.tenant("acme")
    with h.k.db.begin() as conn:  # $1200 of a $1000 day billed
        conn.execute(tenant_spend.insert().values(tenant_id=tenant, day=utcnow().date(), cost_usd=1200.0))
    with _client(h) as client:
        key = h.api_key(tenant)
        session = client.post("/v1/sessions", json={}, headers=bearer(key)).json()["id"]
        refused = client.post(f"/v1/sessions/{session}/messages", json={"content": "more"}, headers=bearer(key))
    assert refused.status_code == 429 and refused.json()["error"]["details"] == {"limit": "daily_usd"}
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert abs(int(refused.headers["Retry-After"]) - (midnight - now).total_seconds()) < 5


def test_a_session_past_its_token_cap_gets_no_retry_after(harness_factory: Any) -> None:
    from kortex.storage.schema import turns
    from kortex.turns import chat

    h = harness_factory(llm={"budget": {"per_session_token_cap": 100_000}})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:text_only")
    turn = h.ask(tenant, "go", session_id=session.id)
    with h.k.db.begin() as conn:  # the session has spent its tokens (a long conversation, say)
        conn.execute(turns.update().where(turns.c.id == turn.id).values(input_tokens=100_001))
    with _client(h) as client:
        refused = client.post(f"/v1/sessions/{session.id}/messages", json={"content": "more"},
                              headers=bearer(h.api_key(tenant)))
    assert refused.status_code == 429 and refused.json()["error"]["details"] == {"limit": "session_tokens"}
    assert "start a new session" in refused.json()["error"]["message"]
    assert "Retry-After" not in refused.headers  # waiting never helps: nothing to retry after
