"""End to end on real PostgreSQL, Redis, a Celery worker and the API under uvicorn."""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from kortex.storage import audit
from kortex.storage.schema import chat_messages, decisions, tool_invocations
from kortex.turns import chat
from kortex.turns.handoff import StepDispatch, ToolDispatch
from tests.conftest import Harness
from tests.integration.sse import read_events
from workers.app import make_celery
from workers.dispatch import send_step, send_tool

pytestmark = pytest.mark.integration


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def tenant(pg: Harness) -> tuple[str, str]:
    tenant_id = pg.tenant("acme")
    pg.seed(tenant_id)
    return tenant_id, pg.api_key(tenant_id)


def start_turn(api_url: str, key: str, content: str, model: str | None = None,
               headers: dict[str, str] | None = None) -> dict[str, Any]:
    sid = httpx.post(f"{api_url}/v1/sessions", json={"model": model} if model else {}, headers=auth(key)).json()["id"]
    response = httpx.post(f"{api_url}/v1/sessions/{sid}/messages", json={"content": content},
                          headers={**auth(key), **(headers or {})})
    assert response.status_code == 202, response.text
    return response.json()


def wait_done(api_url: str, key: str, turn_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        turn = httpx.get(f"{api_url}/v1/turns/{turn_id}", headers=auth(key)).json()
        if turn["status"] in ("done", "failed", "cancelled"):
            return turn
        time.sleep(0.1)
    raise AssertionError(f"turn {turn_id} did not finish")


def invocations(pg: Harness, turn_id: str) -> list[Any]:
    def work() -> list[Any]:
        with pg.k.db.connect() as conn:
            return (conn.execute(select(tool_invocations).where(tool_invocations.c.turn_id == turn_id)
                                       .order_by(tool_invocations.c.idx))).all()
    return work()


def test_full_turn_with_two_parallel_tool_calls_streams_the_exact_sequence(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "why?", model="scripted:two_tools")
    events = read_events(api_url + started["events_url"], key)
    kinds = [e.event for e in events]
    assert kinds == ["turn", "text", "text", "text", "tool_call", "tool_call", "tool_result", "tool_result",
                     "turn", "text", "text", "text", "done"]
    assert [e.data["call_id"] for e in events if e.event == "tool_call"] == ["call_deploys", "call_logs"]
    assert {e.data["call_id"] for e in events if e.event == "tool_result"} == {"call_deploys", "call_logs"}
    assert [e.data["step"] for e in events if e.event == "turn"] == [0, 1]
    assert events[-1].data["status"] == "done"
    ids = [e.id for e in events]
    assert all(ids) and ids == sorted(ids, key=lambda i: tuple(int(p) for p in i.split("-")))
    assert "".join(e.data["delta"] for e in events if e.event == "text") == \
        "Checking deploys and errors.Deploy v2.14.0 exhausted the pool."


def test_tool_calls_run_in_parallel_on_separate_workers(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "wait", model="scripted:parallel_sleep")
    assert wait_done(api_url, key, started["turn_id"])["status"] == "done"
    a, b = invocations(pg, started["turn_id"])
    # the two executions overlap in time: neither waited for the other
    assert a.started_at < b.finished_at and b.started_at < a.finished_at


def test_reconnect_with_last_event_id_gets_exactly_the_rest(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "why?", model="scripted:two_tools")
    url = api_url + started["events_url"]
    head = read_events(url, key, stop_after=5)
    rest = read_events(url, key, last_event_id=head[-1].id)
    full = read_events(url, key)
    assert [e.id for e in head + rest] == [e.id for e in full]
    assert [e.event for e in head + rest] == [e.event for e in full]


def test_a_reconnect_while_the_turn_is_still_running_gets_exactly_the_rest(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "why?", model="scripted:slow_tool")
    url = api_url + started["events_url"]
    head = read_events(url, key, stop_after=3)  # turn, text, tool_call: the tool still sleeps
    assert [e.event for e in head] == ["turn", "text", "tool_call"]
    turn = httpx.get(f"{api_url}/v1/turns/{started['turn_id']}", headers=auth(key)).json()
    assert turn["status"] not in ("done", "failed")
    rest = read_events(url, key, last_event_id=head[-1].id)
    assert [e.event for e in rest] == ["tool_result", "turn", "text", "done"]
    full = read_events(url, key)
    assert [e.id for e in head + rest] == [e.id for e in full]


def test_a_client_arriving_after_done_gets_the_full_replay(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "why?", model="scripted:two_tools")
    wait_done(api_url, key, started["turn_id"])
    url = api_url + started["events_url"]
    live = read_events(url, key)
    assert [e.event for e in live][-1] == "done" and len(live) == 13
    # Once the Redis stream has expired the turn is rebuilt from PostgreSQL.
    pg.k.events.delete(started["turn_id"])
    replay = read_events(url, key)
    assert [e.event for e in replay] == ["turn", "text", "tool_call", "tool_call", "tool_result", "tool_result",
                                         "turn", "text", "done"]
    assert "".join(e.data["delta"] for e in replay if e.event == "text") == \
        "".join(e.data["delta"] for e in live if e.event == "text")
    assert {e.data["call_id"]: e.data["content"] for e in replay if e.event == "tool_result"} == \
        {e.data["call_id"]: e.data["content"] for e in live if e.event == "tool_result"}
    resumed = read_events(url, key, last_event_id=replay[3].id)
    assert [e.id for e in resumed] == [e.id for e in replay[4:]]
    # A client that had read the live stream to its done has everything: 204, no replay.
    headers = {**auth(key), "Last-Event-ID": live[-1].id}
    assert httpx.get(url, headers=headers).status_code == 204
    # One that stopped part-way cannot be placed in the rebuilt stream: it gets it all again.
    again = read_events(url, key, last_event_id=live[4].id)
    assert [e.id for e in again] == [e.id for e in replay]


def test_duplicate_deliveries_produce_one_message_and_one_run_per_call(api_url, pg, tenant) -> None:
    tenant_id, key = tenant

    def create() -> tuple[str, str]:
        session = chat.create_session(pg.k, tenant_id, "dup", "scripted:two_tools")
        posted = chat.post_message(pg.k, tenant_id, session.id, "twice")
        return session.id, posted.turn.id

    session_id, turn_id = create()
    celery = make_celery(pg.settings)
    for _ in range(3):  # the same step message, delivered three times
        send_step(celery, StepDispatch(tenant_id, turn_id, 0))
    assert wait_done(api_url, key, turn_id)["status"] == "done"
    for inv in invocations(pg, turn_id):  # late duplicates of every tool task and step
        send_tool(celery, ToolDispatch(tenant_id, inv.id, inv.name, 5, 10))
    send_step(celery, StepDispatch(tenant_id, turn_id, 1))
    time.sleep(1.5)
    rows = invocations(pg, turn_id)
    assert len(rows) == 2 and [r.attempts for r in rows] == [1, 1]

    def check() -> tuple[list[Any], list[dict]]:
        with pg.k.db.connect() as conn:
            messages = (conn.execute(select(chat_messages.c.role).where(chat_messages.c.turn_id == turn_id)
                                           .order_by(chat_messages.c.step, chat_messages.c.ord))).all()
            return messages, audit.list_for_turn(conn, tenant_id, turn_id)

    messages, audit_rows = check()
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert sorted(r["kind"] for r in audit_rows) == ["llm_call", "llm_call", "tool_call", "tool_call"]
    events = read_events(f"{api_url}/v1/turns/{turn_id}/events", key)
    assert [e.event for e in events].count("tool_result") == 2 and [e.event for e in events].count("done") == 1


def test_a_tool_hanging_past_its_limit_is_an_error_and_the_turn_finishes(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "hang", model="scripted:hang")
    events = read_events(api_url + started["events_url"], key, timeout=30)
    result = next(e for e in events if e.event == "tool_result")
    assert result.data["is_error"] and result.data["error_code"] == "timeout"
    assert result.data["content"]["error"] == "tool_timeout"
    assert events[-1].event == "done" and events[-1].data["status"] == "done"


def test_a_tool_whose_worker_dies_is_settled_by_the_watchdog(api_url, pg, tenant, worker) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "crash", model="scripted:crash")
    events = read_events(api_url + started["events_url"], key, timeout=40)
    result = next(e for e in events if e.event == "tool_result")
    assert result.data["is_error"] and result.data["error_code"] == "timeout"
    assert "hard time limit (its worker stopped, or it hung)" in result.data["content"]["message"]
    assert events[-1].data["status"] == "done"
    assert "Recovered after the watchdog." in "".join(e.data.get("delta", "") for e in events)
    assert "exited with 'exitcode 70'" in worker.output()  # the worker really lost a process


def test_invalid_arguments_and_unknown_tools_are_fed_back_as_errors(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "bad", model="scripted:bad_calls")
    events = read_events(api_url + started["events_url"], key)
    codes = {e.data["call_id"]: e.data["error_code"] for e in events if e.event == "tool_result"}
    assert codes == {"call_badargs": "validation", "call_unknown": "policy_denied", "call_badjson": "invalid_json"}
    assert events[-1].data["status"] == "done"
    session = httpx.get(f"{api_url}/v1/turns/{started['turn_id']}", headers=auth(key)).json()["session_id"]
    msgs = httpx.get(f"{api_url}/v1/sessions/{session}/messages", headers=auth(key)).json()["messages"]
    assert [m["error_code"] for m in msgs if m["role"] == "tool"] == ["validation", "policy_denied", "invalid_json"]


def test_retried_posts_with_one_idempotency_key_create_one_turn(api_url, pg, tenant) -> None:
    _, key = tenant
    sid = httpx.post(f"{api_url}/v1/sessions", json={"model": "scripted:text_only"}, headers=auth(key)).json()["id"]
    headers = {**auth(key), "Idempotency-Key": "same-request-1"}

    def post() -> httpx.Response:
        return httpx.post(f"{api_url}/v1/sessions/{sid}/messages", json={"content": "hello"}, headers=headers)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: post(), range(8)))
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["turn_id"] for r in responses}) == 1
    wait_done(api_url, key, responses[0].json()["turn_id"])
    assert post().json()["turn_id"] == responses[0].json()["turn_id"]
    msgs = httpx.get(f"{api_url}/v1/sessions/{sid}/messages", headers=auth(key)).json()["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"]


def test_tenant_b_cannot_read_tenant_a(api_url, pg, tenant) -> None:
    _, key_a = tenant
    key_b = pg.api_key(pg.tenant("tenant-b"))
    started = start_turn(api_url, key_a, "mine", model="scripted:text_only")
    turn = wait_done(api_url, key_a, started["turn_id"])
    for path in (f"/v1/sessions/{turn['session_id']}", f"/v1/sessions/{turn['session_id']}/messages",
                 f"/v1/turns/{turn['id']}", started["events_url"]):
        response = httpx.get(api_url + path, headers=auth(key_b))
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    foreign = httpx.post(f"{api_url}/v1/sessions/{turn['session_id']}/messages", json={"content": "x"},
                         headers=auth(key_b))
    assert foreign.status_code == 404


def test_idle_streams_get_heartbeat_comments(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "slow", model="scripted:slow_tool")
    comments: list[str] = []
    events = read_events(api_url + started["events_url"], key, comments=comments)
    assert events[-1].event == "done"
    assert ": keepalive" in comments


def test_offline_analyst_answers_through_the_distributed_stack(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "Why is checkout slow?")
    events = read_events(api_url + started["events_url"], key)
    text = "".join(e.data.get("delta", "") for e in events if e.event == "text")
    assert "v2.14.0" in text and "connection pool" in text and "Offline analyst" in text
    # the tools this stack allows: deploys, one metric, the logs, and the logs again for changes
    assert [e.event for e in events].count("tool_result") == 4


def test_readiness_reports_both_backends(api_url) -> None:
    body = httpx.get(f"{api_url}/readyz").json()
    assert body == {"status": "ready", "checks": {"database": "ok", "schema": "ok", "redis": "ok"}}


def test_the_watchdog_keeps_its_health_file_fresh(worker) -> None:
    alive = worker.alive_file
    deadline = time.monotonic() + 10
    while not alive.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    first = alive.stat().st_mtime
    while alive.stat().st_mtime == first and time.monotonic() < deadline:  # the sweep runs every second here
        time.sleep(0.1)
    assert alive.stat().st_mtime > first


def test_worker_registered_explicit_task_names(worker) -> None:
    out = worker.output()
    for name in ("kortex.turn.step", "kortex.tool.run", "kortex.turn.watchdog"):
        assert name in out
    assert json  # the log is plain text; names appear in the worker's task list


def test_many_open_streams_share_one_redis_reader(api_url, pg, tenant, redis_prefix) -> None:
    _, key = tenant
    turns = [start_turn(api_url, key, f"slow {i}", model="scripted:slow_tool") for i in range(4)]
    urls = [api_url + t["events_url"] for t in turns for _ in range(5)]  # 20 readers, 4 streams
    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        futures = [pool.submit(read_events, url, key) for url in urls]
        time.sleep(1.0)  # every reader is connected and waiting on the slow tool
        clients = pg.k.redis.client_list()
        hub = [c for c in clients if c.get("name") == f"{redis_prefix}:hub"]
        results = [f.result() for f in futures]
    # For all 20 streams: a blocking reader per shard (2 by default), the fresh-stream reader
    # (turns that have not answered yet), the control connection (commands) and the one its
    # pipelined catch-up reads of joining readers draw from its pool: a few, not one per stream.
    assert 3 <= len(hub) <= 5
    assert all(r[-1].event == "done" for r in results)
    assert len({tuple(e.id for e in r) for r in results}) == 4  # each stream's readers saw the same entries


def test_a_stream_idle_longer_than_a_socket_timeout_stays_live(api_url, api_service, pg, tenant) -> None:
    tenant_id, key = tenant
    session = chat.create_session(pg.k, tenant_id, "idle", "scripted:two_tools")
    posted = chat.post_message(pg.k, tenant_id, session.id, "queued, not yet enqueued")
    url = f"{api_url}/v1/turns/{posted.turn.id}/events"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reader = pool.submit(read_events, url, key)
        time.sleep(6.5)  # longer than redis-py's default 5 s socket timeout, while the hub blocks
        send_step(make_celery(pg.settings), StepDispatch(tenant_id, posted.turn.id, 0))
        events = reader.result(timeout=30)
    assert events[-1].event == "done" and len(events) == 13
    assert "stream hub read failed" not in api_service.output()


def test_cancel_stops_a_streaming_turn_on_a_real_worker_and_the_client_hears_it_once(api_url, pg, tenant) -> None:
    _, key = tenant
    started = start_turn(api_url, key, "slowly", model="scripted:long_text")  # twenty pieces, 200 ms apart
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        live = pool.submit(read_events, api_url + started["events_url"], key)  # a client following live
        deadline = time.monotonic() + 15
        while httpx.get(f"{api_url}/v1/turns/{started['turn_id']}", headers=auth(key)).json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # a piece or two streamed
        cancelled = httpx.post(f"{api_url}/v1/turns/{started['turn_id']}/cancel", headers=auth(key))
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        seen = live.result(timeout=20)
    kinds = [e.event for e in seen]
    assert kinds[0] == "turn" and kinds[-1] == "done" and kinds.count("done") == 1
    assert seen[-1].data["status"] == "cancelled" and seen[-1].data["error"] == "cancelled"
    text = "".join(e.data["delta"] for e in seen if e.event == "text")
    assert "tok20" not in text  # the step stopped streaming (it had 4 s to go)
    time.sleep(1.0)  # whatever the stopped step did next, nothing was added after done
    again = read_events(api_url + started["events_url"], key)
    assert [(e.event, e.data) for e in again] == [(e.event, e.data) for e in seen]
    turn = wait_done(api_url, key, started["turn_id"])
    assert turn["status"] == "cancelled" and turn["error"]["code"] == "cancelled"
    deadline = time.monotonic() + 10  # the stopped step audits its call as it winds down
    rows: list[Any] = []
    while time.monotonic() < deadline:
        with pg.k.db.connect() as conn:
            rows = conn.execute(select(decisions.c.kind, decisions.c.ok).where(
                decisions.c.turn_id == started["turn_id"])).all()
        if len(rows) == 2:
            break
        time.sleep(0.1)
    assert sorted((r.kind, r.ok) for r in rows) == [("llm_call", False), ("turn_cancelled", True)]
