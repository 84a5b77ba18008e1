"""What ``kortex beat``'s watchdog logs while the broker or Redis is down: it retries every
interval, so an expected connection error is one line without a traceback, once a minute per
thing it stops, and one more when that works again; other errors keep their traceback."""

from __future__ import annotations

import logging
import threading

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from kortex.turns import watchdog
from kortex.turns.handoff import Handoff
from kortex.turns.ports import Work
from tests.conftest import Harness


class BrokerError(Exception):
    """As kombu raises it: its own class, raised from redis-py's."""


def broker_down() -> BrokerError:
    try:
        try:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
        except RedisConnectionError as exc:
            raise BrokerError("Error 111 connecting to 127.0.0.1:6390. Connection refused.") from exc
    except BrokerError as exc:
        return exc


class Queue:
    def __init__(self) -> None:
        self.error: Exception | None = broker_down()

    def dispatch(self, handoff: Handoff) -> None:
        pass

    def backlog(self, work: Work) -> int | None:
        if self.error is not None:
            raise self.error
        return 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(watchdog, "_outages", watchdog._Outages(60, clock))
    return clock


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    records = [r for r in caplog.records if r.name == watchdog.__name__]
    caplog.clear()
    return records


def test_a_broker_outage_is_one_line_a_minute_per_queue_and_its_end_is_said(
        harness: Harness, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=watchdog.__name__)
    queue = Queue()
    for _ in range(5):  # five intervals inside a minute
        watchdog.sweep(harness.k, queue)
        clock.now += 10
    first = _lines(caplog)
    assert [r.getMessage() for r in first] == [
        f"watchdog could not read the {work} queue's depth: BrokerError: Error 111 connecting to 127.0.0.1:6390. "
        "Connection refused. (said again every 60s while it lasts)" for work in ("steps", "tools", "batch")]
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in first)

    clock.now += 15  # a minute after the first line
    watchdog.sweep(harness.k, queue)
    again = [r.getMessage() for r in _lines(caplog)]
    assert len(again) == 3 and all(m.startswith("watchdog still could not read the ") for m in again)

    queue.error = None
    watchdog.sweep(harness.k, queue)
    watchdog.sweep(harness.k, queue)
    assert [r.getMessage() for r in _lines(caplog)] == [
        f"watchdog can read the {work} queue's depth again" for work in ("steps", "tools", "batch")]

    queue.error = broker_down()  # a new outage is news at once
    watchdog.sweep(harness.k, queue)
    assert len(_lines(caplog)) == 3


def test_an_unexpected_error_keeps_its_traceback_every_time(
        harness: Harness, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    queue = Queue()
    queue.error = ValueError("a bug")
    watchdog.sweep(harness.k, queue)
    watchdog.sweep(harness.k, queue)
    records = _lines(caplog)
    assert len(records) == 6 and all(r.exc_info is not None for r in records)


class DownLeader:
    """Leadership lives in the database: while it is unreachable, every interval fails."""

    def __init__(self, stop: threading.Event, intervals: int) -> None:
        self.stop, self.left = stop, intervals

    def ensure(self) -> bool:
        self.left -= 1
        if self.left <= 0:
            self.stop.set()
        raise ConnectionRefusedError(111, "Connection refused")

    def release(self) -> None:
        pass


def test_a_failing_interval_is_one_line_while_the_outage_lasts_and_no_heartbeat(
        harness: Harness, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    beats: list[None] = []
    watchdog.run_watchdog(harness.k, Queue(), DownLeader(stop, 20), every=0, stop=stop,
                          alive=lambda: beats.append(None))
    records = _lines(caplog)
    assert [r.getMessage() for r in records] == [
        "watchdog could not check the leadership: ConnectionRefusedError: [Errno 111] Connection refused "
        "(said again every 60s while it lasts)"]
    assert records[0].exc_info is None
    # --alive-file is touched only after an interval that reached the database: a health check
    # must see a watchdog that cannot sweep
    assert beats == []


def test_the_leader_says_it_could_not_ask_rather_than_someone_else_leads() -> None:
    from kortex.storage.db import Database
    from kortex.storage.leader import AdvisoryLeader

    # nothing listens on port 1: the database is unreachable
    db = Database("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    try:
        with pytest.raises(Exception) as raised:
            AdvisoryLeader(db, "kxtest").ensure()
        assert watchdog._connection_error(raised.value)
    finally:
        db.dispose()
