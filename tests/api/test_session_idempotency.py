"""`POST /v1/sessions` with an Idempotency-Key: a retry whose answer was lost learns the session
it made (201, `Idempotent-Replayed: true`) instead of making a second one; the key used for
another body is a 409; keys are the tenant's own; without the header nothing changes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.errors import InvalidInput
from kortex.storage import chats
from kortex.turns import chat
from tests.api.conftest import bearer
from tests.conftest import Harness


def _sessions(client: TestClient, auth: dict[str, str]) -> list[str]:
    return [s["id"] for s in client.get("/v1/sessions", headers=auth).json()["sessions"]]


def _made(client: TestClient, auth: dict[str, str], key: str, body: dict[str, Any] | None = None) -> Any:
    return client.post("/v1/sessions", json=body if body is not None else {"name": "inc-42"},
                       headers={**auth, "Idempotency-Key": key})


def test_a_retry_with_the_key_answers_the_session_it_made(client: TestClient, harness: Harness) -> None:
    auth = bearer(harness.api_key(harness.tenant("acme")))
    first = _made(client, auth, "make-1", {"name": "inc-42", "model": "offline:analyst"})
    again = _made(client, auth, "make-1", {"name": "inc-42", "model": "offline:analyst"})
    assert first.status_code == again.status_code == 201, again.text
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"] == f"/v1/sessions/{first.json()['id']}"
    assert _sessions(client, auth) == [first.json()["id"]]


def test_the_key_used_for_another_body_is_a_409_and_makes_nothing(client: TestClient, harness: Harness) -> None:
    auth = bearer(harness.api_key(harness.tenant("acme")))
    first = _made(client, auth, "make-1", {"name": "inc-42"})
    for other in ({"name": "inc-43"}, {"name": "inc-42", "model": "offline:analyst"}, {}):
        clash = _made(client, auth, "make-1", other)
        assert clash.status_code == 409, clash.text
        assert clash.json()["error"]["code"] == "idempotency_mismatch"
    assert _sessions(client, auth) == [first.json()["id"]]


def test_keys_are_each_tenants_own(client: TestClient, harness: Harness) -> None:
    a, b = bearer(harness.api_key(harness.tenant("a"))), bearer(harness.api_key(harness.tenant("b")))
    theirs = _made(client, a, "shared-key")
    mine = _made(client, b, "shared-key")
    assert mine.status_code == 201 and "idempotent-replayed" not in mine.headers
    assert mine.json()["id"] != theirs.json()["id"]
    # B's key is B's: another body under it is a mismatch with B's own first use, not A's.
    assert _made(client, b, "shared-key", {"name": "else"}).json()["error"]["code"] == "idempotency_mismatch"
    assert _sessions(client, a) == [theirs.json()["id"]] and _sessions(client, b) == [mine.json()["id"]]


def test_without_the_header_every_post_makes_a_session(client: TestClient, harness: Harness) -> None:
    auth = bearer(harness.api_key(harness.tenant("acme")))
    made = [client.post("/v1/sessions", json={"name": "same"}, headers=auth) for _ in range(2)]
    assert [m.status_code for m in made] == [201, 201]
    assert all("idempotent-replayed" not in m.headers for m in made)
    assert len({m.json()["id"] for m in made}) == 2


def test_a_deleted_sessions_key_makes_a_new_session(client: TestClient, harness: Harness) -> None:
    auth = bearer(harness.api_key(harness.tenant("acme")))
    first = _made(client, auth, "make-1").json()["id"]
    assert client.delete(f"/v1/sessions/{first}", headers=auth).status_code == 204
    again = _made(client, auth, "make-1")
    assert again.status_code == 201 and "idempotent-replayed" not in again.headers
    assert again.json()["id"] != first and _sessions(client, auth) == [again.json()["id"]]


@pytest.mark.parametrize(("value", "message"), [("", "must be 1-200 characters"), ("k" * 201, None)])
def test_a_bad_key_is_the_one_422_shape_messages_give(client: TestClient, harness: Harness, value: str,
                                                      message: str | None) -> None:
    # Empty is refused by the domain, too long by the request's validation: one shape either way.
    auth = bearer(harness.api_key(harness.tenant("acme")))
    sid = client.post("/v1/sessions", json={}, headers=auth).json()["id"]
    for url, body in (("/v1/sessions", {}), (f"/v1/sessions/{sid}/messages", {"content": "hi"})):
        refused = client.post(url, json=body, headers={**auth, "Idempotency-Key": value})
        assert refused.status_code == 422, (url, refused.text)
        error = refused.json()["error"]
        assert error["code"] == "validation" and [d["field"] for d in error["details"]] == ["Idempotency-Key"]
        assert message is None or error["details"][0]["message"] == message, error
    assert _sessions(client, auth) == [sid]


def test_the_loser_of_a_race_answers_the_winners_session(client: TestClient, harness: Harness,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """It read no session under the key (the winner had not committed): the unique index
    refuses its insert, and it answers the winner's session as a replay.
    (tests/integration/test_sessions_pg.py races them on PostgreSQL.)"""
    auth = bearer(harness.api_key(harness.tenant("acme")))
    won = _made(client, auth, "race")
    real, missed = chats.session_by_key, []

    def not_yet(*args: Any) -> Any:
        if not missed:
            missed.append(args)
            return None
        return real(*args)

    monkeypatch.setattr(chats, "session_by_key", not_yet)
    lost = _made(client, auth, "race")
    assert missed and lost.status_code == 201 and lost.headers["idempotent-replayed"] == "true", lost.text
    assert lost.json()["id"] == won.json()["id"] and _sessions(client, auth) == [won.json()["id"]]


def test_a_nul_in_the_key_is_refused_naming_it(harness: Harness) -> None:
    # An HTTP client cannot send one; the domain refuses it before the database sees it.
    tenant = harness.tenant("acme")
    with pytest.raises(InvalidInput) as refused:
        chat.new_session(harness.k, tenant, "inc-42", idempotency_key="a\x00b")
    assert refused.value.details == [{"field": "Idempotency-Key", "message": "contains a NUL character"}]
    assert chat.list_sessions(harness.k, tenant).sessions == []


@pytest.fixture
def tight(harness_factory: Any) -> Iterator[tuple[TestClient, Harness]]:
    h = harness_factory(llm={"budget": {"sessions_per_minute": 2}})
    with TestClient(create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        yield client, h


def test_a_replay_costs_no_session_quota(tight: tuple[TestClient, Harness]) -> None:
    client, h = tight
    auth = bearer(h.api_key(h.tenant("acme")))
    first = _made(client, auth, "make-1")
    for _ in range(3):  # more replays than the minute's quota has room for
        assert _made(client, auth, "make-1").headers["idempotent-replayed"] == "true"
    assert _made(client, auth, "make-1", {"name": "else"}).status_code == 409  # a mismatch costs none either
    assert client.post("/v1/sessions", json={}, headers=auth).status_code == 201  # the second of two
    refused = client.post("/v1/sessions", json={}, headers=auth)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    # Past the quota, a retry of a session made still learns it: it makes nothing.
    assert _made(client, auth, "make-1").json()["id"] == first.json()["id"]
    assert _made(client, auth, "make-2").status_code == 429  # a new key makes a new one: counted


def test_the_openapi_description_names_the_header(client: TestClient) -> None:
    route = client.get("/openapi.json").json()["paths"]["/v1/sessions"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in route["parameters"])
    assert "Idempotency-Key" in route["description"] and "Idempotent-Replayed" in route["description"]
    assert "idempotency_mismatch" in route["responses"]["409"]["description"]
