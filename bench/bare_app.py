"""The bare baseline: a Celery task that writes N chunks to a Redis Stream and nothing else.

Same broker, serializer, acknowledgement and prefetch settings as Kortex's own app, so the
difference measured is what Kortex adds: the database, the tool pipeline, the extra hops.
"""

from __future__ import annotations

import json
import os

import redis
from celery import Celery
from kombu import Queue

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("BENCH_PREFIX", "kxbench")

app = Celery("bare", broker=BROKER)
app.conf.update(
    task_serializer="json", accept_content=["json"], result_backend=None, task_ignore_result=True,
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
    task_queues=[Queue("bare")], task_default_queue="bare", worker_hijack_root_logger=False,
    broker_transport_options={"global_keyprefix": f"{PREFIX}:celery:", "visibility_timeout": 3600},
)
_client: redis.Redis | None = None
_pid: int | None = None


def client() -> redis.Redis:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(BROKER, decode_responses=True)
        _pid = os.getpid()
    return _client


@app.task(name="bench.bare.write", ignore_result=True)
def write(*, key: str, chunks: int, counter: str) -> None:
    r = client()
    body = json.dumps({"type": "text", "step": 0, "delta": "x" * 40})
    for _ in range(chunks):
        r.xadd(key, {"t": "text", "d": body}, maxlen=20_000, approximate=True)
    r.expire(key, 600)
    r.incr(counter)
