"""Input a careless or hostile client sends: JSON bodies whose strings are not valid Unicode (a
lone surrogate, as an escape or as raw bytes), bodies that are not UTF-8 or nest too deeply,
malformed JSON, a NUL in a key's name, a control character in any name, a message position that
is not one. Each is a 422 naming
the field (``body`` when no field is to blame), on SQLite and on PostgreSQL, never a 500 or a
400 of another shape, and refusing it changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.proposals import NewProposal
from kortex.testing.scratch import throwaway_database, throwaway_prefix
from tests.api.conftest import bearer
from tests.conftest import Harness, make_settings

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def pg_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with ExitStack() as stack:
        try:
            url, _ = stack.enter_context(throwaway_database(PG_ADMIN, prefix="audit", migrated=True))
        except psycopg.OperationalError as exc:
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {exc}")
        prefix = stack.enter_context(throwaway_prefix(REDIS_URL, "kxaudit"))
        h = Harness(make_settings(tmp_path_factory.mktemp("audit-pg"), url, redis_url=REDIS_URL, redis_prefix=prefix))
        stack.callback(h.close)
        yield h


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def env(request: pytest.FixtureRequest, harness_factory: Any) -> Iterator[tuple[TestClient, Harness]]:
    h: Harness = request.getfixturevalue("pg_harness") if request.param == "postgresql" else harness_factory()
    app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, h


def _post(client: TestClient, url: str, body: bytes, key: str) -> Any:
    return client.post(url, content=body, headers={**JSON, **bearer(key)})


def _assert_422(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation", error
    assert [d["field"] for d in error["details"]] == [field], error


def _proposal(h: Harness, tenant: str) -> str:
    return h.k.proposals.propose(tenant, NewProposal(action="restart", product="checkout", params={}, rationale="r",
                                                     blast_radius="one host", reversible=True),
                                 session_id=None, turn_id=str(uuid.uuid4()), call_id="c").id


# A lone surrogate written as a JSON escape, and as the raw bytes of one (which Python's JSON
# decoder turns into the same string); a valid pair is a character like any other.
LONE = [b"\\ud800", b"x\\uDC00y", b"\xed\xa0\x80"]


@pytest.mark.parametrize("lone", LONE)
def test_a_lone_surrogate_in_any_string_of_a_body_is_a_422_naming_the_field(
        env: tuple[TestClient, Harness], lone: bytes) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    pid = _proposal(h, tenant)
    # Each of these reached the database (or the response's serialiser) and failed there: a 500.
    for verb in ("confirm", "reject"):
        _assert_422(_post(client, f"/v1/proposals/{pid}/{verb}", b'{"note": "' + lone + b'"}', key), "note")
    assert client.get(f"/v1/proposals/{pid}", headers=bearer(key)).json()["status"] == "pending"
    _assert_422(_post(client, "/v1/postmortems", b'{"filter": {"since": "1d", "product": "' + lone + b'"}}', key),
                "filter.product")
    # Fields pydantic already refused are refused the same way, and so is a key or a list item.
    _assert_422(_post(client, "/v1/sessions", b'{"name": "' + lone + b'"}', key), "name")
    _assert_422(_post(client, "/v1/ingest/logs", b'{"items": [{"message": "ok"}, {"message": "' + lone + b'"}]}', key),
                "items.1.message")
    refused = _post(client, "/v1/ingest/logs", b'{"items": [{"attrs": {"' + lone + b'": 1}}]}', key)
    _assert_422(refused, "items.0.attrs.\ufffd" if lone != b"x\\uDC00y" else "items.0.attrs.x\ufffdy")


def test_a_valid_surrogate_pair_is_an_ordinary_character(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    key = h.api_key(h.tenant(f"t-{uuid.uuid4().hex[:8]}"))
    made = _post(client, "/v1/sessions", b'{"name": "ok \\ud83d\\ude00"}', key)
    assert made.status_code == 201 and made.json()["name"] == "ok \U0001f600"


def test_a_body_that_is_not_utf8_or_nests_too_deeply_is_a_422_naming_the_body(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    key = h.api_key(h.tenant(f"t-{uuid.uuid4().hex[:8]}"))
    # Both were a 400 "There was an error parsing the body" (code http_error), naming nothing.
    for body in (b'{"name": "caf\xe9"}', b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        response = _post(client, "/v1/sessions", body, key)
        _assert_422(response, "body")
        assert "Traceback" not in response.text
    # Malformed JSON named the character offset of the error as if it were a field ("9").
    broken = _post(client, "/v1/sessions", b'{"name": ', key)
    _assert_422(broken, "body")
    assert "position 9" in broken.json()["error"]["details"][0]["message"]


def test_a_stranger_is_still_told_only_to_authenticate(env: tuple[TestClient, Harness]) -> None:
    client, _ = env
    for body in (b'{"note": "\\ud800"}', b'{"name": "caf\xe9"}'):
        refused = client.post("/v1/sessions", content=body, headers=JSON)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"


def test_a_nul_in_a_new_keys_name_is_a_422_naming_the_field(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    before = client.get("/v1/keys", headers=bearer(key)).json()["keys"]
    # Was refused by the domain with no details: the one 422 of the API that named no field.
    _assert_422(client.post("/v1/keys", json={"name": "ci\x00bot"}, headers=bearer(key)), "name")
    assert client.get("/v1/keys", headers=bearer(key)).json()["keys"] == before


def test_a_message_position_is_three_plain_integers(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    turn = h.ask(tenant, "why is checkout slow?")
    url = f"/v1/sessions/{turn.session_id}/messages"
    first = client.get(url, params={"limit": 1}, headers=bearer(key)).json()
    after = first["next_after"]
    assert after == "1.-1.0"  # the user's message: the step before the first
    assert client.get(url, params={"after": after}, headers=bearer(key)).status_code == 200
    # int() reads each of these as a number, so each paged from a position the client never
    # saw ("1_0" is ten, "١" Arabic-Indic one): garbage, like any other cursor not a page's own.
    for garbage in ("1_0.0.0", "\u0661.0.0", "+1.0.0", " 1.0.0", "1 .0.0", "1.0.0\n", "1.0.\uff10"):
        _assert_422(client.get(url, params={"after": garbage}, headers=bearer(key)), "after")


# A name is one line shown in terminals, logs and UIs: an escape sequence in it (ESC [31m, the
# C1 CSI \x9b) recolours or rewrites what is around it, a line break forges a log line, BEL rings.
CONTROLS = ["\x1b[31mred", "a\nb", "a\rb", "tab\there", "\x07", "\x9b2J", "del\x7f", "nel\x85"]


def _sessions(client: TestClient, key: str) -> list[Any]:
    return [(s["id"], s["name"]) for s in client.get("/v1/sessions", headers=bearer(key)).json()["sessions"]]


@pytest.mark.parametrize("name", CONTROLS)
def test_a_control_character_in_a_name_is_a_422_naming_the_field(env: tuple[TestClient, Harness], name: str) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    turn = h.ask(tenant, "why is checkout slow?")
    checkpoint = client.get(f"/v1/turns/{turn.id}/checkpoints", headers=bearer(key)).json()[0]["id"]
    sessions, keys = _sessions(client, key), client.get("/v1/keys", headers=bearer(key)).json()["keys"]
    _assert_422(client.post("/v1/sessions", json={"name": name}, headers=bearer(key)), "name")
    _assert_422(client.post(f"/v1/sessions/{turn.session_id}/fork", json={"checkpoint_id": checkpoint, "name": name},
                            headers=bearer(key)), "name")
    _assert_422(client.post("/v1/keys", json={"name": name}, headers=bearer(key)), "name")
    assert _sessions(client, key) == sessions  # nothing stored
    assert client.get("/v1/keys", headers=bearer(key)).json()["keys"] == keys


def test_a_name_may_hold_any_printable_character_and_a_message_any_line(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    fancy = "caf\u00e9 \u2615 \u4e2d \u00a0nbsp"
    made = client.post("/v1/sessions", json={"name": fancy}, headers=bearer(key))
    assert made.status_code == 201 and made.json()["name"] == fancy
    assert client.post("/v1/keys", json={"name": fancy}, headers=bearer(key)).json()["name"] == fancy
    # A message is not a name: its lines and tabs are the question.
    posted = client.post(f"/v1/sessions/{made.json()['id']}/messages", json={"content": "why\n\tslow?\r\n"},
                         headers=bearer(key))
    assert posted.status_code == 202, posted.text


def test_a_blank_key_name_is_refused_and_no_name_is_the_default(env: tuple[TestClient, Harness]) -> None:
    client, h = env
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    key = h.api_key(tenant)
    before = client.get("/v1/keys", headers=bearer(key)).json()["keys"]
    # Was stored as "default": a name the caller did not give, for one it did.
    _assert_422(client.post("/v1/keys", json={"name": "   "}, headers=bearer(key)), "name")
    assert client.get("/v1/keys", headers=bearer(key)).json()["keys"] == before
    assert client.post("/v1/keys", json={}, headers=bearer(key)).json()["name"] == "default"
    assert client.post("/v1/keys", json={"name": "  ci bot "}, headers=bearer(key)).json()["name"] == "ci bot"
