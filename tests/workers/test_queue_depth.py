"""The watchdog's reads of the queues' depths (workers/dispatch.py CeleryQueue.backlog) against a
private Redis that is up, paused (SIGSTOP: connections open, nothing answers) and gone: each read
gives up within about a second, so a sweep still gets to its database work (deadlines, leases)
instead of waiting on the broker's retries for seconds per queue."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from kortex.config import Settings
from tests.integration.redisproc import RedisServer
from workers.app import make_celery
from workers.dispatch import CeleryQueue


def _timed_failure(queue: CeleryQueue) -> float:
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - kombu's and redis-py's connection errors alike
        queue.backlog("steps")
    return time.monotonic() - started


def test_a_queue_depth_read_gives_up_at_once_when_the_broker_is_paused_or_down(redis_server: RedisServer,
                                                                              tmp_path: Path) -> None:
    settings = Settings(redis_url=redis_server.url, database_url=f"sqlite:///{tmp_path / 'k.db'}",
                        redis_prefix="depth-test")
    queue = CeleryQueue(make_celery(settings))
    assert [queue.backlog(w) for w in ("steps", "tools", "batch")] == [0, 0, 0]

    assert redis_server.proc is not None
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        paused = _timed_failure(queue)
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert queue.backlog("steps") == 0  # back: the next sweep reads it again

    redis_server.kill()
    down = _timed_failure(queue)
    # One connect or command timeout each (1 s), no retries: the connection's own retries took
    # about 6 s a queue while down, and a paused broker was waited on for as long as it paused.
    assert paused < 2.5 and down < 2.5, (paused, down)
