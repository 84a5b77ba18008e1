"""The retention policy's runs in ``kortex beat`` and the embedded mode: only the watchdog's
leader prunes, after its sweep, at most once per ``retention.every`` (a fake clock drives it),
with one INFO line per run that deleted something; a failing run stops neither the sweeps nor
the heartbeat."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from kortex.storage import retention
from kortex.storage.schema import telemetry_logs
from kortex.timeparse import utcnow
from kortex.turns import watchdog
from kortex.turns.handoff import Handoff
from kortex.turns.ports import Work
from tests.conftest import Harness
from tests.workers.test_watchdog_outage import Clock


class Queue:
    def dispatch(self, handoff: Handoff) -> None:
        pass

    def backlog(self, work: Work) -> int | None:
        return 0


class Leader:
    """Answers from a script, one interval each; each interval comes ``step`` seconds after the
    last and finds one more log line past its retention."""

    def __init__(self, script: list[bool], clock: Clock, step: float, stop: threading.Event,
                 before: Callable[[], None]) -> None:
        self.script, self.clock, self.step, self.stop, self.before = list(script), clock, step, stop, before

    def ensure(self) -> bool:
        if not self.script:
            self.stop.set()
            return False
        self.clock.now += self.step
        self.before()
        return self.script.pop(0)

    def release(self) -> None:
        pass


def old_log(h: Harness, tenant_id: str) -> None:
    with h.k.db.begin() as conn:
        conn.execute(insert(telemetry_logs).values(tenant_id=tenant_id, product="p", ts=utcnow() - timedelta(days=31),
                                                   severity=40, level="error", message="old"))


def logs(h: Harness) -> int:
    with h.k.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(telemetry_logs)).scalar() or 0)


def test_only_the_leader_prunes_and_at_most_once_per_every(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=watchdog.__name__)
    tenant = harness.tenant("acme")
    clock, stop = Clock(), threading.Event()
    runs: list[float] = []
    real = retention.prune

    def spy(*args: Any, **kwargs: Any) -> retention.PruneReport:
        runs.append(clock.now)
        return real(*args, **kwargs)

    monkeypatch.setattr(retention, "prune", spy)
    every = harness.settings.retention.every
    assert every == 3600  # the default: an interval every half hour below
    beats: list[None] = []
    leader = Leader([False, True, True, True, True, False, True], clock, every / 2, stop,
                    lambda: old_log(harness, tenant))
    watchdog.run_watchdog(harness.k, Queue(), leader, every=0, stop=stop, alive=lambda: beats.append(None),
                          pruning=watchdog.Pruning(clock))

    # a standby at 2800; leads from 4600 (a run), 6400 (half an hour on), 8200 (a run), 10000;
    # a standby at 11800 though a run is due; leads again at 13600 (a run)
    assert runs == [4600.0, 8200.0, 13600.0]
    assert logs(harness) == 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retention:")]
    assert lines == [f"retention: deleted rows past their retention: {n} telemetry_logs" for n in (2, 2, 3)]
    assert len(beats) == 8  # every interval that reached the database, the last (a standby) too


def test_a_run_that_deletes_nothing_says_nothing_and_one_that_fails_stops_nothing(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=watchdog.__name__)
    clock, stop = Clock(), threading.Event()
    sweeps: list[float] = []
    real_sweep = watchdog.sweep

    def counted(*args: Any, **kwargs: Any) -> watchdog.SweepReport:
        sweeps.append(clock.now)
        return real_sweep(*args, **kwargs)

    monkeypatch.setattr(watchdog, "sweep", counted)
    leader = Leader([True], clock, 1, stop, lambda: None)
    watchdog.run_watchdog(harness.k, Queue(), leader, every=0, stop=stop, pruning=watchdog.Pruning(clock))
    assert not [r for r in caplog.records if r.getMessage().startswith("retention:")]

    def broken(*args: Any, **kwargs: Any) -> retention.PruneReport:
        raise RuntimeError("a bug")

    monkeypatch.setattr(retention, "prune", broken)
    stop.clear()
    beats: list[None] = []
    leader = Leader([True, True], clock, harness.settings.retention.every, stop, lambda: None)
    watchdog.run_watchdog(harness.k, Queue(), leader, every=0, stop=stop, alive=lambda: beats.append(None),
                          pruning=watchdog.Pruning(clock))
    assert len(sweeps) == 3 and len(beats) == 3
    failed = [r for r in caplog.records if r.getMessage() == "watchdog could not delete rows past their retention"]
    assert len(failed) == 2 and all(r.exc_info is not None for r in failed)


def test_the_embedded_mode_prunes_on_its_watchdog_timer(harness: Harness) -> None:
    from workers import runtime
    from workers.app import make_celery
    from workers.embedded import EmbeddedWorker

    old_log(harness, harness.tenant("acme"))
    worker = EmbeddedWorker(make_celery(harness.settings), settings=harness.settings, watchdog_every=0.01)
    timer = threading.Thread(target=worker._watchdog_loop, daemon=True)  # its timer thread, without the Celery worker
    timer.start()
    try:
        deadline = time.monotonic() + 30
        while logs(harness) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert logs(harness) == 0
        old_log(harness, harness.tenant("acme"))
        time.sleep(0.2)  # twenty more ticks: the next run is an hour away
        assert logs(harness) == 1
    finally:
        worker._stop.set()
        timer.join(10)
        runtime.close()
