"""The embedded mode's worker: the real Celery worker, consuming both queues from the in-process
``memory://`` broker on a thread pool inside the current process, plus the watchdog sweep (and the
retention policy's run, at most once per ``retention.every``) on a timer thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery
from celery.worker import WorkController
from celery.worker import state as worker_state

from kortex.config import Settings
from kortex.turns.watchdog import Pruning, sweep
from workers import runtime
from workers.dispatch import CeleryQueue
from workers.queues import Queue, TaskName

log = logging.getLogger(__name__)


class _Controller(WorkController):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: Any) -> None:
        self.ready.set()


class EmbeddedWorker:
    """Start with ``start()``; ``stop()`` drains and joins. Not for production use."""

    def __init__(self, app: Celery, *, settings: Settings | None = None, concurrency: int = 4,
                 watchdog_every: float | None = None) -> None:
        if settings is not None:
            app.conf.kortex_settings = settings  # the tasks read it at call time
        self.app = app
        self.concurrency = concurrency
        self.watchdog_every = watchdog_every or app.conf.kortex_settings.turn.watchdog_every
        self._controller: _Controller | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.app.finalize()
        self.app.set_current()
        self._controller = _Controller(
            app=self.app, concurrency=self.concurrency, pool="threads", hostname="kortex-embedded@localhost",
            queues=[q.value for q in Queue], loglevel="WARNING", without_heartbeat=True, without_mingle=True,
            # Acked tasks (tools, batch items, batch steps) count against the prefetch window, and
            # once it is full the in-memory consumer looks again only at its next poll (~2 s): a
            # batch of post-mortems advanced in 2 s beats. Its tasks are short, and a process that
            # dies loses the in-memory queue anyway, so a wide window costs nothing here.
            prefetch_multiplier=16,
            without_gossip=True, ready_callback=None,
        )
        self._thread = threading.Thread(target=self._controller.start, name="kortex-embedded-worker", daemon=True)
        self._thread.start()
        if not self._controller.ready.wait(timeout):
            raise RuntimeError("the embedded worker did not start")
        self._timer = threading.Thread(target=self._watchdog_loop, name="kortex-embedded-beat", daemon=True)
        self._timer.start()

    def _watchdog_loop(self) -> None:
        # The sweep runs on this timer thread, not as a task: busy task threads cannot delay it.
        queue = CeleryQueue(self.app)
        pruning = Pruning()
        while not self._stop.wait(self.watchdog_every):
            try:
                report = runtime.run(self.app.conf.kortex_settings, lambda k: sweep(k, queue))
                queue.dispatch(report.handoff)
            except Exception:  # the next tick tries again
                log.warning("embedded watchdog sweep failed", exc_info=True)
            try:  # the embedded mode's one process is its own watchdog's leader
                runtime.run(self.app.conf.kortex_settings, pruning.run)
            except Exception:  # the next due run tries again
                log.warning("embedded retention run failed", exc_info=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Warm shutdown: running tasks finish. The consumer loop only looks at the shutdown
        flag between polls of up to 2 s, so a message is sent to wake it at once."""
        self._stop.set()
        if self._controller is not None and self._thread is not None:
            worker_state.should_terminate = 0
            try:
                self.app.send_task(TaskName.WATCHDOG.value, queue=Queue.TURNS.value)  # idempotent, cheap
            except Exception:  # then the poll times out on its own
                log.debug("could not wake the embedded worker", exc_info=True)
            self._thread.join(timeout)
            worker_state.should_terminate = None
        self._controller = None
        runtime.close()  # the tasks' container ran in this process: no process exit will close it
