"""Sessions on PostgreSQL: paging them (and a session's messages) walks every row once, in
order, and a cursor that is not a page's own is a 422; a fork or a retry refused for its input
leaves no session behind and costs no quota, and one that is made counts like any new session;
racing creations under one Idempotency-Key make one session."""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from api.main import create_app
from kortex import budget
from kortex.errors import Conflict
from kortex.storage import chats
from kortex.storage.schema import chat_sessions, tenants
from kortex.timeparse import utcnow
from kortex.turns import chat, checkpoints
from tests.api.conftest import bearer
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL

pytestmark = pytest.mark.integration

SESSIONS_PER_MINUTE = 4


@pytest.fixture(scope="module")
def h(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    harness = Harness(make_settings(tmp_path_factory.mktemp("pg-sessions"), pg_url, redis_url=REDIS_URL,
                                    redis_prefix=f"kxtest-{uuid.uuid4().hex[:10]}",
                                    llm={"budget": {"sessions_per_minute": SESSIONS_PER_MINUTE}}))
    yield harness
    keys = list(harness.k.redis.scan_iter(match=f"{harness.settings.redis_prefix}:*"))
    if keys:
        harness.k.redis.delete(*keys)
    harness.close()


@pytest.fixture
def api(h: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    # One quota window for the whole test: a minute turning over mid-test would reset the count.
    frozen = utcnow().timestamp()
    monkeypatch.setattr(budget, "time", SimpleNamespace(time=lambda: frozen))
    with TestClient(create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        yield client


def _tenant(h: Harness) -> tuple[str, dict[str, str]]:
    tenant = h.tenant(f"t-{uuid.uuid4().hex[:8]}")
    return tenant, bearer(h.api_key(tenant))


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _sessions(h: Harness, tenant: str) -> list[str]:
    return [s.id for s in chat.list_sessions(h.k, tenant, limit=200).sessions]


def _assert_422(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    assert any(d.get("field") == field for d in response.json()["error"]["details"]), response.text


def test_paging_sessions_walks_every_one_once_newest_first(h: Harness, api: TestClient) -> None:
    tenant, auth = _tenant(h)
    _, other = _tenant(h)
    made = [chat.create_session(h.k, tenant, f"s{n}") for n in range(SESSIONS_PER_MINUTE)]
    with h.k.db.begin() as conn:  # more than a minute's quota: the rest made under it
        made += [chats.create_session(conn, tenant, f"x{n}") for n in range(7)]
        # Sessions made in the same instant: the id orders them, and a page may end between them.
        same = utcnow()
        conn.execute(update(chat_sessions).where(chat_sessions.c.id.in_([s.id for s in made[2:7]]))
                     .values(created_at=same))
    api.post("/v1/sessions", json={"name": "not yours"}, headers=other)
    expected = [s.id for s in sorted(_reread(h, tenant, made), key=lambda s: (s.created_at, s.id), reverse=True)]
    seen: list[str] = []
    before = None
    for _ in range(len(made)):
        page = api.get("/v1/sessions", params={"limit": 3, **({"before": before} if before else {})}, headers=auth)
        assert page.status_code == 200, page.text
        seen += [s["id"] for s in page.json()["sessions"]]
        before = page.json()["next_before"]
        if before is None:
            break
    assert seen == expected and len(set(seen)) == len(made) == 11


def _reread(h: Harness, tenant: str, made: list[Any]) -> list[Any]:
    by_id = {s.id: s for s in chat.list_sessions(h.k, tenant, limit=200).sessions}
    return [by_id[s.id] for s in made]


def test_a_cursor_that_is_not_a_page_s_own_is_422_naming_before(h: Harness, api: TestClient) -> None:
    tenant, auth = _tenant(h)
    _, other = _tenant(h)
    for n in range(2):
        chat.create_session(h.k, tenant, f"s{n}")
    real = api.get("/v1/sessions", params={"limit": 1}, headers=auth).json()["next_before"]
    theirs = api.get("/v1/sessions", params={"limit": 1}, headers=other).json()
    assert theirs["sessions"] == []
    middle = len(real) // 2
    tampered = f"{real[:middle]}{'A' if real[middle] != 'A' else 'B'}{real[middle + 1:]}"
    forged = [_b64(f"0001-01-01T00:00:00+00:00|{uuid.uuid4()}"), _b64("2026-01-01T00:00:00+00:00|not-a-uuid"),
              _b64(f"9999-12-31T23:59:59-14:00|{uuid.uuid4()}"), tampered, "nope"]
    for cursor in forged:
        _assert_422(api.get("/v1/sessions", params={"before": cursor}, headers=auth), "before")
    # Another tenant's cursor, real as it is, pages nothing of this one.
    _assert_422(api.get("/v1/sessions", params={"before": real}, headers=other), "before")


def test_paging_a_session_s_messages_walks_every_one_once_in_order(h: Harness, api: TestClient) -> None:
    tenant, auth = _tenant(h)
    h.seed(tenant)
    first = h.ask(tenant, "Why is checkout slow?")
    h.ask(tenant, "And payments?", session_id=first.session_id)
    everything = [m.id for m in h.messages(tenant, first.session_id)]
    assert len(everything) >= 4
    seen: list[str] = []
    after = None
    for _ in range(len(everything) + 1):
        page = api.get(f"/v1/sessions/{first.session_id}/messages",
                       params={"limit": 1, **({"after": after} if after else {})}, headers=auth)
        assert page.status_code == 200, page.text
        seen += [m["id"] for m in page.json()["messages"]]
        after = page.json()["next_after"]
        if after is None:
            break
    assert seen == everything


def test_refused_forks_and_retries_leave_no_session_and_cost_no_quota(h: Harness, api: TestClient) -> None:
    tenant, auth = _tenant(h)
    h.seed(tenant)
    turn = h.ask(tenant, "Why is checkout slow?")  # its session is the first of the minute's quota
    point = checkpoints.of_turn(h.k, tenant, turn.id)[-1].id
    fork_url, retry_url = f"/v1/sessions/{turn.session_id}/fork", f"/v1/turns/{turn.id}/retry"
    for _ in range(2):  # more refusals than the quota has room for
        _assert_422(api.post(fork_url, json={"checkpoint_id": point, "name": "a\u0000b"}, headers=auth), "name")
        for model in ("zz:zz", "nope", "a\u0000b", "   "):
            _assert_422(api.post(retry_url, json={"model": model}, headers=auth), "model")
    assert _sessions(h, tenant) == [turn.session_id]

    # What is made counts: a fork, a retry and a plain session use up the rest of the minute.
    forked = api.post(fork_url, json={"checkpoint_id": point, "name": "what if"}, headers=auth)
    assert forked.status_code == 201, forked.text
    retried = api.post(retry_url, json={}, headers=auth)
    assert retried.status_code == 202, retried.text
    assert api.post("/v1/sessions", json={}, headers=auth).status_code == 201
    for refused in (api.post(fork_url, json={"checkpoint_id": point}, headers=auth),
                    api.post(retry_url, json={}, headers=auth),
                    api.post("/v1/sessions", json={}, headers=auth)):
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited", refused.text
    assert len(_sessions(h, tenant)) == SESSIONS_PER_MINUTE


def test_a_retry_whose_turn_is_refused_leaves_no_fork_and_gives_its_quota_back(h: Harness, api: TestClient) -> None:
    """Refused once the fork is written (the tenant's daily budget is spent): the fork goes with
    the turn, and the session it would have been is not counted."""
    tenant, auth = _tenant(h)
    h.seed(tenant)
    turn = h.ask(tenant, "Why is checkout slow?")
    _tenant_budget(h, tenant, {"daily_usd_limit": 0})
    for _ in range(SESSIONS_PER_MINUTE + 1):
        refused = api.post(f"/v1/turns/{turn.id}/retry", json={}, headers=auth)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded", refused.text
    assert _sessions(h, tenant) == [turn.session_id]
    _tenant_budget(h, tenant, {})
    for _ in range(SESSIONS_PER_MINUTE - 1):
        assert api.post(f"/v1/turns/{turn.id}/retry", json={}, headers=auth).status_code == 202


def _tenant_budget(h: Harness, tenant: str, limits: dict[str, Any]) -> None:
    with h.k.db.begin() as conn:
        conn.execute(update(tenants).where(tenants.c.id == tenant).values(settings={"budget": limits}))


# ---- Idempotency-Key on POST /v1/sessions ------------------------------------------------------

def test_racing_creations_with_one_key_make_one_session(h: Harness) -> None:
    """As many identical requests at once as the minute's quota allows: one session, and every
    request answers it (the losers of the insert read the winner's)."""
    tenant, _ = _tenant(h)
    start = threading.Barrier(SESSIONS_PER_MINUTE)
    outcomes: list[Any] = []
    lock = threading.Lock()

    def create() -> None:
        start.wait()
        try:
            result: Any = chat.new_session(h.k, tenant, "race", idempotency_key="race-1")
        except Exception as exc:
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=create) for _ in range(SESSIONS_PER_MINUTE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert len(outcomes) == SESSIONS_PER_MINUTE
    assert len({o.session.id for o in outcomes}) == 1 and [o.created for o in outcomes].count(True) == 1
    assert _sessions(h, tenant) == [outcomes[0].session.id]


def test_the_loser_of_a_race_answers_the_winners_session_and_costs_no_quota(h: Harness, api: TestClient,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The loser read no session under the key (the winner had not committed), so its insert
    is the one the unique index refuses; it then answers the winner's session as a replay."""
    tenant, auth = _tenant(h)
    headers = {**auth, "Idempotency-Key": "race-2"}
    won = api.post("/v1/sessions", json={"name": "race"}, headers=headers)
    assert won.status_code == 201, won.text
    real, missed = chats.session_by_key, []

    def not_yet(*args: Any) -> Any:
        if not missed:
            missed.append(args)
            return None
        return real(*args)

    monkeypatch.setattr(chats, "session_by_key", not_yet)
    lost = api.post("/v1/sessions", json={"name": "race"}, headers=headers)
    assert missed, "the loser did not read before its insert"
    assert lost.status_code == 201 and lost.headers["idempotent-replayed"] == "true", lost.text
    assert lost.json()["id"] == won.json()["id"] and _sessions(h, tenant) == [won.json()["id"]]
    made = [api.post("/v1/sessions", json={}, headers=auth) for _ in range(SESSIONS_PER_MINUTE)]
    assert [m.status_code for m in made] == [201] * (SESSIONS_PER_MINUTE - 1) + [429]  # the loser counted none


def test_a_session_key_is_unique_per_tenant_in_the_database(h: Harness) -> None:
    """The index, not only the read before it: a second row with a tenant's key is refused, the
    same key in another tenant and rows without a key are not."""
    tenant, _ = _tenant(h)
    other, _ = _tenant(h)
    with h.k.db.begin() as conn:
        chats.create_session(conn, tenant, "one", idempotency_key="k", request_hash="h")
        chats.create_session(conn, other, "one", idempotency_key="k", request_hash="h")
        chats.create_session(conn, tenant, "free")
        chats.create_session(conn, tenant, "free")
    with pytest.raises(Conflict) as refused, h.k.db.begin() as conn:
        chats.create_session(conn, tenant, "two", idempotency_key="k", request_hash="h")
    assert refused.value.code == "integrity"
