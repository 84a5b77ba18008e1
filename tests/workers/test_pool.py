"""The threads pool wakes the consumer when a task ends (workers/pool.py): with the prefetch
window full, the next message is taken when a slot frees, not when the loop's timer next fires."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import celery.concurrency
import pytest
import redis

from tests.integration.conftest import REDIS_URL
from workers import pool

ROOT = Path(__file__).resolve().parents[2]


class _Loop:
    """What the pool needs of kombu's hub: somewhere to register its reader."""

    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}

    def add_reader(self, fd: int, callback: Any, *args: Any) -> None:
        self.readers[fd] = (callback, args)

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_a_task_that_ends_wakes_the_loop_and_the_wake_up_is_drained() -> None:
    tasks = pool.TaskPool(limit=2)
    loop = _Loop()
    tasks.register_with_event_loop(loop)
    (fd, (drain, args)), = loop.readers.items()
    release = threading.Event()
    acked: list[object] = []
    try:
        tasks.apply_async(lambda: (release.wait(5), "ok")[1], callback=acked.append)
        assert not _readable(fd, 0.2)  # still running: nothing to wake for
        release.set()
        assert _readable(fd, 5)
        assert acked == ["ok"]  # the ack (the callback) ran before the wake-up
        drain(*args)
        assert not _readable(fd, 0)

        def boom() -> None:
            raise RuntimeError("tool failed")

        tasks.apply_async(boom, callback=acked.append)
        assert _readable(fd, 5)  # a failed task frees its slot too
    finally:
        release.set()
        tasks.stop()
    assert fd not in loop.readers  # a stopped pool leaves the loop no closed descriptor to poll


def test_threads_names_the_waking_pool_once_the_app_is_loaded() -> None:
    import workers.app  # noqa: F401  (installs it)

    assert celery.concurrency.get_implementation("threads") is pool.TaskPool


def test_a_task_event_sent_while_the_loop_flushes_the_buffer_is_published_not_dropped(tmp_path: Path) -> None:
    """The race behind step tasks RECEIVED for ever in Flower: the loop's flush publishes the
    buffer while a pool thread's task ends and sends its event into it."""
    from tests.conftest import make_settings
    from workers.app import make_celery

    app = make_celery(make_settings(tmp_path, f"sqlite:///{tmp_path / 'kortex.db'}"))  # our app's dispatcher
    published: list[tuple[str, Any]] = []
    senders: list[threading.Thread] = []
    with app.connection_for_write() as conn:
        events = app.events.Dispatcher(conn, hostname="w@h", buffer_group=["task"])

        class Producer:
            def publish(self, body: Any, routing_key: str, **_: Any) -> None:
                published.append((routing_key, list(body)))  # serialized as it is sent
                if len(senders) == 0:  # during the flush's round trip, a task ends on its thread
                    sender = threading.Thread(target=events.send, args=("task-succeeded",), kwargs={"uuid": "s"})
                    senders.append(sender)
                    sender.start()
                    sender.join(0.2)  # it waits for the flush (ours), or is lost in it (Celery's)

        events.producer = Producer()
        events.send("task-received", uuid="s")
        events.flush()
        senders[0].join(5)
        events.flush()
    assert [(key, e["type"]) for key, body in published for e in body] == [
        ("task.multi", "task-received"), ("task.multi", "task-succeeded")]


@pytest.mark.integration
def test_a_worker_with_a_full_window_takes_each_next_message_as_the_last_task_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"kxpool-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(REDIS_URL)
    monkeypatch.setenv("POOL_TEST_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("POOL_TEST_PREFIX", prefix)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "worker.log").open("w+")
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.workers.pool_app", "worker", "-P", "threads",
                               "-c", "1", "-l", "INFO", "--without-mingle", "--without-gossip", "--without-heartbeat",
                               "-n", f"{prefix}@%h"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in (tmp_path / "worker.log").read_text():
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        from tests.workers.pool_app import stamp  # the same broker keys as the worker's (the environment)

        n = 12
        for i in range(n):
            stamp.delay(i)
        deadline = time.monotonic() + 60
        while r.llen(f"{prefix}:stamps") < n and time.monotonic() < deadline:
            time.sleep(0.05)
        started = sorted(float(s.split()[1]) for s in r.lrange(f"{prefix}:stamps", 0, -1))
        assert len(started) == n
        gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
        # One slot, a window of one: each message waits for the previous task's ack. Celery's
        # threads pool left the loop asleep in epoll until its next timer, ~1 s a message.
        assert max(gaps) < 0.5, gaps
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()
        for key in r.scan_iter(f"{prefix}:*"):
            r.delete(key)
