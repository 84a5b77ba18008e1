"""Tenant isolation over the HTTP API, on PostgreSQL and Redis (a security audit's spec).

Tenant A owns a session with a finished turn (and its checkpoints, events and a proposal the
model made), a session with a queued turn, post-mortem jobs (one finished, one still open),
its keys and its Idempotency-Keys. Tenant B, with a key of every role, tries every route that
takes an id with A's ids: each answer must be the very answer B gets for an id that exists
nowhere (404, the same body), and nothing of A's may change. Lists filtered by A's ids list
nothing of A's; B's Idempotency-Keys never replay A's requests; roles keep to their
permissions; a revoked key is a stranger; ingest writes only into the caller's tenant; health
and metrics name no tenant."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.testing.inline import drive
from kortex.testing.scratch import throwaway_database, throwaway_prefix
from kortex.timeparse import utcnow
from kortex.turns.handoff import Handoff
from tests.api.conftest import bearer
from tests.conftest import SCRIPTS, Harness, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
#: tool calls a turn of tenant B makes: each of A's ids ("theirs") next to one that exists nowhere
PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "trace_theirs": ("get_traces", {"request_id": "trace-a-secret", "include_logs": True}),
    "trace_nowhere": ("get_traces", {"request_id": "trace-nowhere", "include_logs": True}),
    "corr_theirs": ("get_traces", {"request_id": "req-a-secret"}),
    "corr_nowhere": ("get_traces", {"request_id": "req-nowhere"}),
    "request_theirs": ("get_request_detail", {"request_id": "req-a-secret"}),
    "request_nowhere": ("get_request_detail", {"request_id": "req-nowhere"}),
    "admin_theirs": ("get_admin_info", {"product": "asecretproduct"}),
    "admin_nowhere": ("get_admin_info", {"product": "nowhereproduct"}),
    "incidents_theirs": ("get_incident_history", {"query": "asecretword"}),
    "incidents_nowhere": ("get_incident_history", {"query": "nowhereword"}),
    "user_theirs": ("get_user_context", {"user_id": "user-a-secret"}),
    "user_nowhere": ("get_user_context", {"user_id": "user-nowhere"}),
    "products": ("list_products", {"time_range": "last 7d"}),
}
#: response headers that differ between any two requests
VOLATILE = {"date", "x-request-id", "content-length"}


@dataclass
class World:
    client: TestClient
    h: Harness
    sent: list[Handoff]
    a: str  # tenant ids
    b: str
    a_admin: str
    b_keys: dict[str, str]  # role -> key
    a_session: str = ""  # with a finished turn and a proposal
    a_turn: str = ""
    a_busy_session: str = ""  # with a queued turn
    a_queued_turn: str = ""
    a_checkpoints: list[str] = field(default_factory=list)
    a_event_ids: list[str] = field(default_factory=list)
    a_proposal: str = ""
    a_job_done: str = ""
    a_job_open: str = ""
    a_key_id: str = ""
    a_sessions_cursor: str = ""

    def run(self) -> None:
        while self.sent:
            drive(self.h.k, self.sent.pop(0))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with ExitStack() as stack:
        try:
            url, _ = stack.enter_context(throwaway_database(PG_ADMIN, prefix="audit", migrated=True))
        except psycopg.OperationalError as exc:
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {exc}")
        prefix = stack.enter_context(throwaway_prefix(REDIS_URL, "kxaudit"))
        scripts = tmp_path_factory.mktemp("isolation-scripts")
        for script in SCRIPTS.glob("*.json"):
            (scripts / script.name).write_text(script.read_text())
        (scripts / "audit_probe.json").write_text(json.dumps({"steps": [
            {"text": ["Probing."], "tool_calls": [{"id": call_id, "name": name, "arguments": args}
                                                  for call_id, (name, args) in PROBES.items()]},
            {"text": ["Done."]}]}))
        h = Harness(make_settings(tmp_path_factory.mktemp("isolation-pg"), url, redis_url=REDIS_URL,
                                  redis_prefix=prefix, testing={"scripts_dir": scripts}))
        stack.callback(h.close)
        sent: list[Handoff] = []
        app = create_app(h.settings, dispatch=sent.append, embedded_worker=False)
        client = stack.enter_context(TestClient(app, raise_server_exceptions=False))
        a, b = h.tenant("tenant-a"), h.tenant("tenant-b")
        for tenant in (a, b):
            h.seed(tenant, "incident-archive")
        w = World(client=client, h=h, sent=sent, a=a, b=b, a_admin=h.api_key(a, "admin"),
                  b_keys={role: h.api_key(b, role) for role in ("admin", "operator", "chat", "ingest")})
        _build_a(w)
        yield w


def _build_a(w: World) -> None:
    """Tenant A's objects, made over HTTP as a client would."""
    c, key = w.client, bearer(w.a_admin)
    w.a_session = c.post("/v1/sessions", json={"name": "a-secret-session", "model": "scripted:propose"},
                         headers=key).json()["id"]
    posted = c.post(f"/v1/sessions/{w.a_session}/messages", json={"content": "a's question"},
                    headers={**key, "Idempotency-Key": "shared-key"})
    assert posted.status_code == 202, posted.text
    w.a_turn = posted.json()["turn_id"]
    w.run()
    assert c.get(f"/v1/turns/{w.a_turn}", headers=key).json()["status"] == "done"
    w.a_checkpoints = [cp["id"] for cp in c.get(f"/v1/turns/{w.a_turn}/checkpoints", headers=key).json()]
    assert len(w.a_checkpoints) >= 2
    events = c.get(f"/v1/turns/{w.a_turn}/events", headers=key).text
    w.a_event_ids = [line[4:] for line in events.splitlines() if line.startswith("id: ")]
    assert len(w.a_event_ids) >= 3
    proposals = c.get("/v1/proposals", params={"session_id": w.a_session}, headers=key).json()["proposals"]
    assert len(proposals) == 1 and proposals[0]["status"] == "pending"
    w.a_proposal = proposals[0]["id"]

    w.a_busy_session = c.post("/v1/sessions", json={"model": "scripted:text_only"}, headers=key).json()["id"]
    w.a_queued_turn = c.post(f"/v1/sessions/{w.a_busy_session}/messages", json={"content": "still queued"},
                             headers=key).json()["turn_id"]
    w.sent.clear()  # never run: it stays queued

    done = c.post("/v1/postmortems", json={"incident_ids": ["INC-1101"]},
                  headers={**key, "Idempotency-Key": "shared-job-key"})
    assert done.status_code == 202, done.text
    w.a_job_done = done.json()["job_id"]
    w.run()
    assert c.get(f"/v1/postmortems/{w.a_job_done}", headers=key).json()["status"] == "done"
    assert c.get("/v1/incidents/INC-1101/postmortem", headers=key).status_code == 200
    opened = c.post("/v1/postmortems", json={"incident_ids": ["INC-1116", "INC-1110"], "concurrency": 1},
                    headers=key)
    w.a_job_open = opened.json()["job_id"]
    w.sent.clear()  # never run: its items stay queued or dispatched

    w.a_key_id = c.get("/v1/keys", headers=key).json()["keys"][0]["key_id"]
    for _ in range(2):  # a next_before exists once there is more than one page
        c.post("/v1/sessions", json={}, headers=key)
    w.a_sessions_cursor = c.get("/v1/sessions", params={"limit": 1}, headers=key).json()["next_before"]
    assert w.a_sessions_cursor


def _missing() -> str:
    return str(uuid.uuid4())


def _headers(response: Any) -> set[str]:
    return {name for name in response.headers if name.lower() not in VOLATILE}


def _same_as_missing(w: World, key: str, method: str, theirs: str, nowhere: str, **kwargs: Any) -> None:
    """B asking for A's object gets exactly what B gets for an object that does not exist."""
    theirs_headers, nowhere_headers = kwargs.pop("headers", {}), kwargs.pop("headers_missing", {})
    got = w.client.request(method, theirs, headers={**bearer(key), **theirs_headers}, **kwargs)
    missing = w.client.request(method, nowhere, headers={**bearer(key), **nowhere_headers}, **kwargs)
    assert got.status_code == missing.status_code, (method, theirs, got.status_code, got.text, missing.text)
    assert got.status_code in (403, 404, 422), (method, theirs, got.status_code, got.text)
    assert got.json() == missing.json(), (method, theirs, got.text, missing.text)
    assert _headers(got) == _headers(missing), (method, theirs)


def _a_unchanged(w: World) -> None:
    c, key = w.client, bearer(w.a_admin)
    assert c.get(f"/v1/sessions/{w.a_session}", headers=key).status_code == 200
    assert c.get(f"/v1/sessions/{w.a_busy_session}", headers=key).status_code == 200
    assert c.get(f"/v1/turns/{w.a_queued_turn}", headers=key).json()["status"] == "queued"
    assert c.get(f"/v1/proposals/{w.a_proposal}", headers=key).json()["status"] == "pending"
    assert c.get(f"/v1/postmortems/{w.a_job_open}", headers=key).json()["status"] in ("queued", "running")
    keys = {k["key_id"]: k for k in c.get("/v1/keys", headers=key).json()["keys"]}
    assert keys[w.a_key_id]["revoked_at"] is None and len(keys) == 1  # and none issued by anyone else
    messages = c.get(f"/v1/sessions/{w.a_session}/messages", headers=key).json()["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["a's question"]


# ---- every route that takes an id ---------------------------------------------------------------


def test_sessions_of_another_tenant_are_not_found_and_untouched(world: World) -> None:
    w, x = world, _missing()
    for role in ("admin", "chat", "operator"):
        key = w.b_keys[role]
        for sid in (w.a_session, w.a_busy_session):
            _same_as_missing(w, key, "GET", f"/v1/sessions/{sid}", f"/v1/sessions/{x}")
            _same_as_missing(w, key, "GET", f"/v1/sessions/{sid}/messages", f"/v1/sessions/{x}/messages")
            _same_as_missing(w, key, "GET", f"/v1/sessions/{sid}/messages?after=1.0.0",
                             f"/v1/sessions/{x}/messages?after=1.0.0")
            _same_as_missing(w, key, "POST", f"/v1/sessions/{sid}/messages", f"/v1/sessions/{x}/messages",
                             json={"content": "b writes into a's session"})
            _same_as_missing(w, key, "POST", f"/v1/sessions/{sid}/messages", f"/v1/sessions/{x}/messages",
                             json={"content": "a's question"}, headers={"Idempotency-Key": "shared-key"},
                             headers_missing={"Idempotency-Key": "shared-key"})
            for checkpoint in (*w.a_checkpoints, _missing()):
                _same_as_missing(w, key, "POST", f"/v1/sessions/{sid}/fork", f"/v1/sessions/{x}/fork",
                                 json={"checkpoint_id": checkpoint})
            _same_as_missing(w, key, "DELETE", f"/v1/sessions/{sid}", f"/v1/sessions/{x}")
    _a_unchanged(w)


def test_a_checkpoint_of_another_tenant_cannot_be_forked_into_ones_own_session(world: World) -> None:
    w = world
    key = w.b_keys["chat"]
    own = w.client.post("/v1/sessions", json={"model": "scripted:text_only"}, headers=bearer(key)).json()["id"]
    for checkpoint in w.a_checkpoints:
        _same_as_missing(w, key, "POST", f"/v1/sessions/{own}/fork", f"/v1/sessions/{own}/fork",
                         json={"checkpoint_id": checkpoint})
    assert w.client.get("/v1/sessions", headers=bearer(key)).json()["sessions"][0]["id"] == own  # no fork made


def test_turns_of_another_tenant_are_not_found_and_untouched(world: World) -> None:
    w, x = world, _missing()
    for role in ("admin", "chat", "operator"):
        key = w.b_keys[role]
        for tid in (w.a_turn, w.a_queued_turn):
            _same_as_missing(w, key, "GET", f"/v1/turns/{tid}", f"/v1/turns/{x}")
            _same_as_missing(w, key, "GET", f"/v1/turns/{tid}/checkpoints", f"/v1/turns/{x}/checkpoints")
            _same_as_missing(w, key, "POST", f"/v1/turns/{tid}/cancel", f"/v1/turns/{x}/cancel")
            _same_as_missing(w, key, "POST", f"/v1/turns/{tid}/retry", f"/v1/turns/{x}/retry", json={})
            _same_as_missing(w, key, "POST", f"/v1/turns/{tid}/retry", f"/v1/turns/{x}/retry",
                             json={"checkpoint_id": w.a_checkpoints[0], "model": "scripted:text_only"})
    _a_unchanged(w)


def test_an_event_stream_of_another_tenant_cannot_be_followed_from_any_point(world: World) -> None:
    w, x = world, _missing()
    key = w.b_keys["chat"]
    for tid in (w.a_turn, w.a_queued_turn):
        _same_as_missing(w, key, "GET", f"/v1/turns/{tid}/events", f"/v1/turns/{x}/events")
        for last in (*w.a_event_ids, "0-1", "0-999", "not-an-id", "99999999999999999999-0"):
            _same_as_missing(w, key, "GET", f"/v1/turns/{tid}/events", f"/v1/turns/{x}/events",
                             headers={"Last-Event-ID": last}, headers_missing={"Last-Event-ID": last})


def test_proposals_of_another_tenant_cannot_be_read_or_decided(world: World) -> None:
    w, x = world, _missing()
    for role in ("admin", "operator", "chat"):  # chat: 403 for both, which tells nothing either
        key = w.b_keys[role]
        _same_as_missing(w, key, "GET", f"/v1/proposals/{w.a_proposal}", f"/v1/proposals/{x}")
        for verb in ("confirm", "reject"):
            _same_as_missing(w, key, "POST", f"/v1/proposals/{w.a_proposal}/{verb}", f"/v1/proposals/{x}/{verb}")
            _same_as_missing(w, key, "POST", f"/v1/proposals/{w.a_proposal}/{verb}", f"/v1/proposals/{x}/{verb}",
                             json={"note": "b decides for a"})
    _a_unchanged(w)


def test_post_mortem_jobs_of_another_tenant_are_not_found_and_untouched(world: World) -> None:
    w, x = world, _missing()
    for role in ("admin", "chat", "operator"):
        key = w.b_keys[role]
        for job in (w.a_job_done, w.a_job_open):
            base, none = f"/v1/postmortems/{job}", f"/v1/postmortems/{x}"
            _same_as_missing(w, key, "GET", base, none)
            _same_as_missing(w, key, "GET", f"{base}/items", f"{none}/items")
            _same_as_missing(w, key, "GET", f"{base}/items?status=done&after=0", f"{none}/items?status=done&after=0")
            _same_as_missing(w, key, "GET", f"{base}/documents", f"{none}/documents")
            _same_as_missing(w, key, "GET", f"{base}/events", f"{none}/events")
            for last in ("1", "999999999", "not-an-id"):  # a bad one is a 422 for both: nothing told
                _same_as_missing(w, key, "GET", f"{base}/events", f"{none}/events", headers={"Last-Event-ID": last},
                                 headers_missing={"Last-Event-ID": last})
            for running in ("finish", "cancel"):
                _same_as_missing(w, key, "POST", f"{base}/cancel?running={running}", f"{none}/cancel?running={running}")
    _a_unchanged(w)


def test_another_tenants_post_mortem_document_is_not_served(world: World) -> None:
    w = world
    key = w.b_keys["chat"]
    # B has an incident INC-1101 too (the same archive), but no post-mortem of it: A's is not B's.
    for accept in ("application/json", "text/markdown"):
        _same_as_missing(w, key, "GET", "/v1/incidents/INC-1101/postmortem", "/v1/incidents/INC-0000/postmortem",
                         headers={"Accept": accept}, headers_missing={"Accept": accept})


def test_keys_of_another_tenant_cannot_be_revoked_or_rotated(world: World) -> None:
    w = world
    nowhere = uuid.uuid4().hex[:12]
    key = w.b_keys["admin"]
    _same_as_missing(w, key, "DELETE", f"/v1/keys/{w.a_key_id}", f"/v1/keys/{nowhere}")
    _same_as_missing(w, key, "POST", f"/v1/keys/{w.a_key_id}/rotate", f"/v1/keys/{nowhere}/rotate")
    listed = w.client.get("/v1/keys", headers=bearer(key)).json()["keys"]
    assert w.a_key_id not in {k["key_id"] for k in listed}
    _a_unchanged(w)
    assert w.client.get(f"/v1/sessions/{w.a_session}", headers=bearer(w.a_admin)).status_code == 200  # A's key works


# ---- lists and filters --------------------------------------------------------------------------


def test_lists_filtered_by_another_tenants_ids_list_nothing_of_theirs(world: World) -> None:
    w = world
    c, key = w.client, bearer(w.b_keys["admin"])
    assert c.get("/v1/proposals", params={"session_id": w.a_session}, headers=key).json()["proposals"] == []
    for status in ("pending", "confirmed", "rejected", "expired"):
        found = c.get("/v1/proposals", params={"status": status, "session_id": w.a_session}, headers=key).json()
        assert found["proposals"] == []
    everything = json.dumps(c.get("/v1/proposals", headers=key).json())
    assert w.a_proposal not in everything and w.a_session not in everything
    sessions = json.dumps(c.get("/v1/sessions", params={"limit": 200}, headers=key).json())
    for secret in (w.a_session, w.a_busy_session, "a-secret-session"):
        assert secret not in sessions
    # A's page cursor is bound to A: for B it is no cursor at all, as any garbage is.
    theirs = c.get("/v1/sessions", params={"before": w.a_sessions_cursor}, headers=key)
    garbage = c.get("/v1/sessions", params={"before": "x" * len(w.a_sessions_cursor)}, headers=key)
    assert theirs.status_code == garbage.status_code == 422 and theirs.json() == garbage.json()


# ---- idempotency keys ---------------------------------------------------------------------------


def test_an_idempotency_key_another_tenant_used_replays_nothing_of_theirs(world: World) -> None:
    w = world
    c, key = w.client, bearer(w.b_keys["chat"])
    sid = c.post("/v1/sessions", json={"model": "scripted:text_only"}, headers=key).json()["id"]
    # The very request A sent, with A's key: a new turn of B's, not A's turn replayed nor a clash.
    posted = c.post(f"/v1/sessions/{sid}/messages", json={"content": "a's question"},
                    headers={**key, "Idempotency-Key": "shared-key"})
    assert posted.status_code == 202, posted.text
    assert posted.json()["turn_id"] != w.a_turn and "idempotent-replayed" not in posted.headers
    assert posted.json()["session_id"] == sid
    w.run()
    job = c.post("/v1/postmortems", json={"incident_ids": ["INC-1101"]},
                 headers={**key, "Idempotency-Key": "shared-job-key"})
    assert job.status_code == 202, job.text
    assert job.json()["job_id"] != w.a_job_done
    w.run()
    documents = c.get(f"/v1/postmortems/{job.json()['job_id']}/documents", headers=key).json()["documents"]
    assert [d["job_id"] for d in documents] == [job.json()["job_id"]]
    # Another body under A's keys is not a mismatch with A's request either: B never used them.
    other = c.post("/v1/postmortems", json={"incident_ids": ["INC-1116"], "concurrency": 2},
                   headers={**bearer(w.b_keys["admin"]), "Idempotency-Key": "shared-job-key"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_mismatch"  # B's own first use
    w.sent.clear()
    _a_unchanged(w)


# ---- roles --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["chat", "operator", "ingest"])
def test_a_key_that_may_not_manage_keys_cannot_list_issue_revoke_or_rotate_any(world: World, role: str) -> None:
    w = world
    c, key = w.client, bearer(w.b_keys[role])
    own_admin = c.get("/v1/keys", headers=bearer(w.b_keys["admin"])).json()["keys"][0]["key_id"]
    for method, path, body in (("GET", "/v1/keys", None), ("POST", "/v1/keys", {"role": "admin"}),
                               ("POST", "/v1/keys", {}), ("DELETE", f"/v1/keys/{own_admin}", None),
                               ("POST", f"/v1/keys/{own_admin}/rotate", None),
                               ("DELETE", f"/v1/keys/{w.a_key_id}", None)):
        refused = c.request(method, path, headers=key, json=body)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden", (method, path)
        assert w.a_key_id not in refused.text and own_admin not in refused.text
    assert own_admin in {k["key_id"] for k in c.get("/v1/keys", headers=bearer(w.b_keys["admin"])).json()["keys"]
                         if k["revoked_at"] is None}


def test_an_ingest_key_reaches_nothing_but_ingest(world: World) -> None:
    w = world
    c, key = w.client, bearer(w.b_keys["ingest"])
    for method, path in (("GET", "/v1/sessions"), ("POST", "/v1/sessions"), ("GET", f"/v1/sessions/{w.a_session}"),
                         ("GET", f"/v1/turns/{w.a_turn}"), ("GET", f"/v1/turns/{w.a_turn}/events"),
                         ("GET", "/v1/proposals"), ("POST", f"/v1/proposals/{w.a_proposal}/confirm"),
                         ("GET", f"/v1/postmortems/{w.a_job_done}"), ("POST", "/v1/postmortems"),
                         ("GET", "/v1/incidents/INC-1101/postmortem"), ("GET", "/v1/tools"),
                         ("GET", "/v1/llm/providers"), ("GET", "/v1/keys")):
        refused = c.request(method, path, headers=key, json={} if method == "POST" else None)
        assert refused.status_code == 403, (method, path, refused.text)


def test_a_key_issued_by_another_tenants_admin_belongs_to_that_tenant(world: World) -> None:
    w = world
    c = w.client
    for naming in ({"tenant_id": w.a}, {"tenant": "tenant-a"}):
        refused = c.post("/v1/keys", json={"name": "b-made", "role": "admin", **naming},
                         headers=bearer(w.b_keys["admin"]))
        assert refused.status_code == 422, refused.text
    issued = c.post("/v1/keys", json={"name": "b-made", "role": "admin"}, headers=bearer(w.b_keys["admin"]))
    assert issued.status_code == 201
    new = issued.json()["key"]
    assert c.get(f"/v1/sessions/{w.a_session}", headers=bearer(new)).status_code == 404
    assert issued.json()["key_id"] not in {k["key_id"] for k in c.get("/v1/keys", headers=bearer(w.a_admin)).json()["keys"]}
    assert c.delete(f"/v1/keys/{issued.json()['key_id']}", headers=bearer(w.b_keys["admin"])).status_code == 200


def test_a_revoked_key_is_a_stranger(world: World) -> None:
    w = world
    c = w.client
    made = c.post("/v1/keys", json={"name": "to-revoke", "role": "admin"}, headers=bearer(w.b_keys["admin"])).json()
    secret = made["key"]
    sid = c.post("/v1/sessions", json={}, headers=bearer(secret)).json()["id"]
    assert c.delete(f"/v1/keys/{made['key_id']}", headers=bearer(w.b_keys["admin"])).status_code == 200
    bogus = "kx_" + made["key_id"] + "_" + "A" * 40
    for method, path in (("GET", f"/v1/sessions/{sid}"), ("GET", "/v1/keys"), ("POST", "/v1/keys"),
                         ("GET", f"/v1/sessions/{w.a_session}"), ("POST", "/v1/ingest/logs")):
        revoked = c.request(method, path, headers=bearer(secret), json={} if method == "POST" else None)
        stranger = c.request(method, path, headers=bearer(bogus), json={} if method == "POST" else None)
        assert revoked.status_code == stranger.status_code == 401, (method, path)
        assert revoked.json() == stranger.json()


# ---- ingest, health, metrics --------------------------------------------------------------------


def test_ingest_writes_only_into_the_callers_tenant(world: World) -> None:
    w = world
    c, key = w.client, bearer(w.b_keys["ingest"])
    # B overwrites "its" INC-1116 (A has one of that id too), and tries to name a tenant.
    opened = (utcnow() - timedelta(days=1)).isoformat()
    item = {"ref": "INC-1116", "title": "b rewrote this", "product": "checkout", "severity": "critical",
            "opened_at": opened}
    named = c.post("/v1/ingest/incidents", json={"items": [{**item, "tenant_id": w.a}]}, headers=key)
    assert named.status_code == 422, named.text
    written = c.post("/v1/ingest/incidents", json={"items": [item]}, headers=key)
    assert written.status_code == 200, written.text
    a_incident = w.h.k.sources.incidents.select_incidents(w.a, refs=("INC-1116",), limit=1)
    b_incident = w.h.k.sources.incidents.select_incidents(w.b, refs=("INC-1116",), limit=1)
    assert a_incident and a_incident[0].title != "b rewrote this"
    assert b_incident and b_incident[0].title == "b rewrote this"


def test_health_and_metrics_name_no_tenant(world: World) -> None:
    w = world
    secrets = [w.a, w.b, "tenant-a", "tenant-b", w.a_session, w.a_turn, w.a_proposal, w.a_job_done, w.a_key_id]
    for path in ("/healthz", "/readyz", "/metrics"):
        response = w.client.get(path)
        assert response.status_code == 200, (path, response.text)
        for secret in secrets:
            assert secret not in response.text, (path, secret)
    # With a key, the same: these routes are not per tenant.
    assert w.a not in w.client.get("/metrics", headers=bearer(w.b_keys["admin"])).text


# ---- telemetry only tenant A has ----------------------------------------------------------------


def _a_only_telemetry(w: World) -> None:
    """Telemetry only A has (idempotent: ingest upserts or appends, and every check is by absence)."""
    c, key = w.client, bearer(w.a_admin)
    now = utcnow() - timedelta(hours=1)
    at = now.isoformat()
    batches: dict[str, list[dict[str, Any]]] = {
        "incidents": [{"ref": "INC-A-ONLY", "title": "asecretword outage", "product": "asecretproduct",
                       "severity": "critical", "opened_at": at, "findings": "asecretword"}],
        "spans": [{"trace_id": "trace-a-secret", "span_id": "s1", "request_id": "req-a-secret",
                   "service": "asecretproduct", "operation": "GET /a-secret", "start": at, "duration_us": 1000}],
        "logs": [{"product": "asecretproduct", "ts": at, "level": "error", "message": "a secret log line",
                  "trace_id": "trace-a-secret"}],
        "products": [{"product": "asecretproduct", "info": {"owner": "a-secret-owner"}, "updated_at": at}],
        "llm-users": [{"user_id": "user-a-secret", "tier": "premium"}],
        "llm-requests": [{"request_id": "req-a-secret", "user_id": "user-a-secret", "user_tier": "premium",
                          "deployment_id": "dep/a-secret", "model_id": "model-a", "backend_id": "backend-a",
                          "latency_ms": 10, "status": "success", "created_at": at}],
    }
    for kind, items in batches.items():
        written = c.post(f"/v1/ingest/{kind}", json={"items": items}, headers=key)
        assert written.status_code == 200, (kind, written.text)


def test_a_post_mortem_job_cannot_select_another_tenants_incidents(world: World) -> None:
    w = world
    _a_only_telemetry(w)
    key = bearer(w.b_keys["chat"])
    theirs = w.client.post("/v1/postmortems", json={"incident_ids": ["INC-A-ONLY"]}, headers=key)
    nowhere = w.client.post("/v1/postmortems", json={"incident_ids": ["INC-NOWHERE"]}, headers=key)
    assert theirs.status_code == nowhere.status_code == 404
    assert theirs.text.replace("INC-A-ONLY", "X") == nowhere.text.replace("INC-NOWHERE", "X")
    for product in ("asecretproduct", "nowhereproduct"):
        by_filter = w.client.post("/v1/postmortems", json={"filter": {"product": product, "since": "7d"}},
                                  headers=key)
        if by_filter.status_code == 202:
            assert by_filter.json()["items"] == 0, by_filter.text
        else:
            assert by_filter.status_code in (404, 422), by_filter.text
        assert "INC-A-ONLY" not in by_filter.text
    # The control: A's own filter finds it.
    control = w.client.post("/v1/postmortems", json={"filter": {"product": "asecretproduct", "since": "7d"}},
                            headers=bearer(w.a_admin))
    assert control.status_code == 202 and control.json()["items"] == 1, control.text
    assert w.client.post(f"/v1/postmortems/{control.json()['job_id']}/cancel",
                         headers=bearer(w.a_admin)).status_code == 200
    w.sent.clear()


def test_tools_in_another_tenants_turn_see_only_its_own_telemetry(world: World) -> None:
    """Over HTTP: B's turn calls the read-only tools with A's ids (trace, request, product,
    incident words, user): each answer is the answer for an id that exists nowhere."""
    w = world
    _a_only_telemetry(w)
    pairs = {"trace": ("trace-a-secret", "trace-nowhere"), "corr": ("req-a-secret", "req-nowhere"),
             "request": ("req-a-secret", "req-nowhere"), "admin": ("asecretproduct", "nowhereproduct"),
             "incidents": ("asecretword", "nowhereword"), "user": ("user-a-secret", "user-nowhere")}
    own, _ = _probe(w, w.a_admin)  # the control: A's own turn finds each of A's ids
    for probe, (theirs, nowhere) in pairs.items():
        found = json.dumps(own[f"{probe}_theirs"]["result"]).replace(theirs, "X")
        assert found != json.dumps(own[f"{probe}_nowhere"]["result"]).replace(nowhere, "X"), (probe, found)
    assert "asecretproduct" in json.dumps(own["products"]["result"])
    results, messages = _probe(w, w.b_keys["chat"])
    for probe, (theirs, nowhere) in pairs.items():
        got, missing = results[f"{probe}_theirs"], results[f"{probe}_nowhere"]
        assert (got["is_error"], got["error_code"]) == (missing["is_error"], missing["error_code"]), (probe, got)
        assert json.dumps(got["result"]).replace(theirs, "X") == json.dumps(missing["result"]).replace(nowhere, "X"), \
            (probe, got["result"], missing["result"])
    seen = json.dumps(results["products"]["result"])
    assert "asecretproduct" not in seen and "a-secret" not in seen
    everything = json.dumps(messages)
    for secret in ("a secret log line", "a-secret-owner", "dep/a-secret", "GET /a-secret", "INC-A-ONLY"):
        assert secret not in everything, secret


def _probe(w: World, secret: str) -> tuple[dict[str, Any], list[Any]]:
    """Run the probe script as a turn of ``secret``'s tenant: its tool results by call id, and
    every message of the session."""
    c, key = w.client, bearer(secret)
    sid = c.post("/v1/sessions", json={"model": "scripted:audit_probe"}, headers=key).json()["id"]
    posted = c.post(f"/v1/sessions/{sid}/messages", json={"content": "probe"}, headers=key)
    assert posted.status_code == 202, posted.text
    w.run()
    assert c.get(f"/v1/turns/{posted.json()['turn_id']}", headers=key).json()["status"] == "done"
    messages = c.get(f"/v1/sessions/{sid}/messages", headers=key).json()["messages"]
    results = {m["tool_call_id"]: m for m in messages if m["role"] == "tool"}
    assert set(results) == set(PROBES), sorted(results)
    return results, messages
