"""``kortex beat``: the watchdog's own process. It sweeps in-process, so no worker slot and no
queue it polices stands between it and an expired turn; any number may run, one leads at a
time (a PostgreSQL advisory lock) and another takes over when the leader dies."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from kortex import heap, tracing
from kortex.config import Settings
from kortex.errors import ConfigError
from kortex.storage.leader import AdvisoryLeader
from kortex.turns.watchdog import run_watchdog
from workers import runtime
from workers.app import make_celery
from workers.dispatch import CeleryQueue

log = logging.getLogger(__name__)


def run(settings: Settings, stop: threading.Event | None = None, alive_file: Path | None = None,
        metrics_port: int | None = None) -> None:
    """``alive_file``: touched after every interval that reached the database, for a container
    health check (``kortex beat --alive-file``; its age says whether the watchdog still runs)."""
    stop = stop or threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stop)
    app = make_celery(settings)
    queue = CeleryQueue(app)
    if metrics_port is not None:  # first: a port it cannot serve on stops it before it starts anything
        from kortex import metrics

        try:
            token = settings.metrics.token
            metrics.serve(metrics_port, extra=[metrics.QueueDepth(queue.depths)],
                          token=token.get_secret_value() if token is not None else None)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on --metrics-port {metrics_port}: {exc.strerror or exc}") from exc
    # Before the container, whose setup would name this process "worker" in every span it exports.
    tracing.setup_from(settings, "beat")
    k = runtime.kortex(settings)
    leader = AdvisoryLeader(k.db, settings.redis_prefix)
    if settings.settle_heap:
        heap.settle()  # started (kortex/heap.py)
    log.info("watchdog process started: sweeps every %.1fs while it leads", settings.turn.watchdog_every)
    kept = settings.retention
    if kept.enabled:
        policy = (("telemetry", kept.telemetry_days), ("audit rows", kept.audit_days),
                  ("finished post-mortem jobs", kept.postmortem_days), ("revoked API keys", kept.revoked_keys_days))
        log.info("retention: while it leads, it deletes (at most every %gs) %s", kept.every,
                 ", ".join(f"{what} after {days} days" if days is not None else f"{what} never" for what, days in policy))
    try:
        alive = alive_file.touch if alive_file is not None else None
        run_watchdog(k, queue, leader, every=settings.turn.watchdog_every, stop=stop, alive=alive)
    finally:
        runtime.close()
