"""The Celery application: broker, queues, routing, reliability and monitoring settings.

``celery -A workers.app worker`` (or ``kortex worker``) runs it. Settings come from
``kortex.toml`` and ``KORTEX_*`` like everything else; with no Redis configured the broker is
in-process (``memory://``) for the embedded mode.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue as KombuQueue

from kortex.config import Settings, load_settings
from workers.queues import Queue, TaskName


def make_celery(settings: Settings) -> Celery:
    app = Celery("kortex", broker=settings.effective_broker_url, include=["workers.tasks"])
    broker = settings.effective_broker_url
    transport: dict[str, object] = {}
    if broker.startswith(("redis://", "rediss://", "unix://")):
        # Namespaces every broker key, so several deployments (or test runs) can share a Redis.
        # The visibility timeout must outlast the longest task, or Redis redelivers it mid-run.
        transport = {"global_keyprefix": f"{settings.redis_prefix}:celery:", "visibility_timeout": 3600}
    elif broker.startswith("memory://"):
        transport = {"polling_interval": 0.005}
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,               # a task lost with its worker is redelivered ...
        task_reject_on_worker_lost=True,   # ... and every task is safe to run twice
        # One message per process at a time: a step may stream an LLM answer for minutes, and
        # messages prefetched behind it would wait while other processes sit idle.
        worker_prefetch_multiplier=1,
        task_default_queue=Queue.TURNS.value,
        task_queues=[KombuQueue(q.value, routing_key=q.value) for q in Queue],
        task_routes={
            TaskName.STEP.value: {"queue": Queue.TURNS.value},
            TaskName.WATCHDOG.value: {"queue": Queue.TURNS.value},
            TaskName.TOOL.value: {"queue": Queue.TOOLS.value},
        },
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        # Task events cost three Redis publishes per task; Flower switches them on for as long
        # as it watches (its enable_events default), so they are off otherwise.
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_hijack_root_logger=False,
        beat_schedule={
            "watchdog": {
                "task": TaskName.WATCHDOG.value,
                "schedule": settings.turn.watchdog_every,
                # It shares the turns queue with long steps: let it wait a few intervals before
                # it expires (a later sweep does the same work, so stale ones are dropped).
                "options": {"queue": Queue.TURNS.value, "expires": max(60.0, 3 * settings.turn.watchdog_every)},
            },
        },
    )
    app.conf.kortex_settings = settings
    return app


app = make_celery(load_settings())
