"""Admission on PostgreSQL: bad input is a 422 before it reaches SQL, and the per-tenant cap on
concurrent turns holds under concurrent posts from many sessions of one tenant."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from kortex.errors import RateLimited
from kortex.storage.schema import turns as turns_table
from kortex.turns import chat
from kortex.turns.cancel import cancel
from tests.api.test_admission import check_more_bad_input, check_nul_and_range
from tests.conftest import Harness

pytestmark = pytest.mark.integration


def test_nul_bytes_and_out_of_range_numbers_are_422_on_postgresql(pg: Harness) -> None:
    with TestClient(create_app(pg.settings, dispatch=lambda handoff: None, embedded_worker=False)) as client:
        check_nul_and_range(client, pg.api_key(pg.tenant("nul-tenant")))
        check_more_bad_input(client, pg, pg.tenant("nul-tenant"))


def test_the_concurrent_turn_cap_holds_under_concurrent_posts(pg: Harness) -> None:
    tenant = pg.tenant("crowded")
    cap = pg.settings.llm.budget.max_concurrent_turns_per_tenant
    sessions = [chat.create_session(pg.k, tenant, f"s{n}").id for n in range(cap * 2 + 10)]
    start = threading.Barrier(len(sessions))
    outcomes: list[Any] = []
    lock = threading.Lock()

    def post(session_id: str) -> None:
        start.wait()
        try:
            result: Any = chat.post_message(pg.k, tenant, session_id, "hello")
        except RateLimited as exc:
            result = exc
        except Exception as exc:  # anything else is a failure of the test, reported below
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=post, args=(sid,)) for sid in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    unexpected = [o for o in outcomes if isinstance(o, Exception) and not isinstance(o, RateLimited)]
    assert not unexpected, unexpected
    admitted = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, RateLimited)]
    assert len(outcomes) == len(sessions)
    with pg.k.db.connect() as conn:
        active = conn.scalar(select(func.count()).select_from(turns_table)
                             .where(turns_table.c.tenant_id == tenant, turns_table.c.status == "queued"))
    try:
        assert len(admitted) == active == cap
        assert {e.details.get("limit") for e in refused} == {"max_concurrent_turns_per_tenant"}
    finally:
        # Never enqueued here, the watchdog would run them later, in the middle of another test
        # (test_metrics counts the turns that finish): they end with this test.
        for posted in admitted:
            cancel(pg.k, tenant, posted.turn.id, by="test")


def test_a_batch_that_can_never_fit_takes_nothing_from_concurrent_ones_that_do(redis_prefix: str) -> None:
    """A refused take is never counted, not even for an instant (one Lua script)."""
    import redis

    from kortex.budget import Quota
    from tests.integration.conftest import REDIS_URL

    client = redis.Redis.from_url(REDIS_URL)
    quota = Quota(client, redis_prefix, "ingest_items", 100, "ingested items")
    stop = threading.Event()
    oversize: list[Any] = []

    def too_big() -> None:
        while not stop.is_set():
            try:
                oversize.append(quota.take("racing", 150))
            except RateLimited as exc:
                oversize.append(exc)

    racers = [threading.Thread(target=too_big) for _ in range(2)]
    for t in racers:
        t.start()
    refused = 0
    try:
        for _ in range(500):
            try:
                quota.give_back("racing", quota.take("racing", 1))
            except RateLimited:
                refused += 1
    finally:
        stop.set()
        for t in racers:
            t.join(10)
        client.close()
    assert oversize and all(isinstance(o, RateLimited) for o in oversize)
    assert refused == 0
