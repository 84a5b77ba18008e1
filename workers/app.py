"""The Celery application: broker, queues, routing, reliability and monitoring settings.

``celery -A workers.app worker`` (or ``kortex worker``) runs it. Settings come from
``kortex.toml`` and ``KORTEX_*`` like everything else; with no Redis configured the broker is
in-process (``memory://``) for the embedded mode.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_process_shutdown
from kombu import Queue as KombuQueue

from kortex import heap, switching
from kortex.config import Settings, load_settings
from workers import pool
from workers.broker import TRANSPORT
from workers.queues import Queue, TaskName

# ``-P threads`` (kortex worker's default pool) names our threads pool, which wakes the
# consumer when a task ends (workers/pool.py).
pool.install()


def make_celery(settings: Settings) -> Celery:
    # events: a task-event dispatcher the threads pool's threads can share (workers/pool.py)
    app = Celery("kortex", broker=settings.effective_broker_url, include=["workers.tasks"],
                 events="workers.pool:Events")
    broker = settings.effective_broker_url
    transport: dict[str, object] = {}
    transport_class: str | None = None
    if broker.startswith(("redis://", "rediss://")):
        transport_class = TRANSPORT  # kombu's, keeping one client per channel (workers/broker.py)
    if broker.startswith(("redis://", "rediss://", "unix://")):
        transport = {
            # Namespaces every broker key, so several deployments (or test runs) share a Redis.
            "global_keyprefix": f"{settings.redis_prefix}:celery:",
            # Redis redelivers a message unacked this long. It must outlast the longest task; a
            # message stranded by a Redis restart (its restore failed while Redis was down) comes
            # back only then, so the watchdog re-enqueues such lost hand-offs long before.
            "visibility_timeout": 3600,
            # A dead connection is noticed (keepalive, a PING before reuse after 10 s idle) and
            # a timed-out command is retried once on a fresh one instead of failing the task.
            "health_check_interval": 10,
            "retry_on_timeout": True,
            "socket_keepalive": True,
            "socket_connect_timeout": 5,
            # Each broker channel has its own pool, used by every thread that acks or publishes;
            # kombu's default (10) ran dry under hundreds of threads ("Couldn't ack ...
            # MaxConnectionsError"). worker_init raises it to the worker's concurrency.
            "max_connections": settings.pools.broker_max_connections,
        }
    elif broker.startswith("memory://"):
        transport = {"polling_interval": 0.005}
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        # The (disabled) backend is shared by all threads: otherwise Celery resolves it once per
        # thread that sends a task, each time scanning every installed package's entry points.
        result_backend_thread_safe=True,
        task_ignore_result=True,
        task_acks_late=True,               # a task lost with its worker is redelivered ...
        task_reject_on_worker_lost=True,   # ... and every task is safe to run twice
        # One message per process at a time: a step may stream an LLM answer for minutes, and
        # messages prefetched behind it would wait while other processes sit idle.
        worker_prefetch_multiplier=1,
        task_default_queue=Queue.TURNS.value,
        # Step messages are taken without an ack: the step task only hands the step to the
        # engine, whose waiting steps are touched and whose running ones hold a lease, so a
        # message lost with its process is recovered by the watchdog like a waiting step, and
        # the broker's unacked bookkeeping (two writes per message, two more to ack) bought
        # nothing but CPU (py-spy: 9% of a busy turns worker). Tool messages keep acks_late.
        task_queues=[KombuQueue(q.value, routing_key=q.value, no_ack=q is Queue.TURNS) for q in Queue],
        task_routes={
            TaskName.STEP.value: {"queue": Queue.TURNS.value},
            TaskName.WATCHDOG.value: {"queue": Queue.TURNS.value},
            TaskName.TOOL.value: {"queue": Queue.TOOLS.value},
            TaskName.POSTMORTEM_ITEM.value: {"queue": Queue.BATCH.value},
        },
        broker_transport_options=transport,
        broker_transport=transport_class,
        # Reconnect forever, at start and after a loss: a Redis restart is a pause, not an exit.
        broker_connection_retry=True,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Producers (the API's enqueue, a task's hand-off) draw from this many broker connections.
        broker_pool_limit=settings.pools.broker_max_connections,
        # On a broker loss, running tasks finish (every task is idempotent, and a tool's result
        # is worth keeping); their messages are restored and a second delivery finds the work done.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # Task events cost three Redis publishes per task; Flower switches them on for as long
        # as it watches (its enable_events default), so they are off otherwise.
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_hijack_root_logger=False,
        # The watchdog is not a beat task: `kortex beat` sweeps in its own process (workers/beat.py),
        # so busy or dead turns workers cannot starve it.
        beat_schedule={},
    )
    app.conf.kortex_settings = settings
    return app


@worker_init.connect
def _size_broker_pool(sender: Any = None, **_: Any) -> None:
    """Every pool thread (or greenlet) may ack at once: the channel's pool must hold them all."""
    concurrency = int(getattr(sender, "concurrency", 0) or 0)
    options = sender.app.conf.broker_transport_options if sender is not None else None
    if options is not None and "max_connections" in options:
        options["max_connections"] = max(int(options["max_connections"]), concurrency + 8)


#: the worker's metrics port (``kortex worker --metrics-port`` sets it; celery's own command can too)
METRICS_PORT_ENV = "KORTEX_METRICS_PORT"


@worker_init.connect
def _serve_metrics(sender: Any = None, **_: Any) -> None:
    """The worker's parent serves Prometheus its children's samples too (multiprocess mode
    under prefork, PROMETHEUS_MULTIPROC_DIR set before anything imported the client)."""
    port = os.environ.get(METRICS_PORT_ENV)
    if port:
        from kortex import metrics

        token = app.conf.kortex_settings.metrics.token
        try:
            metrics.serve(int(port), token=token.get_secret_value() if token is not None else None)
        except OSError as exc:
            # Celery logs a receiver's exception and starts anyway: a worker without the metrics
            # it was asked for would go unnoticed. SystemExit passes Celery's signal dispatch.
            raise SystemExit(f"error: cannot serve metrics on --metrics-port ({METRICS_PORT_ENV}) {port}: "
                             f"{exc.strerror or exc}") from exc


@worker_init.connect
def _settle_heap_before_fork(sender: Any = None, **_: Any) -> None:
    """Before the pool starts: prefork children inherit a frozen heap, which their own
    collections then never walk (nor copy, page by page, out of the parent's memory)."""
    if app.conf.kortex_settings.settle_heap:
        heap.settle()  # kortex/heap.py


@worker_init.connect
def _switch_sooner(sender: Any = None, **_: Any) -> None:
    """Before the pool's threads start (prefork children inherit it): a thread that wakes in
    this worker waits at most ``switch_interval_ms`` for the GIL (kortex/switching.py)."""
    switching.apply(app.conf.kortex_settings.switch_interval_ms)


@worker_process_shutdown.connect
def _forget_child(pid: int | None = None, **_: Any) -> None:
    """A prefork child's live gauges go with it."""
    from kortex import metrics

    metrics.child_exited(pid or os.getpid())


app = make_celery(load_settings())
