"""The watchdog in its own process (``kortex beat``): it fails expired turns with no turns worker
running at all, two of them never sweep twice, and a survivor takes over from a killed leader.
The sweep re-enqueues lost hand-offs once and never duplicates work that waits in the queue."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from kortex.storage.schema import turns
from kortex.timeparse import utcnow
from kortex.turns import chat
from kortex.turns.watchdog import sweep
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL, Service, service_env
from tests.integration.redisproc import kortex_command, private_database
from workers.app import make_celery
from workers.dispatch import CeleryQueue, dispatch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """Not the session's database: its watchdog would sweep this module's turns too."""
    with private_database(PG_ADMIN) as url:
        yield url


@pytest.fixture
def prefix() -> Iterator[str]:
    import redis

    name = f"kxwd-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def h(pg_url: str, prefix: str, tmp_path: Path) -> Iterator[Harness]:
    # Turns created here are due one second after they are posted.
    harness = Harness(make_settings(tmp_path, pg_url, redis_url=REDIS_URL, redis_prefix=prefix,
                                    turn={"deadline": 1.0, "requeue_after": 1.0, "text_flush_ms": 0}))
    yield harness
    harness.close()


def _post(h: Harness, n: int = 1) -> list[str]:
    tenant_id = h.tenant("watchdog")
    ids = []
    for i in range(n):
        session = chat.create_session(h.k, tenant_id, f"wd {i}", "scripted:two_tools")
        ids.append(chat.post_message(h.k, tenant_id, session.id, "never picked up").turn.id)
    return ids  # committed, not enqueued: no turns worker would run them anyway


def _status(h: Harness, turn_id: str) -> str:
    with h.k.db.connect() as conn:
        return str(conn.scalar(select(turns.c.status).where(turns.c.id == turn_id)))


def _wait(predicate, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _beat(pg_url: str, prefix: str, log: Path) -> Service:
    return Service("watchdog", kortex_command("beat"), service_env(pg_url, prefix), log)


def _client_saw_failure(h: Harness, turn_id: str) -> None:
    events = h.events(turn_id)
    assert [e.type for e in events] == ["error", "done"], [e.type for e in events]
    assert json.loads(events[0].data)["code"] == "deadline_exceeded"
    done = json.loads(events[1].data)
    assert done["status"] == "failed" and done["error"] == "deadline_exceeded"


def test_with_no_turns_worker_an_expired_turn_is_failed_and_the_client_told(pg_url, prefix, h, tmp_path) -> None:
    beat = _beat(pg_url, prefix, tmp_path / "beat.log")
    try:
        beat.wait_for(lambda: "took the lead" in beat.output())
        (turn_id,) = _post(h)
        _wait(lambda: _status(h, turn_id) == "failed", "the watchdog to fail the turn")
        _wait(lambda: len(h.events(turn_id)) >= 2, "the events")
        _client_saw_failure(h, turn_id)
        assert "Scheduler: Sending due task" not in beat.output()  # no Celery beat, no task per sweep
    finally:
        beat.stop()


def test_two_beats_sweep_once_and_a_survivor_takes_over_from_a_killed_leader(pg_url, prefix, h, tmp_path) -> None:
    beats = [_beat(pg_url, prefix, tmp_path / f"beat-{i}.log") for i in range(2)]
    try:
        _wait(lambda: sum("took the lead" in b.output() for b in beats) == 1, "one leader")
        leader = next(b for b in beats if "took the lead" in b.output())
        other = next(b for b in beats if b is not leader)
        first = _post(h, 5)
        _wait(lambda: all(_status(h, t) == "failed" for t in first), "the first turns to fail")
        time.sleep(2.5)  # more sweeps by either process would add events now
        for turn_id in first:
            _client_saw_failure(h, turn_id)
        assert "took the lead" not in other.output()

        os.killpg(leader.proc.pid, signal.SIGKILL)  # its session ends, and the lock with it
        leader.proc.wait(10)
        other.wait_for(lambda: "took the lead" in other.output())
        (late,) = _post(h)
        _wait(lambda: _status(h, late) == "failed", "the survivor to fail the late turn")
        _wait(lambda: len(h.events(late)) >= 2, "the events")
        _client_saw_failure(h, late)
    finally:
        for b in beats:
            b.stop()


def _age(h: Harness, ids: list[str], seconds: float = 60) -> None:
    with h.k.db.begin() as conn:
        conn.execute(update(turns).where(turns.c.id.in_(ids)).values(updated_at=utcnow() - timedelta(seconds=seconds),
                                                                     deadline_at=utcnow() + timedelta(hours=1)))


def _sweep(h: Harness, queue: CeleryQueue) -> int:
    report = sweep(h.k, queue)
    queue.dispatch(report.handoff)  # as the watchdog process does
    return report.requeued_steps


def test_a_backlog_of_waiting_turns_is_not_re_enqueued(h) -> None:
    app = make_celery(h.settings)
    queue = CeleryQueue(app)
    tenant_id = h.tenant("backlog")
    handoffs = []
    ids = []
    for i in range(5):
        session = chat.create_session(h.k, tenant_id, f"b {i}", "scripted:two_tools")
        posted = chat.post_message(h.k, tenant_id, session.id, "waiting")
        handoffs.append(posted.handoff)
        ids.append(posted.turn.id)
    for handoff in handoffs:
        dispatch(app, handoff)  # in the queue, and no worker consumes it
    _age(h, ids)  # untouched long past requeue_after: only the queue tells they are waiting
    assert queue.backlog("steps") == 5
    for _ in range(3):
        assert _sweep(h, queue) == 0
    assert queue.backlog("steps") == 5  # no duplicates
    assert all(_status(h, t) == "queued" for t in ids)
    with h.k.db.begin() as conn:  # out of the next test's way: the sweep is system-wide
        conn.execute(update(turns).where(turns.c.id.in_(ids)).values(status="failed"))


def test_a_lost_hand_off_is_re_enqueued_once(h) -> None:
    app = make_celery(h.settings)
    queue = CeleryQueue(app)
    ids = _post(h)  # committed, never enqueued: the message was lost
    _age(h, ids)
    assert queue.backlog("steps") == 0
    assert _sweep(h, queue) == 1
    _age(h, ids)
    assert _sweep(h, queue) == 0  # stale again, but now its message waits in the queue
    assert queue.backlog("steps") == 1
    with app.connection_for_read() as conn:
        message = conn.default_channel.basic_get("turns", no_ack=True)
    assert message.headers["task"] == "kortex.turn.step"
    assert json.loads(message.body)[1] == {"tenant_id": h.tenant("watchdog"), "turn_id": ids[0], "step": 0}
