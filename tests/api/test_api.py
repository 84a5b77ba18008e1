"""The HTTP API in-process (TestClient) over SQLite and the in-process stream store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.testing.inline import drive
from kortex.turns.handoff import Handoff
from tests.conftest import Harness


class Recorder:
    def __init__(self) -> None:
        self.handoffs: list[Handoff] = []

    def __call__(self, handoff: Handoff) -> None:
        self.handoffs.append(handoff)


@pytest.fixture
def env(harness: Harness) -> Iterator[tuple[TestClient, Harness, Recorder]]:
    recorder = Recorder()
    app = create_app(harness.settings, dispatch=recorder, embedded_worker=False)
    with TestClient(app) as client:
        yield client, harness, recorder


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _tenant_key(h: Harness, name: str) -> str:
    return h.api_key(h.tenant(name))


def test_requests_without_a_valid_key_are_401(env) -> None:
    client, h, _ = env
    assert client.post("/v1/sessions", json={}).status_code == 401
    bad = client.post("/v1/sessions", json={}, headers=auth("kx_000000000000_" + "A" * 40))
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "unauthorized"
    assert bad.headers["www-authenticate"] == "Bearer"
    assert client.get("/v1/sessions/x", headers={"Authorization": "Basic abc"}).status_code == 401


def test_session_lifecycle_and_turn_through_the_api(env) -> None:
    client, h, recorder = env
    tenant = h.tenant("acme")
    h.seed(tenant)
    key = h.api_key(tenant)
    created = client.post("/v1/sessions", json={"name": "incident 42"}, headers=auth(key))
    assert created.status_code == 201 and created.headers["location"].endswith(created.json()["id"])
    sid = created.json()["id"]
    assert client.get(f"/v1/sessions/{sid}", headers=auth(key)).json()["name"] == "incident 42"
    posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": "Why is checkout slow?"}, headers=auth(key))
    assert posted.status_code == 202
    body = posted.json()
    assert body["status"] == "queued" and body["events_url"] == f"/v1/turns/{body['turn_id']}/events"
    assert len(recorder.handoffs) == 1 and recorder.handoffs[0].steps[0].turn_id == body["turn_id"]
    busy = client.post(f"/v1/sessions/{sid}/messages", json={"content": "again"}, headers=auth(key))
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "turn_in_progress"
    drive(h.k, recorder.handoffs[0])
    turn = client.get(f"/v1/turns/{body['turn_id']}", headers=auth(key)).json()
    assert turn["status"] == "done" and turn["model_used"] == "offline:analyst"
    messages = client.get(f"/v1/sessions/{sid}/messages", headers=auth(key)).json()["messages"]
    roles = [m["role"] for m in messages]
    # the analyst's rounds: the survey (deploys, the product's metrics listed, admin info, logged
    # changes), every metric read, the logs grouped at the onset, incident history, a proposal,
    # then the answer
    assert roles == ["user", "assistant", *["tool"] * 4, "assistant", *["tool"] * 3, "assistant", "tool",
                     "assistant", "tool", "assistant", "tool", "assistant"]
    page = client.get(f"/v1/sessions/{sid}/messages?limit=2", headers=auth(key)).json()
    rest = client.get(f"/v1/sessions/{sid}/messages?after={page['next_after']}", headers=auth(key)).json()
    assert [m["id"] for m in page["messages"] + rest["messages"]] == [m["id"] for m in messages]
    # a finished turn's events are a finite SSE response, in order, ending with done
    sse = client.get(body["events_url"], headers=auth(key))
    assert sse.headers["content-type"].startswith("text/event-stream")
    events = [line.split(": ", 1)[1] for line in sse.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "turn" and events[-1] == "done" and events.count("tool_result") == 10
    assert events.count("proposal") == 1 and events.index("proposal") > events.index("tool_result")


def test_a_session_can_be_created_without_a_body(env) -> None:
    client, h, _ = env
    key = _tenant_key(h, "acme")
    created = client.post("/v1/sessions", headers=auth(key))
    assert created.status_code == 201, created.text
    assert created.json()["name"]  # a default name
    # A form-encoded body (curl -d without a content type) is a clear 422, not a silent default.
    form = client.post("/v1/sessions", content=b"name=x",
                       headers={**auth(key), "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 422 and form.json()["error"]["code"] == "validation"


def test_idempotency_key_makes_a_retry_return_the_same_turn(env) -> None:
    client, h, recorder = env
    key = _tenant_key(h, "acme")
    sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
    headers = {**auth(key), "Idempotency-Key": "retry-1"}
    first = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=headers)
    second = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["turn_id"] == second.json()["turn_id"]
    assert second.headers["idempotent-replayed"] == "true"
    clash = client.post(f"/v1/sessions/{sid}/messages", json={"content": "different"}, headers=headers)
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "idempotency_mismatch"
    msgs = client.get(f"/v1/sessions/{sid}/messages", headers=auth(key)).json()["messages"]
    assert [m["role"] for m in msgs] == ["user"]


def test_other_tenants_see_nothing(env) -> None:
    client, h, recorder = env
    key_a, key_b = _tenant_key(h, "a"), _tenant_key(h, "b")
    sid = client.post("/v1/sessions", json={}, headers=auth(key_a)).json()["id"]
    turn_id = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key_a)).json()["turn_id"]
    for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/messages", f"/v1/turns/{turn_id}",
                 f"/v1/turns/{turn_id}/events"):
        response = client.get(path, headers=auth(key_b))
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", path
    assert client.post(f"/v1/sessions/{sid}/messages", json={"content": "x"}, headers=auth(key_b)).status_code == 404
    assert client.get("/v1/sessions/not-a-uuid", headers=auth(key_a)).status_code == 404


@pytest.mark.parametrize("body,field", [
    ({"content": ""}, "content"), ({"content": "   "}, "content"), ({}, "content"), ({"content": "x", "extra": 1}, "extra"),
    ({"content": "x", "model": "nope:nope"}, None),
])
def test_bad_input_gets_a_clear_4xx(env, body: dict[str, Any], field: str | None) -> None:
    client, h, _ = env
    key = _tenant_key(h, "acme")
    sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
    response = client.post(f"/v1/sessions/{sid}/messages", json=body, headers=auth(key))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["message"]
    if field:
        assert error["code"] == "validation"
        assert any(d == {"field": field, "message": d["message"]} for d in error["details"]), error


@pytest.mark.parametrize("value", ["", "k" * 201])
def test_an_idempotency_key_refused_for_any_reason_gets_the_one_422_shape(env, value: str) -> None:
    # Empty is refused by the domain, too long by the request's validation: the client sees one shape.
    client, h, _ = env
    key = _tenant_key(h, "acme")
    sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
    response = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"},
                           headers={**auth(key), "Idempotency-Key": value})
    assert response.status_code == 422
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"} and error["code"] == "validation"
    assert [set(d) for d in error["details"]] == [{"field", "message"}]
    assert error["details"][0]["field"] == "Idempotency-Key"


def test_large_bodies_and_bad_json_are_rejected(env) -> None:
    client, h, _ = env
    key = _tenant_key(h, "acme")
    huge = client.post("/v1/sessions", content=b"{" + b" " * (2 * 1024 * 1024) + b"}",
                       headers={**auth(key), "content-type": "application/json"})
    assert huge.status_code == 413
    broken = client.post("/v1/sessions", content=b"{nope", headers={**auth(key), "content-type": "application/json"})
    assert broken.status_code == 422


def test_health_and_readiness(env) -> None:
    client, _, _ = env
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "schema": "ok", "redis": "ok"}


def test_readiness_fails_on_a_schema_behind_or_missing(env) -> None:
    from alembic import command
    from alembic.script import ScriptDirectory

    from kortex.storage.migrate import alembic_config
    client, h, _ = env
    url = h.settings.effective_database_url
    head = ScriptDirectory.from_config(alembic_config(url)).get_revision("head")
    command.stamp(alembic_config(url), head.down_revision)  # as a database left one migration behind looks
    behind = client.get("/readyz")
    assert behind.status_code == 503 and behind.json()["status"] == "unavailable"
    assert behind.json()["checks"]["schema"] == (
        f"failed: the database schema is at {head.down_revision}, behind {head.revision}: run 'kortex migrate'")
    with h.k.db.begin() as conn:
        conn.exec_driver_sql("DELETE FROM alembic_version")
    missing = client.get("/readyz").json()["checks"]["schema"]
    assert missing == "failed: the database has no Kortex schema: run 'kortex migrate'"
    command.stamp(alembic_config(url), "head")
    assert client.get("/readyz").status_code == 200


def test_a_turn_is_accepted_even_when_the_broker_is_down(harness: Harness) -> None:
    def broken(handoff: Handoff) -> None:
        raise ConnectionError("broker unreachable")

    app = create_app(harness.settings, dispatch=broken, embedded_worker=False)
    with TestClient(app) as client:
        key = _tenant_key(harness, "acme")
        sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
        posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key))
        assert posted.status_code == 202 and posted.headers["kortex-enqueue"] == "deferred"
        turn = client.get(f"/v1/turns/{posted.json()['turn_id']}", headers=auth(key)).json()
        assert turn["status"] == "queued"  # stored: the watchdog hands it to the queue later


def test_reconnecting_after_done_gets_204_and_noise_event_ids_start_over(env) -> None:
    client, h, recorder = env
    key = _tenant_key(h, "acme")
    sid = client.post("/v1/sessions", json={"model": "scripted:text_only"}, headers=auth(key)).json()["id"]
    body = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key)).json()
    drive(h.k, recorder.handoffs[-1])
    full = client.get(body["events_url"], headers=auth(key))
    ids = [line.split(": ", 1)[1] for line in full.text.splitlines() if line.startswith("id: ")]
    done = client.get(body["events_url"], headers={**auth(key), "Last-Event-ID": ids[-1]})
    assert done.status_code == 204
    partial = client.get(body["events_url"], headers={**auth(key), "Last-Event-ID": ids[-2]})
    assert partial.status_code == 200 and partial.text.count("event: ") == 1
    # However long: noise too long to be an id is still noise, not a 422.
    for bogus in ("nonsense", "1-2-3", "x" * 65, "x-" * 2000):
        again = client.get(body["events_url"], headers={**auth(key), "Last-Event-ID": bogus})
        assert again.status_code == 200 and again.text.count("event: ") == len(ids)
    # An id past Redis's range is a client bug, not noise: replaying would repeat everything.
    for out_of_range in ("99999999999999999999-0", "18446744073709551615-18446744073709551615", "1" * 65 + "-1"):
        refused = client.get(body["events_url"], headers={**auth(key), "Last-Event-ID": out_of_range})
        assert refused.status_code == 422
        assert refused.json()["error"]["details"][0]["field"] == "Last-Event-ID"


def test_a_stream_that_lost_its_done_is_closed_from_the_database(harness_factory) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from kortex.storage.schema import turns as turns_table
    from kortex.timeparse import utcnow

    h = harness_factory(turn={"heartbeat": 0.2, "text_flush_ms": 0})
    recorder = Recorder()
    with TestClient(create_app(h.settings, dispatch=recorder, embedded_worker=False)) as client:
        key = _tenant_key(h, "acme")
        sid = client.post("/v1/sessions", json={"model": "scripted:text_only"}, headers=auth(key)).json()["id"]
        body = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key)).json()
        drive(h.k, recorder.handoffs[-1])
        # The done event never reached Redis (its publish failed after the commit) ...
        entries = h.k.events.read(body["turn_id"])
        h.k.redis.xdel(h.k.events.key(body["turn_id"]), entries[-1].id)
        with h.k.db.begin() as conn:  # ... and that was a while ago.
            conn.execute(update(turns_table).where(turns_table.c.id == body["turn_id"])
                         .values(finished_at=utcnow() - timedelta(minutes=1)))
        response = client.get(body["events_url"], headers=auth(key))
    kinds = [line.split(": ", 1)[1] for line in response.text.splitlines() if line.startswith("event: ")]
    assert kinds == ["turn", "text", "text", "text", "done"]
    assert '"status":"done"' in response.text.split("event: done")[1]


def test_stored_tool_call_arguments_are_scrubbed_as_on_the_live_stream() -> None:
    from datetime import UTC, datetime

    from api.schemas import MessageOut
    from kortex.redaction import REDACTED
    from kortex.storage.records import MessageRecord

    record = MessageRecord(
        id="m", session_id="s", turn_id="t", turn_no=0, step=0, ord=0, role="assistant", content="",
        tool_calls=[{"id": "call_1", "name": "get_logs",
                     "arguments": {"product": "checkout", "api_key": "sk-live-abcdef0123456789"}}],
        tool_call_id=None, tool_name=None, result=None, is_error=False, error_code=None, truncated=False,
        created_at=datetime.now(UTC))
    out = MessageOut.of(record)
    assert out.tool_calls == [{"id": "call_1", "name": "get_logs",
                               "arguments": {"product": "checkout", "api_key": REDACTED}}]


def test_sessions_are_listed_newest_first_a_page_at_a_time_and_deleted_with_their_turns(env) -> None:
    client, h, recorder = env
    key = _tenant_key(h, "acme")
    other = _tenant_key(h, "other")
    ids = [client.post("/v1/sessions", json={"name": f"s{i}"}, headers=auth(key)).json()["id"] for i in range(5)]
    client.post("/v1/sessions", json={"name": "not yours"}, headers=auth(other))
    first = client.get("/v1/sessions?limit=2", headers=auth(key)).json()
    second = client.get(f"/v1/sessions?limit=2&before={first['next_before']}", headers=auth(key)).json()
    third = client.get(f"/v1/sessions?limit=2&before={second['next_before']}", headers=auth(key)).json()
    listed = [s["id"] for s in first["sessions"] + second["sessions"] + third["sessions"]]
    assert listed == ids[::-1] and third["next_before"] is None
    bad = client.get("/v1/sessions?before=nope", headers=auth(key))
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "before"

    sid = ids[0]
    posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key)).json()
    busy = client.delete(f"/v1/sessions/{sid}", headers=auth(key))
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "turn_in_progress"
    assert busy.json()["error"]["details"]["turn_id"] == posted["turn_id"]
    drive(h.k, recorder.handoffs[-1])
    assert h.events(posted["turn_id"])  # the turn's stream exists until its session goes
    assert client.delete(f"/v1/sessions/{sid}", headers=auth(other)).status_code == 404
    gone = client.delete(f"/v1/sessions/{sid}", headers=auth(key))
    assert gone.status_code == 204
    assert client.get(f"/v1/sessions/{sid}", headers=auth(key)).status_code == 404
    assert client.get(f"/v1/turns/{posted['turn_id']}", headers=auth(key)).status_code == 404
    assert not h.k.events.exists(posted["turn_id"])
    assert client.delete(f"/v1/sessions/{sid}", headers=auth(key)).status_code == 404
    from sqlalchemy import select

    from kortex.storage.schema import decisions
    with h.k.db.connect() as conn:
        kinds = {r.kind for r in conn.execute(select(decisions.c.kind).where(decisions.c.session_id == sid))}
    assert "session_deleted" in kinds and "llm_call" in kinds  # the audit trail outlives the session


def test_a_turn_is_cancelled_over_http_once_and_a_finished_one_is_a_409(env) -> None:
    client, h, recorder = env
    key = _tenant_key(h, "acme")
    sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
    turn_id = client.post(f"/v1/sessions/{sid}/messages", json={"content": "hi"}, headers=auth(key)).json()["turn_id"]
    cancelled = client.post(f"/v1/turns/{turn_id}/cancel", headers=auth(key))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert client.post(f"/v1/turns/{turn_id}/cancel", headers=auth(key)).json() == cancelled.json()
    sse = client.get(f"/v1/turns/{turn_id}/events", headers=auth(key))
    assert [line for line in sse.text.splitlines() if line.startswith("event: ")] == ["event: done"]
    assert '"status":"cancelled"' in sse.text
    second = client.post(f"/v1/sessions/{sid}/messages", json={"content": "again"}, headers=auth(key)).json()
    drive(h.k, recorder.handoffs[-1])
    late = client.post(f"/v1/turns/{second['turn_id']}/cancel", headers=auth(key))
    assert late.status_code == 409 and late.json()["error"]["code"] == "turn_finished"
    assert client.post("/v1/turns/not-a-uuid/cancel", headers=auth(key)).status_code == 404


def test_metrics_are_scraped_in_prometheus_format_behind_an_optional_token(harness_factory) -> None:
    open_h = harness_factory()
    with TestClient(create_app(open_h.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        scraped = client.get("/metrics")
        assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
        assert "# TYPE kortex_turns_finished_total counter" in scraped.text
    locked = harness_factory(metrics={"token": "s3cret-metrics"})
    with TestClient(create_app(locked.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-metrics"}).status_code == 200
    off = harness_factory(metrics={"enabled": False})
    with TestClient(create_app(off.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        assert client.get("/metrics").status_code == 404


def test_a_just_posted_turns_stream_opens_without_reading_the_turn_back_and_only_for_its_tenant(env) -> None:
    from sqlalchemy import event

    client, h, recorder = env
    key, other = _tenant_key(h, "acme"), _tenant_key(h, "globex")
    sid = client.post("/v1/sessions", json={}, headers=auth(key)).json()["id"]
    posted = client.post(f"/v1/sessions/{sid}/messages", json={"content": "Why is checkout slow?"},
                         headers=auth(key)).json()
    drive(h.k, recorder.handoffs[-1])  # the turn runs and ends before its stream is opened
    reads: list[str] = []

    def note(conn, cursor, statement, *args) -> None:  # noqa: ANN001
        if "FROM turns" in statement:
            reads.append(statement)

    engine = client.app.state.kortex.db.engine  # the API's own container, not the harness's
    event.listen(engine, "before_cursor_execute", note)
    try:
        sse = client.get(posted["events_url"], headers=auth(key))
        assert sse.status_code == 200 and reads == []  # what the POST stored was enough to start
        events = [line[7:] for line in sse.text.splitlines() if line.startswith("event: ")]
        assert events[0] == "turn" and events[-1] == "done"  # the whole turn, live from the hub
        # Another tenant's key finds nothing, cached or not.
        assert client.get(posted["events_url"], headers=auth(other)).status_code == 404
        assert len(reads) == 1  # its lookup went to the database, which scopes it
        # A second reader reads the turn: finished now, and with its stream gone it is rebuilt
        # from the database rather than followed as the POST left it.
        h.k.events.delete(posted["turn_id"])
        again = client.get(posted["events_url"], headers=auth(key))
        rebuilt = [line[4:] for line in again.text.splitlines() if line.startswith("id: ")]
        assert len(reads) == 2 and rebuilt[0] == "0-1" and again.text.rstrip().split("\n")[-2] == "event: done"
    finally:
        event.remove(engine, "before_cursor_execute", note)
